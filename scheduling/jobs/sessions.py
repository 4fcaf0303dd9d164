"""Interactive sessions: a job's web ports (a notebook, a dashboard), opened through the portal's proxy at
/jobs/<id>/open/<name>/ (frontend/sessions.py).

A job asks for ports by name (`ports: [{name: jupyter, port: 8888}]`). Its agent gives it each port, or another
one where the node's is taken, as TESSERA_PORT_<NAME>, and reports where each went and when it first answered (an
event of kind `ports`, recorded by `session_ports_record`). Who may open it is decided here once
(`session_job_for`): its submitter, and its team's members when the submitter shares it. Everyone else, staff
too, is told there is no such page: opening a session is running code as its owner.
"""

from __future__ import annotations

import ipaddress
import logging
import re
import socket
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction

from quotas.selectors import team_ids_for_user
from scheduling.choices import ActorKind, JobState
from scheduling.errors import ServiceError
from scheduling.inventory.models import Node
from scheduling.jobs.fields import MAX_PORT, MIN_PORT, PORT_NAME
from scheduling.jobs.models import Job
from scheduling.jobs.notes import job_note, job_told

log = logging.getLogger(__name__)

_NOT_STARTED = (JobState.PENDING, JobState.PLACED, JobState.STARTING)

__all__ = [
    "SessionLink",
    "SessionTarget",
    "job_sessions_for",
    "session_job_for",
    "session_links",
    "session_path",
    "session_ports_record",
    "session_share",
    "session_target",
]


def session_path(job_id: int, name: str) -> str:
    """Where the portal serves a job's port: the server's base URL (Jupyter's base_url, TensorBoard's path_prefix)."""
    return f"/jobs/{job_id}/open/{name}/"


def _may_open(user: AbstractBaseUser, job: Job) -> bool:
    """The one rule: its submitter, and its team's members once the submitter shares it."""
    if not user.is_authenticated:
        return False
    if job.submitter_id == user.pk:
        return True
    return job.session_shared and job.team_id in team_ids_for_user(user=user)


def session_job_for(*, user: AbstractBaseUser, job_id: int, name: str) -> Job | None:
    """The job whose port `name` this user may open: theirs, or their team's when shared. None: a 404."""
    if not user.is_authenticated:
        return None
    job = Job.objects.select_related("team").filter(pk=job_id).first()
    if job is None or name not in {str(n) for n, _ in job.ports or ()}:
        return None
    return job if _may_open(user, job) else None


@dataclass(frozen=True)
class SessionTarget:
    """Where the proxy goes for a port, or why it cannot (`unavailable`, in words for the user)."""

    address: str = ""
    port: int = 0
    token: str = ""
    ready: bool = False
    unavailable: str = ""
    ended: bool = False
    unreachable: bool = False  # the node's address is not one sessions may use: a site's setting, not a wait


def session_target(*, job: Job, name: str) -> SessionTarget:
    """Where the job's port `name` is now: the node its current attempt runs on and the port its agent gave."""
    if job.state != JobState.RUNNING:
        if job.state in _NOT_STARTED:
            return SessionTarget(unavailable=f"Job {job.pk} has not started yet ({job.state}).")
        return SessionTarget(
            unavailable=f"Job {job.pk} has ended ({job.state}): its {name} is gone.", ended=True
        )
    bound = job.ports_bound or {}
    port = (bound.get("ports") or {}).get(name)
    if bound.get("attempt") != job.attempt or port is None:
        return SessionTarget(
            unavailable=f"Job {job.pk} is starting: its node has not said where {name} listens."
        )
    node = Node.objects.filter(name=bound.get("node")).first()
    if node is None:
        return SessionTarget(unavailable=f"Job {job.pk}'s node is no longer known.")
    address, refused = _node_address(node.reachable_address)
    if refused:
        log.warning(
            "session %s/%s: node %s's address %s refused: %s", job.pk, name, node.name, address, refused
        )
        return SessionTarget(
            unavailable=f"Job {job.pk}'s node {node.name} is not at an address sessions may use ({refused}): "
            'an administrator sets where sessions may go (docs/operations.md, "Sessions").',
            unreachable=True,
        )
    return SessionTarget(
        address=address,
        port=int(port),
        token=job.session_token,
        ready=name in (bound.get("ready") or ()),
    )


def _node_address(address: str) -> tuple[str, str]:
    """The IP address the proxy connects to for a node's address (resolved once here, so what is checked is what
    is reached), and why it may not, if it may not (settings.TESSERA_SESSION_NETWORKS)."""
    try:
        ip = ipaddress.ip_address(socket.getaddrinfo(address, None, proto=socket.IPPROTO_TCP)[0][4][0])
    except (OSError, ValueError, IndexError):
        return address, "it does not resolve"
    if ip.version == 6 and ip.ipv4_mapped:
        ip = ip.ipv4_mapped
    networks = [ipaddress.ip_network(n, strict=False) for n in settings.TESSERA_SESSION_NETWORKS]
    if networks:
        return str(ip), "" if any(ip in n for n in networks) else "outside TESSERA_SESSION_NETWORKS"
    if ip.is_loopback:
        allowed = settings.TESSERA_SESSION_ALLOW_LOOPBACK
        return str(ip), "" if allowed else "loopback (TESSERA_SESSION_ALLOW_LOOPBACK)"
    if ip.is_link_local or ip.is_multicast or ip.is_unspecified or ip.is_reserved:
        return str(ip), "link-local, multicast, unspecified or reserved"
    return str(ip), ""


def _ports_reported(payload: dict[str, Any], asked: set[str]) -> tuple[dict[str, int], list[str]]:
    """The ports an agent reported, for the names the job asked for, as numbers in range; and which answer."""
    raw = payload.get("ports")
    ports: dict[str, int] = {}
    if isinstance(raw, dict):
        for name, port in raw.items():
            if (
                name in asked
                and isinstance(port, int)
                and not isinstance(port, bool)
                and MIN_PORT <= port <= MAX_PORT
                and re.fullmatch(PORT_NAME, name)
            ):
                ports[name] = port
    ready = payload.get("ready")
    ready_names = (
        sorted({r for r in ready if isinstance(r, str) and r in ports}) if isinstance(ready, list) else []
    )
    return ports, ready_names


@transaction.atomic
def session_ports_record(*, job: Job, node_name: str, attempt: int, payload: dict[str, Any]) -> bool:
    """An agent's word on where the job's ports listen and which answer (the caller has checked that this
    attempt is placed on that node). Whether anything changed; the job's page is told after commit."""
    job = Job.objects.select_for_update().get(pk=job.pk)
    if attempt != job.attempt or job.state not in (JobState.PLACED, JobState.STARTING, JobState.RUNNING):
        return False
    ports, ready = _ports_reported(payload, {str(n) for n, _ in job.ports or ()})
    bound = {"attempt": attempt, "node": node_name, "ports": ports, "ready": ready}
    if bound == job.ports_bound:
        return False
    before = job.ports_bound or {}
    newly_ready = set(ready) - set(before.get("ready") or () if before.get("attempt") == attempt else ())
    job.ports_bound = bound
    job.save(update_fields=["ports_bound"])
    for name in sorted(newly_ready):
        job_note(
            job=job,
            code="port_ready",
            message=f"{name} answers on {node_name} (port {ports[name]}): open it from the job's page.",
            actor_kind=ActorKind.AGENT,
            data={"name": name, "node": node_name, "port": ports[name], "attempt": attempt},
        )
    if not newly_ready:
        job_told(job, "ports")
    return True


@transaction.atomic
def session_share(*, user: AbstractBaseUser, job_id: int, shared: bool) -> Job:
    """The submitter lets the job's team open its ports too, or stops letting them."""
    job = Job.objects.select_for_update().filter(pk=job_id, submitter_id=user.pk).first()
    if job is None:
        raise ServiceError("Only the job's submitter may share its sessions.", code="not_found")
    if not job.ports:
        raise ServiceError(f"Job {job_id} serves no web ports.", field="ports", code="no_ports")
    if job.session_shared != shared:
        job.session_shared = shared
        job.save(update_fields=["session_shared"])
        job_told(job, "session_shared")
    return job


@dataclass(frozen=True)
class SessionLink:
    """One web port of a job as its page shows it to someone who may open it."""

    name: str
    path: str
    state: str  # ready | starting (its server not answering yet) | waiting (the job not running) | ended


def session_links(job: Job) -> list[SessionLink]:
    """Each of the job's web ports and where it stands (the API's `ports`; whoever may see the job)."""
    bound = job.ports_bound if (job.ports_bound or {}).get("attempt") == job.attempt else {}
    links = []
    for name, _ in job.ports or ():
        if job.state == JobState.RUNNING:
            state = "ready" if name in (bound.get("ready") or ()) else "starting"
        elif job.state in _NOT_STARTED:
            state = "waiting"
        else:
            state = "ended"
        links.append(SessionLink(name=str(name), path=session_path(job.pk, str(name)), state=state))
    return links


def job_sessions_for(*, user: AbstractBaseUser, job: Job) -> list[SessionLink]:
    """The job's web ports this user may open, each with where it stands (none for anyone else)."""
    return session_links(job) if job.ports and _may_open(user, job) else []
