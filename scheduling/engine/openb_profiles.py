"""Profiles for the FGD paper's baselines, FGD itself and Tessera's packing policy, as the static replay runs them."""

from __future__ import annotations

from types import MappingProxyType

from scheduling.engine.framework import Profile

# The static replay has one pending pod per cycle, no quotas and no preemption: only placement runs, and a pod
# that does not fit needs no reason sentence (it is counted as failed).
_REPLAY = dict(
    queue_order=("fifo",),
    admit=(),
    filters=("fits",),
    actions=("allocate",),
    params=MappingProxyType({"explain": False}),
)

POLICIES = ("random", "dotprod", "gpuclustering", "gpupacking", "bestfit", "fgd", "tessera")
OPENB_PROFILES: dict[str, Profile] = {
    name: Profile(name=name, node_scores=((name, 1.0),), gpu_scores=((name, 1.0),), **_REPLAY)
    for name in POLICIES
}


def openb_profile(name: str) -> Profile:
    try:
        return OPENB_PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(POLICIES)}") from None
