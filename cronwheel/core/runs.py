"""The run: its states and who moves a run into and out of each.

The database mirrors this with the `run_state` enum and the constraint
`finished_iff_terminal` (a run is terminal exactly when `finished_at` is set).
"""

from __future__ import annotations

import enum


class RunState(enum.StrEnum):
    # Created by the timer (a job's instant), a manual trigger, or the workflow
    # service (a node whose dependencies all succeeded); also entered from
    # RETRY_WAIT when the backoff timer fires. Left by StartRun (-> RUNNING) or
    # a cancel (-> CANCELLED).
    PENDING = "PENDING"
    # Entered by StartRun (one worker wins, gets attempt + start_token + lease).
    # Left by CompleteRun, by the lease or timeout timer (-> TIMED_OUT or
    # RETRY_WAIT), or by a cancel.
    RUNNING = "RUNNING"
    # Entered when an attempt failed retryably with attempts left; the retry
    # timer moves it back to PENDING with attempt + 1.
    RETRY_WAIT = "RETRY_WAIT"
    # Terminal states: never left again.
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    TIMED_OUT = "TIMED_OUT"
    CANCELLED = "CANCELLED"
    # A workflow node below a failed node; never ran.
    SKIPPED = "SKIPPED"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


TERMINAL = frozenset(
    {RunState.SUCCEEDED, RunState.FAILED, RunState.TIMED_OUT, RunState.CANCELLED, RunState.SKIPPED}
)
ACTIVE = frozenset({RunState.PENDING, RunState.RUNNING, RunState.RETRY_WAIT})

PRIORITIES = ("critical", "high", "normal", "low")
PRIORITY_RANK = {name: rank for rank, name in enumerate(PRIORITIES)}
NORMAL_RANK = PRIORITY_RANK["normal"]


def priority_rank(name: str | None) -> int:
    """A class's rank (0 critical .. 3 low); an unknown or missing class counts
    as normal (docs/events.md), so a newer producer cannot stall an older reader."""
    return PRIORITY_RANK.get(name, NORMAL_RANK)
