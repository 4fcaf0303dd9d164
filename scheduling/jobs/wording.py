"""How the portal writes the engine's words about jobs: the engine names a job by its id ("job 12"), the portal
as "#12" (events, the cluster page); how a job stopped by one of its limits is said; and why a job waits in words
that say nothing of its team."""

from __future__ import annotations

from scheduling.cycle.liveness import SCHEDULER_STALLED
from scheduling.engine.reasons import CODES


def job_ref(text: str) -> str:
    """`text` with a trailing "job 12" written "job #12"."""
    head, sep, job_id = text.rpartition(" job ")
    return f"{head} job #{job_id}" if sep and job_id.isdigit() else text


# A job ended by one of its limits, enforced on its node: its failed event's code and what it says. Its exit code
# is the signal that ended it, not an answer of the job's.
LIMIT_STOPS = {
    "max_runtime": "Stopped: it ran longer than its max runtime.",
    "memory_slice_exceeded": "Stopped: it used more GPU memory than its slice (protecting its neighbours).",
    "host_memory_exceeded": "Killed: it used more host memory than it asked for (memory_mib).",
}

# Each pending reason code's general sentence (docs/engine.md lists them): what another team sees of why a job
# waits. Its own reason text names nodes, jobs and sizes, which other teams do not see; the code alone is a word
# for machines.
_IN_GENERAL = {
    **CODES,
    SCHEDULER_STALLED: "the scheduler is not running: no job starts until it is back",
    "": "waiting for the next scheduling cycle",
}


def reason_in_general(code: str | None) -> str:
    """Why a job waits, from its reason code alone ("insufficient-gpus" -> "no node has enough free whole GPUs")."""
    return _IN_GENERAL.get(code or "", "waiting for its turn in the queue")
