"""Tessera's packing policy: FGD's fragmentation score, with its ties settled by CPU balance and model matching.

Rules, in order (docs/simulator.md says why each helps):
1. Node: the FGD integer score (least fragmentation of the typical workload).
2. Among nodes FGD cannot tell apart: the one where the placement strands the least GPU for lack of CPU, at the
   typical workload's CPU-per-GPU ratio, counted in quarter cards.
3. Then, for a request any GPU model may serve: the model that the workload's model-restricted tasks need least,
   relative to how much of it the cluster has.
4. Then the first node in the snapshot's order (first-fit consolidation).
GPU, for a slice: the best FGD score, then the tightest GPU that fits, then the lowest index.
Everything is learned from the snapshot's typical workload (as FGD does); no rule looks at a future task.
"""

from __future__ import annotations

from scheduling.engine.fragmentation import TaskClass, Workload, gpu_free_milli
from scheduling.engine.framework import CycleContext
from scheduling.engine.plugins.fgd import fgd_scores, workload_of
from scheduling.engine.types import WHOLE_GPU_MILLI, Gpu, Job, Node

NAME = "tessera"

# Weights keep the rules lexicographic: the CPU term stays below one FGD point and the model term below the
# CPU term's resolution for any stranding change it is meant to settle.
CPU_BALANCE_WEIGHT = 0.9
MODEL_MATCH_WEIGHT = 0.09
# Stranding changes are read on the scale of the largest node (8 whole GPUs); larger ones all count as worst.
STRAND_SCALE_MILLI = 8 * WHOLE_GPU_MILLI
STRAND_QUANTUM_MILLI = WHOLE_GPU_MILLI // 4

_learned: dict[tuple[int, int], tuple[object, float, dict[str, float]]] = {}


def cpu_per_gpu_milli(workload: Workload) -> float:
    """CPU (milli-cores) the typical GPU task brings per milli-GPU it asks for."""
    cpu = sum(share * c.cpu_milli for c, share in workload if c.num_gpu)
    gpu = sum(share * c.num_gpu * c.gpu_milli for c, share in workload if c.num_gpu)
    return cpu / gpu if gpu else 0.0


def model_pressure(workload: Workload, gpus_by_model: dict[str, int]) -> dict[str, float]:
    """Per model, in [0, 1]: the share of the typical GPU demand that may run only on a set of models including it
    (spread over the set by capacity), divided by the model's share of the cluster's GPUs."""
    total = sum(gpus_by_model.values())
    gpu_demand = sum(share * c.num_gpu * c.gpu_milli for c, share in workload if c.num_gpu)
    if not total or not gpu_demand:
        return {}
    demand: dict[str, float] = {}
    for c, share in workload:
        if not (c.models and c.num_gpu):
            continue
        allowed = sum(gpus_by_model.get(model, 0) for model in c.models)
        if not allowed:
            continue
        for model in c.models:
            part = gpus_by_model.get(model, 0) / allowed
            demand[model] = demand.get(model, 0.0) + share * c.num_gpu * c.gpu_milli * part
    return {
        model: min(1.0, (amount / gpu_demand) / (gpus_by_model[model] / total))
        for model, amount in demand.items()
        if gpus_by_model.get(model)
    }


def _learn(ctx: CycleContext) -> tuple[float, dict[str, float]]:
    """The CPU-per-GPU ratio and model pressures, once per workload and cluster size."""
    wkey, workload = workload_of(ctx)
    key = (wkey, len(ctx.snapshot.nodes))
    entry = _learned.get(key)
    if entry is None or entry[0] is not ctx.snapshot.workload:
        gpus_by_model: dict[str, int] = {}
        for node in ctx.snapshot.nodes:
            for gpu in node.gpus:
                gpus_by_model[gpu.model] = gpus_by_model.get(gpu.model, 0) + 1
        if len(_learned) > 64:
            _learned.clear()
        entry = (ctx.snapshot.workload, cpu_per_gpu_milli(workload), model_pressure(workload, gpus_by_model))
        _learned[key] = entry
    return entry[1], entry[2]


def stranded_milli(cpu_free_milli: int, gpu_free_milli_total: int, cpu_per_gpu: float) -> float:
    """Free GPU share (milli) the node's free CPU cannot feed at `cpu_per_gpu` milli-cores per milli-GPU."""
    if cpu_per_gpu <= 0:
        return 0.0
    return max(0.0, gpu_free_milli_total - cpu_free_milli / cpu_per_gpu)


def cpu_balance(job: Job, node: Node, cpu_per_gpu: float) -> float:
    """1 when the placement strands less than a quarter card more GPU for lack of CPU, down to 0 for a node's worth.

    Increases are counted in quarter cards: smaller differences are left to first fit, which packs slices better
    than a fine CPU criterion where nearly every task is a slice."""
    task = TaskClass.of_request(job.request)
    gpu_free = sum(gpu_free_milli(gpu) for gpu in node.gpus)
    before = stranded_milli(node.free_cpu_milli, gpu_free, cpu_per_gpu)
    after = stranded_milli(
        node.free_cpu_milli - task.cpu_milli, gpu_free - task.num_gpu * task.gpu_milli, cpu_per_gpu
    )
    increase = (max(0.0, after - before) // STRAND_QUANTUM_MILLI) * STRAND_QUANTUM_MILLI
    return 1.0 - min(1.0, increase / STRAND_SCALE_MILLI)


class TesseraScore:
    NAME = NAME

    def score_node(self, ctx: CycleContext, job: Job, node: Node) -> float:
        cpu_per_gpu, pressure = _learn(ctx)
        score = float(max(fgd_scores(ctx, job, node)))
        score += CPU_BALANCE_WEIGHT * cpu_balance(job, node, cpu_per_gpu)
        if job.request.uses_gpu and not job.request.gpu_models and node.gpus:
            score += MODEL_MATCH_WEIGHT * (1.0 - pressure.get(node.gpus[0].model, 0.0))
        return score

    def score_gpu(self, ctx: CycleContext, job: Job, node: Node, gpu: Gpu) -> float:
        if not job.request.is_slice:
            return -gpu.index / 1000.0  # whole cards: the lowest free indexes
        scores = fgd_scores(ctx, job, node)
        # Integer FGD score first; the free-share term (< 0.5) and the index term only break its ties.
        return scores[gpu.index] - gpu_free_milli(gpu) / (2.0 * WHOLE_GPU_MILLI + 1) - gpu.index / 100000.0
