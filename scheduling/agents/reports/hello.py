"""An agent's hello: the inventory it sees reconciled with the database's, and the address its peers reach it at."""

from __future__ import annotations

import logging
import re
from typing import Any

from django.db import transaction
from django.utils import timezone

from scheduling import lock_objects
from scheduling.agents.reports.nodes import NodeErrorKind, node_error_clear, node_error_note, node_revive
from scheduling.choices import GpuHealth
from scheduling.cycle.models import NodeSync
from scheduling.cycle.requests import cycle_request_after_commit
from scheduling.inventory.models import Gpu

log = logging.getLogger(__name__)


_ADDRESS = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:%-]{0,252}")


def node_hello(*, node_id: int, payload: dict[str, Any]) -> dict[str, Any]:
    """Reconcile the inventory the agent sees with the database's, and take the address it reports (where its
    peers reach it); returns what differed."""
    inventory = payload.get("inventory") or {}
    reported = {int(g["index"]): g for g in inventory.get("gpus") or [] if "index" in g}
    report: dict[str, Any] = {"uuid_updated": [], "missing": [], "unregistered": [], "memory_mismatch": []}
    with transaction.atomic():
        node = lock_objects.nodes_for_update(ids=[node_id]).get()
        for gpu in Gpu.objects.filter(node=node).order_by("index"):
            seen = reported.pop(gpu.index, None)
            fields = []
            if seen is None:
                if gpu.health != GpuHealth.FAILED:
                    gpu.health = GpuHealth.FAILED
                    fields.append("health")
                report["missing"].append(gpu.index)
            else:
                uuid = str(seen.get("uuid") or "")
                if (
                    uuid
                    and uuid != gpu.uuid
                    and not Gpu.objects.filter(uuid=uuid).exclude(pk=gpu.pk).exists()
                ):
                    gpu.uuid = uuid
                    fields.append("uuid")
                    report["uuid_updated"].append(gpu.index)
                if gpu.health == GpuHealth.FAILED:
                    gpu.health = GpuHealth.OK  # present again; later samples report its health
                    fields.append("health")
                total = seen.get("memory_total_mib")
                if total is not None and int(total) < gpu.memory_mib:
                    report["memory_mismatch"].append([gpu.index, int(total), gpu.memory_mib])
            if fields:
                gpu.save(update_fields=fields)
        report["unregistered"] = sorted(reported)
        node.last_heartbeat_at = timezone.now()
        fields = ["last_heartbeat_at"]
        address = payload.get("address")
        if isinstance(address, str) and address:
            if _ADDRESS.fullmatch(address) and address != node.address:
                node.address = address
                fields.append("address")
                report["address"] = address
            elif not _ADDRESS.fullmatch(address):
                report["address_refused"] = address[:100]
        node.save(update_fields=fields)
        node_revive(node)
        sync, _ = NodeSync.objects.get_or_create(node=node)
        sync.agent_version = str(payload.get("agent_version") or "")[:50]
        sync.inventory = {**inventory, "capabilities": payload.get("capabilities") or {}, "reconcile": report}
        sync.connected_at = timezone.now()
        sync.save(update_fields=["agent_version", "inventory", "connected_at"])
        if report["missing"] or report["uuid_updated"]:
            cycle_request_after_commit()
        # A new connection: refusals of the last one are in the past; MPS trouble too once the agent has the
        # control daemon's binary (it says "mps_unavailable" once per run, so without it the error stays).
        cleared = (NodeErrorKind.REFUSED,)
        if (payload.get("capabilities") or {}).get("mps") is True:
            cleared += (NodeErrorKind.MPS,)
        if report["missing"]:
            missing = ", ".join(str(i) for i in report["missing"])
            node_error_note(
                node_id=node.pk,
                message=f"GPU(s) {missing} missing from the agent's inventory.",
                kind=NodeErrorKind.GPU_MISSING,
            )
        else:
            cleared += (NodeErrorKind.GPU_MISSING,)
        node_error_clear(node_id=node.pk, kinds=cleared)
    if any(report.values()):
        log.info("node %s inventory reconciled: %s", node.name, report)
    return report
