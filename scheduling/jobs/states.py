"""The job state machine: every legal transition, in one place.

pending -> placed -> starting -> running -> succeeded | failed; cancelled from any live state; preempted and lost
are stops on the way back to pending (a requeue keeps the original submit time).
"""

from scheduling.choices import JobState as S

TRANSITIONS: dict[str, frozenset[str]] = {
    S.PENDING: frozenset({S.PLACED, S.CANCELLED, S.FAILED}),
    S.PLACED: frozenset({S.STARTING, S.RUNNING, S.PENDING, S.CANCELLED, S.PREEMPTED, S.LOST, S.FAILED}),
    S.STARTING: frozenset({S.RUNNING, S.SUCCEEDED, S.FAILED, S.CANCELLED, S.PREEMPTED, S.LOST}),
    S.RUNNING: frozenset({S.SUCCEEDED, S.FAILED, S.CANCELLED, S.PREEMPTED, S.LOST}),
    S.PREEMPTED: frozenset({S.PENDING, S.CANCELLED, S.FAILED}),
    S.LOST: frozenset({S.PENDING, S.FAILED, S.CANCELLED}),
    S.SUCCEEDED: frozenset(),
    S.FAILED: frozenset(),
    S.CANCELLED: frozenset(),
}

ACTIVE_STATES = frozenset({S.PLACED, S.STARTING, S.RUNNING})  # hold GPU slices
LIVE_STATES = frozenset({S.PENDING, S.PLACED, S.STARTING, S.RUNNING, S.PREEMPTED, S.LOST})
TERMINAL_STATES = frozenset({S.SUCCEEDED, S.FAILED, S.CANCELLED})


class IllegalTransition(Exception):
    def __init__(self, job_id: object, from_state: str, to_state: str, message: str | None = None):
        allowed = ", ".join(sorted(TRANSITIONS.get(from_state, ()))) or "none: it is final"
        super().__init__(
            message
            or f"Job {job_id} cannot go from {from_state} to {to_state}; from {from_state} it may go to: {allowed}."
        )
        self.from_state = from_state
        self.to_state = to_state


def check_transition(*, job_id: object, from_state: str, to_state: str) -> None:
    if to_state not in TRANSITIONS.get(from_state, frozenset()):
        raise IllegalTransition(job_id, from_state, to_state)
