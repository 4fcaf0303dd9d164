"""The node's desired state as its connection sends it (`DesiredStateOut`): read from the database after the
agent's hello and when a heartbeat shows it missed one, forwarded as the cycle pushed it otherwise.

One state is computed and sent at a time, in version order. What the connection keeps of the state it sent:
its version, the placements (whose logs it pulls) and which jobs hold each card (whose followers get its
samples).
"""

from __future__ import annotations

import asyncio
from typing import Any

from agent import protocol
from scheduling.agents.socket.db_threads import db
from scheduling.agents.socket.link import NodeLink
from scheduling.cycle.desired_state import DesiredState, desired_state_for_node
from scheduling.inventory.models import Node
from scheduling.jobs.selectors import job_team_ids


def read_desired(node_id: int) -> tuple[DesiredState, dict[int, int]]:
    """The node's desired state and the team of each of its jobs (for routing their metrics)."""
    state, _ = desired_state_for_node(node=Node.objects.get(pk=node_id))
    return state, job_team_ids(job_ids=[int(j["job_id"]) for j in state.jobs])


class DesiredStateOut:
    def __init__(self, link: NodeLink) -> None:
        self.link = link
        self.after_hello = False  # the whole state follows the agent's hello (its GPUs reconciled first)
        self.lock = asyncio.Lock()
        self.sent_version: int | None = None
        self.placements: set[tuple[int, int]] = set()  # (job, attempt) of the state last sent
        self.job_gpus: dict[str, list[tuple[int, int]]] = {}  # gpu uuid -> [(job id, team id)]
        self.stale = False  # a notice came since the read in flight began
        # (version the agent holds, version sent, version in the database) as the last heartbeat found them, when
        # they disagreed: the next heartbeat finding the same resends the state (handlers.on_heartbeat).
        self.doubted: tuple[int | None, int | None, int | None] | None = None

    async def send(self, *, force: bool = False) -> None:
        """Read the node's state and send it, unless it is the version sent last (`force`: send it anyway)."""
        async with self.lock:
            state, teams = await db(read_desired)(self.link.node_id)
            if not force and state.version == self.sent_version:
                return
            await self._send(state, teams)

    async def notice(self, event: dict[str, Any]) -> None:
        """A `desired.changed` message from the node's group: the state itself (the cycle's sync computed it),
        or a notice that it changed."""
        if not self.after_hello or self.link.closing:
            return
        pushed = event.get("state")
        if pushed is None:
            # Read back beside the connection's other work, never in the dispatch of the layer's messages: a wave
            # of job ends is a notice each, and each read waiting its turn held up this process's inbox behind
            # it. Notices arriving while a read is under way are one more read, not one each.
            self.stale = True
            self.link.beside_once("refresh", self._refresh, "desired state")
            return
        if self.lock.locked():
            # A read of the state is under way (a hello's, a heartbeat's resend): sent once it is done, beside the
            # dispatch, which meanwhile goes on reading the node's frames (its heartbeats among them).
            self.link.beside(self._push(pushed), "desired state")
            return
        await self._push(pushed)

    async def _push(self, pushed: dict[str, Any]) -> None:
        """The state as the cycle's sync computed it: sent as it is, unless this connection sent a newer one
        already (so pushes sent beside the dispatch may arrive in any order)."""
        async with self.lock:
            if self.sent_version is not None and pushed["version"] <= self.sent_version:
                return
            state = DesiredState(
                node=self.link.node_name, version=pushed["version"], jobs=tuple(pushed["jobs"])
            )
            await self._send(state, {int(k): v for k, v in pushed["teams"].items()})

    async def _refresh(self) -> None:
        while self.stale and not self.link.closing:
            self.stale = False
            await self.send()

    async def _send(self, state: DesiredState, teams: dict[int, int]) -> None:
        self.sent_version = state.version
        self.placements = {(int(j["job_id"]), int(j["attempt"])) for j in state.jobs}
        self.job_gpus = {}
        for j in state.jobs:
            for g in j["gpus"]:
                self.job_gpus.setdefault(g["uuid"], []).append(
                    (int(j["job_id"]), teams.get(int(j["job_id"]), 0))
                )
        payload = state.message()
        payload.pop("type")
        await self.link.send_msg(protocol.message("desired_state", payload))
