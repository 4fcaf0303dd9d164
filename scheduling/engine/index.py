"""The node index: per-node summaries in numpy arrays plus per-request memos of which nodes fit and how they score.

This is what makes a cycle cheap. Nodes are interned by *shape* (everything but the name and card UUIDs), and a
cacheable plugin's verdict on (request, shape) is computed once and reused, across cycles too. Each node position
has a version that changes when the node's shape changes; a request's memo recomputes only the positions whose
version moved since it last looked, and a node that could not host a request and has only lost free capacity
since still cannot, so it is skipped without a look. Ties always go to the lowest position (snapshot order).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from scheduling.engine.resources import compute_cap_milli, gpu_is_free
from scheduling.engine.types import Health, Node, Request, Sharing

NEG_INF = float("-inf")
# Past this many shapes the memos are dropped and rebuilt (a long-lived process must not grow forever).
_MAX_SHAPES = 500_000
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

    __slots__ = ("ok", "score", "ver", "clock", "best")

    def __init__(self, n: int):
        self.ok = np.zeros(n, dtype=bool)
        self.score = np.zeros(n, dtype=np.float64)
        self.ver = np.full(n, -1, dtype=np.int64)
        self.clock = -1  # the index clock this memo is up to date with
        self.best: int | None | bool = False  # cached best position (None: nowhere); False: not computed


class NodeIndex:
    def __init__(self, nodes: Sequence[Node], timeslice_factor: float):
        self.timeslice_factor = timeslice_factor
        self.shape_ids: dict[tuple, int] = {}
        self.model_bits: dict[str, int] = {}
        self.memos: dict[Request, RequestMemo] = {}
        self.verdicts: dict[tuple[Request, int], tuple[bool, float]] = {}
        self.base: tuple[Node, ...] = ()
        self.touched: set[int] = set()  # positions set() since the owner last cleared it
        self._build(tuple(nodes))

    # -- building and keeping in step -------------------------------------------------------------------------
    def _build(self, nodes: tuple[Node, ...]) -> None:
        n = len(nodes)
        self.base = nodes
        self.nodes: list[Node] = list(nodes)
        self.names = [node.name for node in nodes]
        self.shape = np.zeros(n, dtype=np.int64)
        self.ver = np.zeros(n, dtype=np.int64)
        self.rel_ver = np.zeros(n, dtype=np.int64)
        self.ready = np.zeros(n, dtype=bool)
        self.free_cpu = np.zeros(n, dtype=np.int64)
        self.free_mem = np.zeros(n, dtype=np.int64)
        self.n_idle = np.zeros(n, dtype=np.int64)
        self.slice_mem = np.zeros(n, dtype=np.int64)
        self.slice_comp = np.zeros(n, dtype=np.int64)
        self.model_mask = np.zeros(n, dtype=np.int64)
        self.card_mem = np.zeros(n, dtype=np.int64)
        self.cc = np.zeros(n, dtype=np.int64)
        self.clock = 1
        self.base_clock = 1
        self.log: list[int] = []  # log[k]: the position whose change moved the clock to base_clock + k + 1
        self.memos.clear()
        for pos, node in enumerate(nodes):
            self._summarise(pos, node)

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
        self.shape[pos] = sid
        self.ready[pos] = node.schedulable
        self.free_cpu[pos] = node.free_cpu_milli
        self.free_mem[pos] = node.free_memory_mib
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
        self.n_idle[pos] = idle
        self.slice_mem[pos] = smem
        self.slice_comp[pos] = scomp
        self.model_mask[pos] = mask
        self.card_mem[pos] = card
        self.cc[pos] = cc

    def set(self, pos: int, node: Node, *, consumed_only: bool | None = None) -> None:
        """Replace the node at `pos`; `consumed_only` says whether it only lost capacity (computed if None)."""
        old = self.nodes[pos]
        if node is old:
            return
        self.touched.add(pos)
        old_shape = int(self.shape[pos])
        self.nodes[pos] = node
        self._summarise(pos, node)
        if int(self.shape[pos]) == old_shape:
            return
        self.clock += 1
        if len(self.log) > _MAX_LOG:
            self.log = []
            self.base_clock = self.clock - 1  # memos older than this catch up through whole arrays
        self.log.append(pos)
        self.ver[pos] = self.clock
        if consumed_only is None:
            consumed_only = only_consumed(old, node)
        if not consumed_only:
            self.rel_ver[pos] = self.clock

    def sync(self, nodes: tuple[Node, ...], dirty: set[int]) -> None:
        """Catch up with a new snapshot: look only at positions whose node object changed or that the last cycle
        modified. A different node list (names or length) is rebuilt from scratch."""
        if len(self.shape_ids) > _MAX_SHAPES:
            self.shape_ids.clear()
            self.verdicts.clear()
            self._build(nodes)
            return
        if nodes is self.base and not dirty:
            return
        old = self.base
        if len(old) != len(nodes):
            self._build(nodes)
            return
        changed = set(dirty)
        changed.update(i for i, (a, b) in enumerate(zip(old, nodes, strict=True)) if a is not b)
        for pos in changed:
            if nodes[pos].name != self.names[pos]:
                self._build(nodes)
                return
        self.base = nodes
        for pos in sorted(changed):
            self.set(pos, nodes[pos])

    # -- asking ----------------------------------------------------------------------------------------------
    def coarse(self, req: Request) -> np.ndarray:
        """A cheap necessary condition: positions failing it cannot host the request."""
        m = self.ready & (self.free_cpu >= req.cpu_milli) & (self.free_mem >= req.memory_mib)
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
        m = self.ready.copy()
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
            memo = self.memos[req] = RequestMemo(len(self.nodes))
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
            cand = look & self.coarse(req)
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
