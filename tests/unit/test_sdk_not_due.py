"""The SDK tells a StartRun refused because the run is not due yet (to start
again after its instant) from the other refusals (to drop)."""

from __future__ import annotations

import time

import pytest

from cronwheel.sdk.worker import Run, _not_due_yet


def _run(when: str) -> Run:
    scheduled_at = time.time() * 1000 + (60_000 if when == AHEAD else -60_000)
    return Run("r", 1, {}, int(scheduled_at), "normal", None, None, None, None)


def _problem(code: str, detail: str) -> dict:
    return {"status": 409, "code": code, "detail": detail}


PAST, AHEAD = (
    "past",
    "ahead",
)  # the run's instant against this clock (ids stable across xdist workers)


@pytest.mark.parametrize(
    ("status", "body", "when", "not_due"),
    [
        (409, _problem("NOT_RUNNABLE", "the run is not due yet"), PAST, True),  # clocks differ
        (409, _problem("NOT_RUNNABLE", "the run is not due yet"), AHEAD, True),
        (409, _problem("NOT_RUNNABLE", "the run is SUCCEEDED"), PAST, False),
        # Ended before its instant: started again after it (by this clock), then dropped.
        (409, _problem("NOT_RUNNABLE", "the run is CANCELLED"), AHEAD, True),
        (409, _problem("ALREADY_STARTED", "another worker holds this attempt"), AHEAD, False),
        (409, _problem("STALE_ATTEMPT", "the run is at attempt 2, not 1"), AHEAD, False),
        (404, _problem("NOT_FOUND", "run not found"), AHEAD, False),
        (200, {"attempt": 1, "start_token": "t"}, AHEAD, False),
    ],
)
def test_not_due_yet__only_a_refusal_before_the_instant(status, body, when, not_due):
    assert _not_due_yet(status, body, _run(when)) is not_due
