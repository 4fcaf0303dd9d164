"""The node index: per-node summaries in numpy arrays plus per-request memos of which nodes fit and how they score.

This is what makes a cycle cheap; docs/engine.md ("Performance") explains the memos, shapes and slots.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import compress
from operator import is_not

import numpy as np

from scheduling.engine.resources import compute_cap_milli, gpu_is_free
from scheduling.engine.types import Health, Node, Request, Sharing

NEG_INF = float("-inf")
# Past this many shapes the memos are dropped and rebuilt (a long-lived process must not grow forever).
_MAX_SHAPES = 500_000
_MAX_VERDICTS = 2_000_000
_MAX_MEMOS = 4096
_MAX_LOG = 1_000_000
# Below this many node changes a memo catches up position by position instead of through whole arrays.
_FEW_CHANGES = 32


def shape_key(node: Node) -> tuple:
    """Everything a cacheable plugin may read from a node: all of it except its name and the cards' UUIDs."""
    return (
        node.cpu_milli,
        node.memory_mib,
        node.allocated_cpu_milli,
        node.allocated_memory_mib,
        node.state,
        node.nvlink,
        tuple(sorted(node.labels.items())) if node.labels else (),
        tuple(
            (
                g.index,
                g.model,
                g.memory_mib,
                g.compute_capability,
                g.numa_node,
                g.sharing,
                g.health,
                g.mig_profiles_mib,
                g.allocated_memory_mib,
                g.allocated_compute_milli,
                g.holders,
            )
            for g in node.gpus
        ),
    )


def only_consumed(old: Node, new: Node) -> bool:
    """True when `new` is `old` with some more capacity taken: anything that did not fit still does not."""
    if (
        old.state != new.state
        or old.cpu_milli != new.cpu_milli
        or old.memory_mib != new.memory_mib
        or old.nvlink != new.nvlink
        or old.labels != new.labels
        or len(old.gpus) != len(new.gpus)
        or new.allocated_cpu_milli < old.allocated_cpu_milli
        or new.allocated_memory_mib < old.allocated_memory_mib
    ):
        return False
    for a, b in zip(old.gpus, new.gpus, strict=True):
        if a is b:
            continue
        if (
            a.index != b.index
            or a.model != b.model
            or a.memory_mib != b.memory_mib
            or a.compute_capability != b.compute_capability
            or a.numa_node != b.numa_node
            or a.sharing != b.sharing
            or a.health != b.health
            or a.mig_profiles_mib != b.mig_profiles_mib
            or b.allocated_memory_mib < a.allocated_memory_mib
            or b.allocated_compute_milli < a.allocated_compute_milli
            or b.holders < a.holders
        ):
            return False
    return True


class RequestMemo:
    """For one request: which positions fit, their cached score, and the node version each verdict is for."""

    __slots__ = ("ok", "score", "ver", "clock", "best", "layout")

    def __init__(self, n: int):
        self.ok = np.zeros(n, dtype=bool)
        self.score = np.zeros(n, dtype=np.float64)
        self.ver = np.full(n, -1, dtype=np.int64)
        self.clock = -1  # the index clock this memo is up to date with
        self.best: int | None | bool = False  # cached best slot (None: nowhere); False: not computed
        self.layout = -1  # the index layout `best` was computed for

    def grow(self, n: int) -> None:
        self.ok = np.concatenate([self.ok, np.zeros(n - len(self.ok), dtype=bool)])
        self.score = np.concatenate([self.score, np.zeros(n - len(self.score), dtype=np.float64)])
        self.ver = np.concatenate([self.ver, np.full(n - len(self.ver), -1, dtype=np.int64)])
        self.best = False


class NodeIndex:
    """Nodes live in *slots*, one per node name, that outlast a snapshot: a node list that changes order or
    membership from one cycle to the next keeps every memo. `rank[slot]` is the node's position in the current
    snapshot (ties go to the lowest rank) and `present[slot]` whether it is in it at all.

    Nodes are interned by *shape* (everything but the name and card UUIDs) and a cacheable plugin's verdict on
    (request, shape) is computed once, across cycles too. Each slot has a version that moves when its shape
    changes; a request's memo recomputes only the slots whose version moved since it last looked, and skips a
    node that could not host the request and has only lost free capacity since."""

    def __init__(self, nodes: Sequence[Node], timeslice_factor: float):
        self.timeslice_factor = timeslice_factor
        self.shape_ids: dict[tuple, int] = {}
        self.rows: dict[int, tuple] = {}  # shape id -> its summary
        self.pool_rows: dict[int, tuple] = {}  # shape id -> what it adds to the start projection
        self.model_bits: dict[str, int] = {}
        self.memos: dict[Request, RequestMemo] = {}
        self.verdicts: dict[tuple[Request, int], tuple[bool, float]] = {}
        self.touched: set[int] = set()  # slots set() since the owner last cleared it
        self._in_order: tuple[tuple, NodeIndex] | None = None
        self._build(tuple(nodes))

    # -- building and keeping in step -------------------------------------------------------------------------
    _ARRAYS = (
        ("shape", np.int64, 0),
        ("ver", np.int64, 0),
        ("rel_ver", np.int64, 0),
        ("ready", bool, False),
        ("present", bool, False),
        ("rank", np.int64, 1 << 62),
        ("free_cpu", np.int64, 0),
        ("free_mem", np.int64, 0),
        ("n_idle", np.int64, 0),
        ("slice_mem", np.int64, 0),
        ("slice_comp", np.int64, 0),
        ("model_mask", np.int64, 0),
        ("card_mem", np.int64, 0),
        ("cc", np.int64, 0),
    )

    def _build(self, nodes: tuple[Node, ...]) -> None:
        self.capacity = 0
        self.slot_of: dict[str, int] = {}
        self.nodes: list[Node] = []  # the working node per slot
        self.names: list[str] = []
        self.snap_nodes: list[Node | None] = []  # the node per slot as the last snapshot gave it
        for name, dtype, fill in self._ARRAYS:
            setattr(self, name, np.full(0, fill, dtype=dtype))
        self.clock = 1
        self.base_clock = 1
        self.release_clock = 1  # the clock of the latest change that may have freed capacity anywhere
        self.log: list[int] = []  # log[k]: the slot whose change moved the clock to base_clock + k + 1
        self.memos.clear()
        self._in_order = None
        self.layout_id = 0
        self.base: tuple[Node, ...] = ()
        self.order: list[int] = []  # snapshot position -> slot
        self._layout(nodes)

    def _grow(self, need: int) -> None:
        if need <= self.capacity:
            return
        size = max(need, 2 * self.capacity, 16)
        for name, dtype, fill in self._ARRAYS:
            old = getattr(self, name)
            grown = np.full(size, fill, dtype=dtype)
            grown[: len(old)] = old
            setattr(self, name, grown)
        self.capacity = size

    def _layout(self, nodes: tuple[Node, ...]) -> None:
        """Map a snapshot's node list onto slots, looking at each node only if its object is new to its slot."""
        order = []
        for node in nodes:
            slot = self.slot_of.get(node.name)
            if slot is None:
                slot = self.slot_of[node.name] = len(self.nodes)
                self._grow(slot + 1)
                self.nodes.append(node)
                self.names.append(node.name)
                self.snap_nodes.append(node)
                self._summarise(slot, node)
                self._bump(slot, released=True)
            order.append(slot)
        if len(set(order)) != len(order):
            raise ValueError("node names must be unique within a snapshot")
        self.present[:] = False
        self.rank[:] = 1 << 62
        idx = np.asarray(order, dtype=np.int64)
        self.present[idx] = True
        self.rank[idx] = np.arange(len(order), dtype=np.int64)
        self.layout_id += 1
        self.order = order
        self.base = nodes
        for slot, node in zip(order, nodes, strict=True):
            self.snap_nodes[slot] = node
            self.set(slot, node)

    def _model_bit(self, model: str) -> int:
        bit = self.model_bits.get(model)
        if bit is None:
            # Past 62 models every node matches every model here; the full filter still decides.
            bit = (1 << len(self.model_bits)) if len(self.model_bits) < 62 else -1
            self.model_bits[model] = bit
        return bit

    def _summarise(self, pos: int, node: Node) -> None:
        key = shape_key(node)
        sid = self.shape_ids.get(key)
        if sid is None:
            sid = self.shape_ids[key] = len(self.shape_ids)
            self.rows[sid] = self._row(node)
        row = self.rows[sid]
        self.shape[pos] = sid
        (
            self.ready[pos],
            self.free_cpu[pos],
            self.free_mem[pos],
            self.n_idle[pos],
            self.slice_mem[pos],
            self.slice_comp[pos],
            self.model_mask[pos],
            self.card_mem[pos],
            self.cc[pos],
        ) = row

    def _row(self, node: Node) -> tuple:
        """The summary of a node shape, in the order `_summarise` stores it."""
        idle = 0
        smem = scomp = -1
        mask = 0
        card = 0
        cc = 0
        for g in node.gpus:
            if g.health is Health.FAILED:
                continue
            mask |= self._model_bit(g.model)
            card = max(card, g.memory_mib)
            cc = max(cc, g.compute_capability[0] * 1000 + g.compute_capability[1])
            if gpu_is_free(g):
                idle += 1
            if g.sharing is not Sharing.EXCLUSIVE:
                smem = max(smem, g.memory_mib - g.allocated_memory_mib)
                scomp = max(scomp, compute_cap_milli(g, self.timeslice_factor) - g.allocated_compute_milli)
        return (
            node.schedulable,
            node.free_cpu_milli,
            node.free_memory_mib,
            idle,
            smem,
            scomp,
            mask,
            card,
            cc,
        )

    def set(self, pos: int, node: Node, *, consumed_only: bool | None = None) -> None:
        """Replace the node in slot `pos`; `consumed_only` says whether it only lost capacity (computed if None)."""
        old = self.nodes[pos]
        if node is old:
            return
        self.touched.add(pos)
        old_shape = int(self.shape[pos])
        self.nodes[pos] = node
        self._summarise(pos, node)
        if int(self.shape[pos]) == old_shape:
            return
        if consumed_only is None:
            consumed_only = only_consumed(old, node)
        self._bump(pos, released=not consumed_only)

    def _bump(self, pos: int, *, released: bool) -> None:
        """Record that a slot changed: memos look at it again (and, if it may have gained room, even where the
        request did not fit)."""
        self.clock += 1
        if len(self.log) > _MAX_LOG:
            self.log = []
            self.base_clock = self.clock - 1  # memos older than this catch up through whole arrays
        self.log.append(pos)
        self.ver[pos] = self.clock
        if released:
            self.rel_ver[pos] = self.clock
            self.release_clock = self.clock

    def sync(self, nodes: tuple[Node, ...], dirty: set[int]) -> None:
        """Catch up with a new snapshot. With the same node list as last time only positions whose node object
        changed, and slots the last cycle modified (`dirty`), are looked at; otherwise each node is matched to its
        slot by name and looked at only if its object is not the one the slot holds."""
        if len(self.shape_ids) > _MAX_SHAPES:
            self.shape_ids.clear()
            self.rows.clear()
            self.pool_rows.clear()
            self.verdicts.clear()
            self._build(nodes)
            return
        if len(self.verdicts) > _MAX_VERDICTS:
            self.verdicts.clear()  # recomputable; the memos keep what they know
        if nodes is self.base and not dirty:
            return
        old = self.base
        order = self.order
        same = len(old) == len(nodes)
        changed: list[int] = []
        if same:
            names = self.names
            # The identity comparison runs in C (map/compress): a replay changes one node in a thousand.
            for pos in compress(range(len(nodes)), map(is_not, old, nodes)):
                if nodes[pos].name != names[order[pos]]:
                    same = False
                    break
                changed.append(pos)
        if not same:
            self._layout(nodes)
            return
        self.base = nodes
        snap_nodes = self.snap_nodes
        for pos in changed:
            snap_nodes[order[pos]] = nodes[pos]
        for slot in sorted(dirty | {order[pos] for pos in changed}):
            self.set(slot, snap_nodes[slot])

    def snapshot_models(self) -> tuple[str, ...]:
        """The GPU models of the current snapshot's usable cards, in snapshot order. `model_bits` also holds the
        models of nodes earlier snapshots had, so an answer that depends on which models exist reads this."""
        seen: dict[str, None] = {}
        for slot in self.order:
            node = self.snap_nodes[slot]
            for g in node.gpus if node is not None else ():
                if g.health is not Health.FAILED:
                    seen.setdefault(g.model)
        return tuple(seen)

    def ranked(self, slots: Sequence[int]) -> list[int]:
        """The slots in snapshot order."""
        rank = self.rank
        return sorted(slots, key=lambda s: rank[s])

    def best(self, ok: np.ndarray, score: np.ndarray) -> int | None:
        """The slot with the highest score among those that fit and are present; ties to the lowest rank."""
        masked = np.where(ok & self.present, score, NEG_INF)
        top = masked.max() if len(masked) else NEG_INF
        if top == NEG_INF:
            return None
        tied = np.flatnonzero(masked == top)
        return int(tied[0]) if len(tied) == 1 else int(tied[np.argmin(self.rank[tied])])

    def in_order(self) -> NodeIndex:
        """A copy of the index laid out in snapshot order (slot = position), for code that names nodes.
        Kept until a node or the layout changes (a replay explains many failures in a row)."""
        # Same layout and clock: every slot has the same shape (names and summaries), all that reasons read.
        key = (self.layout_id, self.clock)
        if self._in_order is not None and self._in_order[0] == key:
            return self._in_order[1]
        view = self._ordered()
        self._in_order = (key, view)
        return view

    def _ordered(self) -> NodeIndex:
        view = object.__new__(NodeIndex)
        view.timeslice_factor = self.timeslice_factor
        view.model_bits = self.model_bits
        idx = np.asarray(self.order, dtype=np.int64)
        for name, _, _ in self._ARRAYS:
            setattr(view, name, getattr(self, name)[idx])
        view.nodes = [self.nodes[s] for s in self.order]
        view.names = [self.names[s] for s in self.order]
        view.order = list(range(len(self.order)))
        return view

    # -- asking ----------------------------------------------------------------------------------------------
    def coarse(self, req: Request, *, present: bool = True) -> np.ndarray:
        """A cheap necessary condition: slots failing it cannot host the request. With `present`, slots absent
        from the snapshot fail too (memos leave that out: their verdicts must outlive a node's absence)."""
        m = self.ready & (self.free_cpu >= req.cpu_milli)
        if present:
            m &= self.present
        m &= self.free_mem >= req.memory_mib
        if req.gpus:
            m &= self.n_idle >= req.gpus
        elif req.is_slice:
            m &= (self.slice_mem >= req.gpu_memory_mib) & (self.slice_comp >= req.gpu_compute_milli)
        if req.uses_gpu:
            if req.gpu_models:
                allowed = 0
                for model in req.gpu_models:
                    allowed |= self._model_bit(model)
                m &= (self.model_mask & allowed) != 0
            if req.min_gpu_memory_mib:
                m &= self.card_mem >= req.min_gpu_memory_mib
            if req.min_compute_capability > (0, 0):
                major, minor = req.min_compute_capability
                m &= self.cc >= major * 1000 + minor
        return m

    def static(self, req: Request) -> np.ndarray:
        """Ready nodes with a card of the allowed model, memory and compute capability (free or not)."""
        m = self.ready & self.present
        if not req.uses_gpu:
            return m
        if req.gpu_models:
            allowed = 0
            for model in req.gpu_models:
                allowed |= self._model_bit(model)
            m &= (self.model_mask & allowed) != 0
        else:
            m &= self.model_mask != 0
        if req.min_gpu_memory_mib:
            m &= self.card_mem >= req.min_gpu_memory_mib
        if req.min_compute_capability > (0, 0):
            major, minor = req.min_compute_capability
            m &= self.cc >= major * 1000 + minor
        return m

    def memo(self, req: Request, evaluate: Callable[[int], tuple[bool, float]]) -> RequestMemo:
        """The request's memo brought up to date; `evaluate(pos)` gives (fits, cached score part) for a node."""
        memo = self.memos.get(req)
        if memo is None:
            if len(self.memos) >= _MAX_MEMOS:
                # Many distinct requests (a long-lived process): forget the older half.
                for old in list(self.memos)[: _MAX_MEMOS // 2]:
                    del self.memos[old]
            memo = self.memos[req] = RequestMemo(self.capacity)
        elif len(memo.ok) < self.capacity:
            memo.grow(self.capacity)
        if memo.layout != self.layout_id:
            memo.best = False
            memo.layout = self.layout_id
        if memo.clock == self.clock:
            return memo
        memo.best = False
        behind = self.clock - memo.clock
        if memo.clock >= self.base_clock and behind <= _FEW_CHANGES:
            # Few changes since the last look: visit just those positions instead of whole arrays.
            start = memo.clock - self.base_clock
            for pos in sorted(set(self.log[start:])):
                ver = int(self.ver[pos])
                if memo.ver[pos] == ver:
                    continue
                if not memo.ok[pos] and self.rel_ver[pos] <= memo.ver[pos]:
                    memo.ver[pos] = ver
                    continue
                key = (req, int(self.shape[pos]))
                verdict = self.verdicts.get(key)
                if verdict is None:
                    verdict = self.verdicts[key] = evaluate(pos)
                memo.ok[pos], memo.score[pos] = verdict
                memo.ver[pos] = ver
            memo.clock = self.clock
            return memo
        stale = memo.ver != self.ver
        # A node that did not fit and has only lost capacity since still does not fit.
        still_out = stale & ~memo.ok & (self.rel_ver <= memo.ver)
        look = stale & ~still_out
        if look.any():
            cand = look & self.coarse(req, present=False)
            memo.ok[look & ~cand] = False
            verdicts = self.verdicts
            shape = self.shape
            for pos in np.flatnonzero(cand).tolist():
                key = (req, int(shape[pos]))
                verdict = verdicts.get(key)
                if verdict is None:
                    verdict = verdicts[key] = evaluate(pos)
                memo.ok[pos], memo.score[pos] = verdict
        memo.ver[stale] = self.ver[stale]
        memo.clock = self.clock
        return memo
