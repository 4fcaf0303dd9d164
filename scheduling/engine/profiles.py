"""Named profiles: which plugins and actions a cycle runs, with their weights and parameters.

Plugin modules may add profiles of their own by defining `PROFILES`; `get_profile(name)` finds both.
"""

from __future__ import annotations

from scheduling.engine.actions import ACTIONS
from scheduling.engine.framework import DEFAULT_PARAMS, Profile
from scheduling.engine.hooks import check_extension_point
from scheduling.engine.plugins import EXTRA_PROFILES, REGISTRY

TESSERA_PROD = Profile(
    name="tessera-prod",
    queue_order=("guarantee", "priority", "fairshare", "fifo"),
    admit=("quota", "modelquota"),
    filters=("fits",),
    # Fragmentation-aware packing (`tessera`: FGD, which also sees NVLink and card sizes, then CPU balance, model
    # matching and first fit); whole cards on the tightest NVLink island (`topology` chooses cards). The openb
    # static replay measures this placement (policy `production`).
    node_scores=(("tessera", 1.0),),
    gpu_scores=(("tessera", 1.0), ("topology", 0.5)),
    actions=("admit", "allocate", "backfill", "consolidate", "reclaim", "preempt"),
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
    """Refuse a profile naming an unknown plugin or action, a plugin under an extension point it does not
    implement (a name under `filters` whose class has no `filter`), or an action twice."""
    names = [*profile.queue_order, *profile.admit, *profile.filters]
    names += [n for n, _ in profile.node_scores] + [n for n, _ in profile.gpu_scores]
    unknown = sorted({n for n in names if n not in REGISTRY})
    if unknown:
        raise KeyError(f"profile {profile.name!r} names unknown plugins: {', '.join(unknown)}")
    points = {
        "queue_order": profile.queue_order,
        "admit": profile.admit,
        "filters": profile.filters,
        "node_scores": tuple(n for n, _ in profile.node_scores),
        "gpu_scores": tuple(n for n, _ in profile.gpu_scores),
    }
    for field, plugins in points.items():
        for name in plugins:
            check_extension_point(profile.name, field, name, REGISTRY[name])
    bad = sorted(set(profile.actions) - KNOWN_ACTIONS)
    if bad:
        raise KeyError(
            f"profile {profile.name!r} names unknown actions: {', '.join(bad)}; known: {', '.join(ACTIONS)}"
        )
    twice = sorted({a for a in profile.actions if profile.actions.count(a) > 1})
    if twice:
        raise KeyError(f"profile {profile.name!r} names actions more than once: {', '.join(twice)}")


# The action names a profile may list (the action registry's).
KNOWN_ACTIONS = frozenset(ACTIONS)
