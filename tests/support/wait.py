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
