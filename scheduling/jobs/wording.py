"""How the portal writes the engine's words about jobs: the engine names a job by its id ("job 12"), the portal
as "#12" (events, the cluster page); and how a job stopped by one of its limits is said."""

from __future__ import annotations


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
