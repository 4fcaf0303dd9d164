"""Named profiles: which plugins and actions a cycle runs, with their weights and parameters.

Plugin modules may add profiles of their own by defining `PROFILES`; `get_profile(name)` finds both.
"""

from __future__ import annotations

from types import MappingProxyType

from scheduling.engine.framework import Profile
from scheduling.engine.plugins import EXTRA_PROFILES, REGISTRY

# Parameters every profile understands (docs/engine.md explains each); a profile overrides what it needs.
DEFAULT_PARAMS = MappingProxyType(
    {
        "timeslice_oversubscription": 4.0,  # time-sliced cards hand out up to 4 cards' worth of compute shares
        "age_boost_interval_s": 3600.0,  # one queue-priority level per hour waited ...
        "age_boost_max": 10,  # ... at most ten levels
        "fairshare_half_life_s": 7 * 24 * 3600.0,
        "reservations_max": 2,  # the first blocked jobs that get a reservation
        "reservation_min_priority": 0,
        "reserve_unknown_start": True,  # reserve even when no running job's end is known (start unknown)
        "reservation_candidates": 32,  # nodes examined for such a reservation (those with the most room)
        "estimate_starts": True,  # project an estimated start for every pending job from declared runtimes
        "min_runtime_s": 300.0,  # younger jobs are never evicted
        "preempt_max_attempts": 16,  # evicting jobs considered per cycle (each may scan every node)
        "reclaim_max_attempts": 16,
        "explain": True,  # compute reason sentences for pending jobs
    }
)

TESSERA_PROD = Profile(
    name="tessera-prod",
    queue_order=("priority", "fairshare", "fifo"),
    admit=("quota", "modelquota"),
    filters=("fits",),
    node_scores=(("binpack", 1.0), ("topology", 1.0)),
    gpu_scores=(("binpack", 1.0), ("topology", 0.5)),
    actions=("admit", "allocate", "backfill", "reclaim", "preempt"),
    params=DEFAULT_PARAMS,
)

PROFILES: dict[str, Profile] = {
    "tessera-prod": TESSERA_PROD,
    "default": TESSERA_PROD,
    "binpack": Profile(
        name="binpack",
        node_scores=(("binpack", 1.0),),
        gpu_scores=(("binpack", 1.0),),
        params=DEFAULT_PARAMS,
    ),
    "spread": Profile(
        name="spread",
        node_scores=(("spread", 1.0),),
        gpu_scores=(("spread", 1.0),),
        params=DEFAULT_PARAMS,
    ),
}


def register_profile(profile: Profile) -> Profile:
    PROFILES[profile.name] = profile
    return profile


def get_profile(name: str) -> Profile:
    """The named profile; unknown names and profiles naming unknown plugins fail here, not mid-cycle."""
    for extra in EXTRA_PROFILES:
        PROFILES.setdefault(extra.name, extra)
    try:
        profile = PROFILES[name]
    except KeyError:
        raise KeyError(f"unknown profile {name!r}; known: {', '.join(sorted(PROFILES))}") from None
    check_profile(profile)
    return profile


def check_profile(profile: Profile) -> None:
    names = [*profile.queue_order, *profile.admit, *profile.filters]
    names += [n for n, _ in profile.node_scores] + [n for n, _ in profile.gpu_scores]
    unknown = sorted({n for n in names if n not in REGISTRY})
    if unknown:
        raise KeyError(f"profile {profile.name!r} names unknown plugins: {', '.join(unknown)}")
    bad = sorted(set(profile.actions) - KNOWN_ACTIONS)
    if bad:
        raise KeyError(f"profile {profile.name!r} names unknown actions: {', '.join(bad)}")


KNOWN_ACTIONS = frozenset({"admit", "allocate", "backfill", "reclaim", "preempt"})
