"""Agent events: prevented neighbour interference (the memory watchdog), GPU health, MPS unavailable, where a
job's web ports listen. An event about
a job counts only while the job's current attempt is placed on the node; each message is recorded once."""

from __future__ import annotations

import logging
import math
from typing import Any

from django.db import transaction

from scheduling.agents.reports.job_status import placed_here
from scheduling.agents.reports.nodes import NodeErrorKind, node_error_clear, node_error_note
from scheduling.agents.reports.outcome import Outcome, db_text
from scheduling.choices import ActorKind, GpuHealth
from scheduling.cycle.requests import cycle_request_after_commit
from scheduling.inventory.models import Gpu, Node
from scheduling.jobs.models import Job, JobEvent
from scheduling.jobs.sessions import session_ports_record
from scheduling.jobs.states import ACTIVE_STATES
from scheduling.realtime import events, groups

log = logging.getLogger(__name__)


_HEALTH = {
    "ok": GpuHealth.OK,
    "degraded": GpuHealth.DEGRADED,
    "lost": GpuHealth.FAILED,
    "failed": GpuHealth.FAILED,
}

_EVENT_FIELDS = {
    "gpu_uuid": str,
    "used_mib": int,
    "limit_mib": int,
    "at": float,
    "detail": str,
    "health": str,
}
_EVENT_TEXT_CHARS = 200
_EVENT_MAX_PIDS = 32


def _event_data(payload: dict[str, Any]) -> dict[str, Any]:
    """The known fields of an event payload, typed and bounded: an agent cannot fill the audit log."""
    data: dict[str, Any] = {}
    for key, kind in _EVENT_FIELDS.items():
        value = payload.get(key)
        if value is None:
            continue
        try:
            data[key] = db_text(value)[:_EVENT_TEXT_CHARS] if kind is str else kind(value)
        except (TypeError, ValueError):
            continue
    pids = payload.get("pids")
    if isinstance(pids, list):
        data["pids"] = [int(p) for p in pids[:_EVENT_MAX_PIDS] if isinstance(p, int)]
    return data


MAX_PULL_S = 7 * 24 * 3600.0  # an image_ready event's pull time, at most
MAX_MESSAGE_ID_CHARS = 64  # the agent's own are 32 (a uuid4 in hex)


def _event_job(*, node: Node, payload: dict[str, Any], kind: str, lock: bool = False) -> Job | Outcome:
    """The job an event is about, its current attempt placed on this node; else the refusal (an earlier attempt's
    event is stale, the current one placed elsewhere a wrong claim). Locked where a repeat arriving on two
    connections at once must be looked up one after the other."""
    try:
        job_id, attempt = int(payload["job_id"]), int(payload["attempt"])
    except (KeyError, TypeError, ValueError):
        return Outcome(False, f"an event of kind {kind} needs job_id and attempt")
    jobs = Job.objects.select_for_update() if lock else Job.objects
    job = jobs.filter(pk=job_id).first()
    if job is None or attempt != job.attempt or not placed_here(job, node):
        return Outcome(
            False,
            f"stale event: job {job_id} attempt {attempt} is not placed on {node.name}",
            stale=job is not None and attempt < job.attempt,
        )
    return job


def node_event(*, node_id: int, payload: dict[str, Any], message_id: str = "") -> Outcome:
    """Agent events: prevented neighbour interference (memory watchdog), GPU health changes, MPS trouble.
    An event about a job is refused unless the job's current attempt is placed on this node and still active;
    the same message (its `message_id`, sent again after a reconnect or on several connections) is recorded
    once: a repeat is a no-op."""
    kind = db_text(payload.get("kind") or "")[:_EVENT_TEXT_CHARS]
    data = _event_data(payload)
    if len(message_id) > MAX_MESSAGE_ID_CHARS:
        # The stored id is what makes a repeat a no-op: a longer one could not be matched when it came again.
        return Outcome(False, f"a message id is at most {MAX_MESSAGE_ID_CHARS} characters")
    with transaction.atomic():
        node = Node.objects.get(pk=node_id)
        if kind == "prevented_neighbour_interference":
            job = _event_job(node=node, payload=payload, kind="interference", lock=True)
            if isinstance(job, Outcome):
                return job
            attempt = job.attempt
            if job.state not in ACTIVE_STATES:
                return Outcome(
                    False, f"job {job.pk} has ended ({job.state}): no more events about it", stale=True
                )
            if (
                message_id
                and JobEvent.objects.filter(job=job, code=kind, data__message_id=message_id).exists()
            ):
                return Outcome(True)  # already recorded: a repeat
            JobEvent.objects.create(
                job=job,
                from_state=job.state,
                to_state=job.state,
                actor_kind=ActorKind.AGENT,
                code=kind,
                message=(
                    f"Used {data.get('used_mib')} MiB on {node.name} against a {data.get('limit_mib')} MiB "
                    "slice: stopped before it could push its neighbours out of memory."
                ),
                data={**data, "node": node.name, "attempt": attempt, "message_id": message_id},
            )
            return Outcome(True, changed=True)
        if kind == "ports":  # where a job's web ports listen, and which answer (scheduling/jobs/sessions.py)
            job = _event_job(node=node, payload=payload, kind="ports")
            if isinstance(job, Outcome):
                return job
            changed = session_ports_record(job=job, node_name=node.name, attempt=job.attempt, payload=payload)
            return Outcome(True, changed=changed)
        if kind == "image_ready":  # a job's image present on its node: the pull's time on its timeline
            return _image_ready(node=node, payload=payload, message_id=message_id)
        if kind == "gpu_health":
            health = _HEALTH.get(str(payload.get("health")), GpuHealth.DEGRADED)
            if health != GpuHealth.OK:
                gpu = Gpu.objects.filter(node=node, uuid=data.get("gpu_uuid")).values_list("index", flat=True)
                which = f"GPU {gpu[0]}" if gpu else f"GPU {data.get('gpu_uuid')}"
                xids = payload.get("xid_events")
                detail = f": {data['detail']}" if data.get("detail") else ""
                if not detail and isinstance(xids, list) and xids:
                    detail = f" (XID {', '.join(db_text(x)[:20] for x in xids[:5])})"
                node_error_note(
                    node_id=node.pk,
                    message=f"{which} reported {health}{detail}",
                    kind=NodeErrorKind.GPU_HEALTH,
                )
            updated = Gpu.objects.filter(node=node, uuid=data.get("gpu_uuid")).exclude(health=health)
            changed = updated.update(health=health)
            if health == GpuHealth.OK and not Gpu.objects.filter(node=node).exclude(health=health).exists():
                node_error_clear(node_id=node.pk, kinds=(NodeErrorKind.GPU_HEALTH,))
            if changed:
                events.publish_after_commit(
                    groups.CLUSTER,
                    {
                        "type": "gpu.health",
                        "node": node.name,
                        "uuid": data.get("gpu_uuid"),
                        "health": health,
                    },
                )
                cycle_request_after_commit()
            return Outcome(True, changed=True)
        if kind == "mps_unavailable":
            simulated = payload.get("simulated") is True
            if not simulated:  # a simulated node has no MPS daemon by design: not an error of the node's
                detail = f": {data['detail']}" if data.get("detail") else ""
                node_error_note(node_id=node.pk, message=f"MPS unavailable{detail}", kind=NodeErrorKind.MPS)
            _log_mps_unavailable(node=node.name, detail=data.get("detail", ""), simulated=simulated)
            return Outcome(True)
        log.info("node %s event %s: %s", node.name, kind, data, extra={"node": node.name})
        return Outcome(True)


def _image_ready(*, node: Node, payload: dict[str, Any], message_id: str) -> Outcome:
    """The job's image is on its node (pulled, or there already): recorded once on the job's timeline."""
    try:
        pull_s = round(float(payload.get("pull_s") or 0.0), 1)
    except (TypeError, ValueError):
        pull_s = math.nan
    if not 0 <= pull_s < MAX_PULL_S:  # NaN and the infinities fail too: no JSON column holds them
        return Outcome(False, f"an image_ready event's pull_s is seconds from 0 to {MAX_PULL_S:.0f}")
    job = _event_job(node=node, payload=payload, kind="image_ready", lock=True)
    if isinstance(job, Outcome):
        return job
    attempt = job.attempt
    if JobEvent.objects.filter(job=job, code="image_ready", data__attempt=attempt).exists():
        return Outcome(True)  # already recorded: a repeat
    pulled = payload.get("pulled") is True
    JobEvent.objects.create(
        job=job,
        from_state=job.state,
        to_state=job.state,
        actor_kind=ActorKind.AGENT,
        code="image_ready",
        message=f"Image {job.image} pulled on {node.name} in {pull_s:g} s."
        if pulled
        else f"Image {job.image} was already on {node.name}.",
        data={
            "node": node.name,
            "attempt": attempt,
            "pull_s": pull_s,
            "pulled": pulled,
            "message_id": message_id,
        },
    )
    return Outcome(True, changed=True)


_simulated_mps_said = False


def _log_mps_unavailable(*, node: str, detail: str, simulated: bool) -> None:
    """A real node whose MPS slices are not limited is worth a warning each; simulated nodes (the demo's) have no
    MPS daemon by design, which this process says once."""
    global _simulated_mps_said
    if not simulated:
        log.warning("node %s: %s", node, detail, extra={"node": node})
    elif not _simulated_mps_said:
        _simulated_mps_said = True
        log.info(
            "simulated nodes (%s first) run MPS slices without nvidia-cuda-mps-control: their limits are not "
            "enforced, as expected off a GPU host",
            node,
            extra={"node": node},
        )
