"""How the portal writes the engine's words about jobs: the engine names a job by its id ("job 12"), the portal
as "#12" (events, the cluster page)."""

from __future__ import annotations


def job_ref(text: str) -> str:
    """`text` with a trailing "job 12" written "job #12"."""
    head, sep, job_id = text.rpartition(" job ")
    return f"{head} job #{job_id}" if sep and job_id.isdigit() else text
