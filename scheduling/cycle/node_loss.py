"""How long a silent node's jobs keep running, and when the portal may place them elsewhere: the one rule that
keeps a placement from running twice.

Each job's supervisor on its node stops the job once the portal has not acknowledged a heartbeat from the node's
agent for `fence_after_s` (the agent died, or lost the portal), giving it its preemption grace. So from the
node's last recorded heartbeat, the job has surely ended after fence + grace; the margin covers the agent's tick
and the supervisor's poll. The portal re-places (or fails, or finishes cancelling) a lost node's job only after
that deadline (docs/operations.md, "Failures").
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings


def fence_after_s() -> float:
    """How long a job runs on with its node unheard, the value each placement carries to its supervisor."""
    return float(settings.TESSERA_AGENT_FENCE_AFTER_S)


def surely_stopped_at(*, last_heard_at: datetime, grace_s: float) -> datetime:
    """When a job on a node last heard at `last_heard_at` has surely been stopped by its supervisor."""
    return last_heard_at + timedelta(
        seconds=fence_after_s() + max(0.0, grace_s) + settings.TESSERA_FENCE_MARGIN_S
    )
