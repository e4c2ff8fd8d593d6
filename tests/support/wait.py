"""Waiting in tests is polling with a deadline, never a bare sleep."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(
    check: Callable[[], T], timeout: float = 15.0, interval: float = 0.02, what: str = "condition"
) -> T:
    """Call `check` until it returns something truthy; fail with `what` at the deadline."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        last = check()
        if last:
            return last
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")
        time.sleep(interval)


def wait_drained(
    count: Callable[[], int], stall_s: float = 30.0, interval: float = 0.1, what: str = "queue"
) -> float:
    """Wait until `count()` is 0; fail only if it stops going down for `stall_s`.

    A backlog's size depends on how loaded the machine was while it built up
    (a CI machine running other tests fires more before a fault ends), so a
    fixed deadline fails a drain that is merely slow; a drain that stalls is
    what a test must catch. Returns the seconds it took."""
    start = best = count()
    began = progressed = time.monotonic()
    while best > 0:
        time.sleep(interval)
        n = count()
        if n < best:
            best, progressed = n, time.monotonic()
        elif time.monotonic() - progressed >= stall_s:
            raise AssertionError(
                f"{what} stalled at {best} of {start} for {stall_s}s "
                f"({time.monotonic() - began:.0f}s since the wait began)"
            )
    return time.monotonic() - began
