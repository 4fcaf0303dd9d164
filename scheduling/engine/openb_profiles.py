"""Profiles for the FGD paper's baselines, FGD itself, Tessera's packing policy and the production profile's
placement, as the static replay runs them."""

from __future__ import annotations

from types import MappingProxyType

from scheduling.engine.framework import Profile
from scheduling.engine.profiles import TESSERA_PROD

# The static replay has one pending pod per cycle, no quotas and no preemption: only placement runs, and a pod
# that does not fit needs no reason sentence (it is counted as failed).
_REPLAY = dict(
    queue_order=("fifo",),
    admit=(),
    filters=("fits",),
    actions=("allocate",),
    params=MappingProxyType({"explain": False}),
)

BASELINES = ("random", "dotprod", "gpuclustering", "gpupacking", "bestfit", "fgd", "tessera")
# `production`: the node and card scores of the profile the portal runs (`tessera-prod`), so the policy measured
# on openb is the one that places jobs in production.
POLICIES = (*BASELINES, "production")
OPENB_PROFILES: dict[str, Profile] = {
    name: Profile(name=name, node_scores=((name, 1.0),), gpu_scores=((name, 1.0),), **_REPLAY)
    for name in BASELINES
}
OPENB_PROFILES["production"] = Profile(
    name="production", node_scores=TESSERA_PROD.node_scores, gpu_scores=TESSERA_PROD.gpu_scores, **_REPLAY
)


def openb_profile(name: str) -> Profile:
    try:
        return OPENB_PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(POLICIES)}") from None
