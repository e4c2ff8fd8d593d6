"""cronwheel.core.runs.decide: where an ended attempt leaves its run, the one
place the retry rule is written (CompleteRun, lease and timeout expiry, cancels
all pass its answer to the store).

The schedule is the one the SQL decided before (issue 22): retry while
`attempt < max_attempts` for a retryable failure or an expiry, each backoff
`min(max, initial * multiplier ** (attempt - 1))` with equal jitter.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cronwheel.core.jobs import Retry
from cronwheel.core.runs import (
    Decision,
    Outcome,
    RetryPolicy,
    RunState,
    decide,
    needs_policy,
)

NOW = 1_900_000_000_000
POLICY = RetryPolicy(max_attempts=3, initial_backoff_ms=1000, max_backoff_ms=60_000, multiplier=2)


class Fixed(random.Random):
    """A generator whose every draw is `x`."""

    def __init__(self, x: float):
        super().__init__()
        self.x = x

    def random(self) -> float:
        return self.x


policies = st.builds(
    RetryPolicy,
    max_attempts=st.integers(1, 100),
    initial_backoff_ms=st.integers(0, 86_400_000),
    max_backoff_ms=st.integers(0, 86_400_000),
    multiplier=st.floats(1.0, 10.0),
)
attempts = st.integers(1, 120)


def test_decide__success__succeeds_whatever_is_left():
    assert decide(Outcome.SUCCEEDED, True, 1, POLICY, NOW) == Decision(RunState.SUCCEEDED)
    assert decide(Outcome.SUCCEEDED, False, 3, None, NOW) == Decision(RunState.SUCCEEDED)


def test_decide__retryable_failure_with_attempts_left__waits_for_its_backoff():
    d = decide(Outcome.FAILED, True, 1, POLICY, NOW, Fixed(0.0))
    assert d == Decision(RunState.RETRY_WAIT, NOW + 500)
    assert not d.terminal


def test_decide__retryable_failure_on_the_last_attempt__fails():
    assert decide(Outcome.FAILED, True, 3, POLICY, NOW) == Decision(RunState.FAILED)


def test_decide__failure_not_retryable__fails_without_reading_the_policy():
    assert not needs_policy(Outcome.FAILED, False)
    assert decide(Outcome.FAILED, False, 1, None, NOW) == Decision(RunState.FAILED)


def test_decide__expiry__retried_while_attempts_left_then_timed_out():
    assert decide(Outcome.TIMED_OUT, True, 2, POLICY, NOW).state == RunState.RETRY_WAIT
    assert decide(Outcome.TIMED_OUT, True, 3, POLICY, NOW) == Decision(RunState.TIMED_OUT)


def test_decide__cancel__cancels_at_any_attempt():
    assert decide(Outcome.CANCELLED, False, 7, None, NOW) == Decision(RunState.CANCELLED)


def test_decide__retryable_failure_without_a_policy__refused():
    with pytest.raises(ValueError):
        decide(Outcome.FAILED, True, 1, None, NOW)


@pytest.mark.parametrize(
    ("attempt", "least", "most"),
    [(1, 500, 1000), (2, 1000, 2000), (3, 2000, 4000), (7, 30_000, 60_000), (30, 30_000, 60_000)],
)
def test_backoff__doubles_from_the_initial_delay_up_to_the_cap(attempt, least, most):
    assert POLICY.backoff_ms(attempt, Fixed(0.0)) == least
    assert POLICY.backoff_ms(attempt, Fixed(0.999999)) in range(most - 1, most + 1)


def test_policy_of__reads_the_spec_snapshot_a_job_writes():
    spec_retry = {
        "max_attempts": 5,
        "initial_backoff_ms": 0,
        "max_backoff_ms": 10,
        "multiplier": 1.5,
    }
    assert RetryPolicy.of(spec_retry) == RetryPolicy(5, 0, 10, 1.5)
    assert RetryPolicy.of(Retry().__dict__) == RetryPolicy(3, 1000, 60_000, 2.0)


@given(
    outcome=st.sampled_from(list(Outcome)),
    retryable=st.booleans(),
    attempt=attempts,
    policy=policies,
    draw=st.floats(0.0, 0.999999),
)
def test_decide__property__the_rule_the_sql_used_to_write(
    outcome, retryable, attempt, policy, draw
):
    """The three SQL copies said: SUCCEEDED stays SUCCEEDED; FAILED (retryable)
    and an expiry go to RETRY_WAIT while attempt < max_attempts, else FAILED /
    TIMED_OUT; a cancel cancels. A retry is due after between half and all of
    min(max, initial * multiplier ** (attempt - 1))."""
    retryable = retryable or outcome == Outcome.TIMED_OUT  # an expiry is always retryable
    d = decide(outcome, retryable, attempt, policy, NOW, Fixed(draw))
    retries = outcome in (Outcome.FAILED, Outcome.TIMED_OUT) and retryable
    if outcome == Outcome.SUCCEEDED:
        assert d == Decision(RunState.SUCCEEDED)
    elif outcome == Outcome.CANCELLED:
        assert d == Decision(RunState.CANCELLED)
    elif retries and attempt < policy.max_attempts:
        delay = min(
            policy.max_backoff_ms, policy.initial_backoff_ms * policy.multiplier ** (attempt - 1)
        )
        assert d.state == RunState.RETRY_WAIT
        assert NOW + int(delay / 2) <= d.retry_at_ms <= NOW + delay
    else:
        final = RunState.FAILED if outcome == Outcome.FAILED else RunState.TIMED_OUT
        assert d == Decision(final)
    assert d.terminal == (d.retry_at_ms is None)
