"""What outlives one cycle for a profile: its plugins, sorted once by the hooks they implement, and the node index.

Sorting by protocol here is what keeps the hot path free of attribute look-ups: a cycle only walks these lists.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from scheduling.engine.framework import (
    AdmitChargeHook,
    BatchNodeScorer,
    BorrowedHook,
    CardChooser,
    ModelAdmitHook,
    ModelBorrowedHook,
    ModelRestrictionHook,
    Profile,
)
from scheduling.engine.hooks import implements
from scheduling.engine.index import NodeIndex
from scheduling.engine.plugins import get_plugin


@dataclass
class PluginSet:
    """A profile's plugin instances, per extension point and per optional hook."""

    queue: list[Any]
    admit: list[Any]
    cached_filters: list[Any]
    live_filters: list[Any]
    cached_scores: list[tuple[Any, float]]
    live_scores: list[tuple[Any, float]]
    gpu_scores: list[tuple[Any, float]]
    # Cached then live: every filter and node score, as a node seen on its own is judged.
    filters: tuple[Any, ...] = ()
    node_scores: tuple[tuple[Any, float], ...] = ()
    # Per live node score: the call scoring a list of nodes at once, or None to call score_node per node.
    live_batch: list[Callable[..., Any] | None] = field(default_factory=list)
    # The whole-card choice of the first GPU-score plugin that makes it (None: the engine's default).
    choose_cards: Callable[..., Any] | None = None
    # Per admit plugin with an exact-charge hook, in profile order: (admit_charge or None, borrowed or None).
    charge_checks: list[tuple[Callable[..., Any] | None, Callable[..., Any] | None]] = field(
        default_factory=list
    )
    # Admit plugins with per-GPU-model hooks (see framework.ModelRestrictionHook).
    restrictors: list[Any] = field(default_factory=list)
    model_checks: list[Any] = field(default_factory=list)
    model_borrowed: list[Any] = field(default_factory=list)


def _cacheable(plugin: Any) -> bool:
    return bool(getattr(plugin, "CACHEABLE", True))


def load_plugins(profile: Profile) -> PluginSet:
    """Instances of the profile's plugins, sorted by the protocols they implement (the profile is checked)."""
    # A filter that is the engine's own node-fit rule is applied by the node index already.
    filters = [p for p in (get_plugin(n) for n in profile.filters) if not getattr(p, "NODE_FIT", False)]
    node_scores = [(get_plugin(n), float(w)) for n, w in profile.node_scores if w]
    admit = [get_plugin(n) for n in profile.admit]
    live_scores = [(p, w) for p, w in node_scores if not _cacheable(p)]
    # Whatever its weight: a GPU-score plugin listed with weight 0 still chooses the cards.
    choosers = [p for p in (get_plugin(n) for n, _ in profile.gpu_scores) if implements(type(p), CardChooser)]
    charge_checks = []
    for p in admit:
        check = p.admit_charge if implements(type(p), AdmitChargeHook) else None
        borrowed = p.borrowed if implements(type(p), BorrowedHook) else None
        if check is not None or borrowed is not None:
            charge_checks.append((check, borrowed))
    cached_filters = [f for f in filters if _cacheable(f)]
    live_filters = [f for f in filters if not _cacheable(f)]
    cached_scores = [(p, w) for p, w in node_scores if _cacheable(p)]
    return PluginSet(
        queue=[get_plugin(n) for n in profile.queue_order],
        admit=admit,
        cached_filters=cached_filters,
        live_filters=live_filters,
        cached_scores=cached_scores,
        live_scores=live_scores,
        filters=(*cached_filters, *live_filters),
        node_scores=(*cached_scores, *live_scores),
        gpu_scores=[(get_plugin(n), float(w)) for n, w in profile.gpu_scores if w],
        live_batch=[p.score_nodes if implements(type(p), BatchNodeScorer) else None for p, _ in live_scores],
        choose_cards=choosers[0].choose_cards if choosers else None,
        charge_checks=charge_checks,
        restrictors=[p for p in admit if implements(type(p), ModelRestrictionHook)],
        model_checks=[p for p in admit if implements(type(p), ModelAdmitHook)],
        model_borrowed=[p for p in admit if implements(type(p), ModelBorrowedHook)],
    )


@dataclass
class EngineState:
    """What outlives one cycle for a profile: the plugins, its actions and the node index with its memos."""

    profile: Profile
    plugins: PluginSet
    actions: list[Any] = field(default_factory=list)
    index: NodeIndex | None = None
    dirty: set[int] = field(default_factory=set)
    workload: Any = None
    lock: threading.Lock = field(default_factory=threading.Lock)
    # Running job id -> (its assignments, what they give back to the start projection's pools).
    releases: dict[str, tuple] = field(default_factory=dict)
    # What follows from the running jobs alone (where each holds what, when each ends), kept while cycles run
    # on the same nodes, running jobs and time (what-ifs on one snapshot): (nodes, running, now, the parts).
    running_memo: tuple[Any, Any, float, dict[Any, Any]] | None = None
