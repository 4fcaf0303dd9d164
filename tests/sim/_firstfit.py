"""A trivial first-fit scheduler used only by the simulator's own tests, so they do not depend on the engine."""

from __future__ import annotations

from scheduling.engine.types import (
    WHOLE_GPU_MILLI,
    Assignment,
    Decisions,
    Eviction,
    Placement,
    Snapshot,
)


def first_fit(snapshot: Snapshot, profile: object) -> Decisions:
    """Place pending jobs in submit order on the first GPUs that fit; optionally evict lower priority.

    `profile` may be a dict with {"preempt": True} to evict the lowest-priority preemptible job when the head of
    the queue does not fit (enough to exercise the simulator's eviction path, nothing more).
    """
    free = {}
    for node in snapshot.nodes:
        if not node.schedulable:
            continue
        for g in node.gpus:
            free[(node.name, g.index)] = [g.free_memory_mib, g.free_compute_milli, g.holders, g.memory_mib]
    placements, evictions = [], []
    for job in sorted(snapshot.pending, key=lambda j: (-j.priority, j.submit_time, j.id)):
        req = job.request
        chosen = None
        if req.gpus:
            by_node = {}
            for (n, i), (_fm, _fc, h, _cap) in free.items():
                if h == 0:
                    by_node.setdefault(n, []).append(i)
            for n, idx in by_node.items():
                if len(idx) >= req.gpus:
                    chosen = [(n, i) for i in sorted(idx)[: req.gpus]]
                    break
            if chosen:
                asg = tuple(Assignment(n, i, free[(n, i)][3], WHOLE_GPU_MILLI) for n, i in chosen)
                for k in chosen:
                    free[k][0] = 0
                    free[k][1] = 0
                    free[k][2] += 1
        else:
            for k, (fm, fc, _h, _cap) in free.items():
                if fm >= req.gpu_memory_mib and fc >= req.gpu_compute_milli:
                    chosen = [k]
                    asg = (Assignment(k[0], k[1], req.gpu_memory_mib, req.gpu_compute_milli),)
                    free[k][0] -= req.gpu_memory_mib
                    free[k][1] -= req.gpu_compute_milli
                    free[k][2] += 1
                    break
        if chosen:
            placements.append(Placement(job.id, asg))
        elif isinstance(profile, dict) and profile.get("preempt"):
            victims = [r for r in snapshot.running if r.preemptible and r.priority < job.priority]
            if victims:
                v = min(victims, key=lambda r: (r.priority, -(r.start_time or 0)))
                evictions.append(Eviction(v.id, job.id, "preempted", v.grace_s))
            break
        else:
            break  # strict FIFO: the head blocks the rest
    return Decisions(placements=tuple(placements), evictions=tuple(evictions))
