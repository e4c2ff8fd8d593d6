"""The run: its states and who moves a run into and out of each.

The database mirrors this with the `run_state` enum and the constraint
`finished_iff_terminal` (a run is terminal exactly when `finished_at` is set).
"""

from __future__ import annotations

import enum
import random
from collections.abc import Mapping
from dataclasses import dataclass


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


# -- how an attempt ends: the one place the retry rule is written ---------------


class Outcome(enum.StrEnum):
    """How an attempt ended: the worker's report (CompleteRun), its lease or
    timeout timer, or a cancel."""

    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    TIMED_OUT = "TIMED_OUT"
    CANCELLED = "CANCELLED"


@dataclass(frozen=True)
class RetryPolicy:
    """A run's retry policy, as its spec snapshot holds it (core.jobs.Retry)."""

    max_attempts: int
    initial_backoff_ms: int
    max_backoff_ms: int
    multiplier: float

    @classmethod
    def of(cls, spec_retry: Mapping) -> RetryPolicy:
        return cls(
            max_attempts=spec_retry["max_attempts"],
            initial_backoff_ms=spec_retry["initial_backoff_ms"],
            max_backoff_ms=spec_retry["max_backoff_ms"],
            multiplier=spec_retry["multiplier"],
        )

    def backoff_ms(self, attempt: int, rng: random.Random | None = None) -> int:
        """The wait after `attempt` failed: exponential, capped, with equal jitter
        (half fixed, half random), so the retries of a herd spread out but none
        comes back before half its delay."""
        delay = min(self.max_backoff_ms, self.initial_backoff_ms * self.multiplier ** (attempt - 1))
        return int(delay / 2 + (rng or random).random() * delay / 2)


@dataclass(frozen=True)
class Decision:
    """Where an ended attempt leaves its run: `state`, and for RETRY_WAIT when
    the retry timer brings it back (`retry_at_ms`, else None)."""

    state: RunState
    retry_at_ms: int | None = None

    @property
    def terminal(self) -> bool:
        return self.state.terminal


def needs_policy(outcome: str, retryable: bool) -> bool:
    """Whether decide() needs the run's retry policy: only a retryable failure
    or expiry depends on the attempts left."""
    return retryable and outcome in (Outcome.FAILED, Outcome.TIMED_OUT)


def decide(
    outcome: Outcome,
    retryable: bool,
    attempt: int,
    policy: RetryPolicy | None,
    now_ms: int,
    rng: random.Random | None = None,
) -> Decision:
    """The run's next state once `attempt` ended with `outcome`.

    A success succeeds and a cancel cancels, whatever is left. A failure the
    worker calls retryable, or an expired lease or timeout (always retryable),
    waits for a retry while attempts are left (`attempt < max_attempts`), due
    after the policy's backoff; otherwise the run ends FAILED or TIMED_OUT.
    `policy` may be None where needs_policy() says it is not read. The store
    applies the result in one statement conditional on the run still being
    where it was found."""
    if outcome == Outcome.SUCCEEDED:
        return Decision(RunState.SUCCEEDED)
    if outcome == Outcome.CANCELLED:
        return Decision(RunState.CANCELLED)
    if needs_policy(outcome, retryable):
        if policy is None:
            raise ValueError(f"a retryable {outcome} needs the run's retry policy")
        if attempt < policy.max_attempts:
            return Decision(RunState.RETRY_WAIT, now_ms + policy.backoff_ms(attempt, rng))
    return Decision(RunState.FAILED if outcome == Outcome.FAILED else RunState.TIMED_OUT)
