"""The channel-layer groups events go to, named in one place.

`cluster`: everyone's anonymous view (queue moved, node state, GPU samples); `team-<id>`: a team's jobs in full;
`job-<id>`: one job's changes, metrics and logs; `node-<name>`: the agent of that node.
"""

from __future__ import annotations

CLUSTER = "cluster"


def team(team_id: int) -> str:
    return f"team-{team_id}"


def job(job_id: int) -> str:
    return f"job-{job_id}"


def node(node_name: str) -> str:
    return f"node-{node_name}"


def for_browsers(group: str) -> bool:
    """One of the groups browser streams join (realtime/listeners.py records who is in them)."""
    return group == CLUSTER or group.startswith(("team-", "job-"))
