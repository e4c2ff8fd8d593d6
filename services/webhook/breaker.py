"""A circuit breaker per endpoint: stop calling an endpoint that keeps failing,
and let runs wait (unstarted, their attempts intact) until it recovers.

CLOSED: every delivery passes; `threshold` failures in a row open it.
OPEN: nothing passes until the cool-down is over (longer if the endpoint's
  Retry-After asked for more); then the first caller becomes the probe.
HALF_OPEN: only the probe is out; its success closes the breaker, its failure
  opens it again for another cool-down. A probe that made no request (its run
  was already taken) hands the probe to the next caller.

Pure and clock-driven (`now` in seconds is passed in) so tests step time.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class State(enum.StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class Admission(enum.StrEnum):
    PASS = "pass"  # the breaker is closed
    PROBE = "probe"  # the one trial call of a half-open breaker


@dataclass
class Breaker:
    threshold: int = 5
    cooldown_s: float = 30.0
    state: State = State.CLOSED
    failures: int = 0  # consecutive
    open_until: float = 0.0
    probing: bool = False

    def would_admit(self, now: float) -> bool:
        """Whether `admit` would let a caller through now (no change made)."""
        if self.state == State.CLOSED:
            return True
        if self.state == State.OPEN:
            return now >= self.open_until
        return not self.probing

    def admit(self, now: float) -> Admission | None:
        if self.state == State.CLOSED:
            return Admission.PASS
        if self.state == State.OPEN and now < self.open_until:
            return None
        if self.probing:
            return None
        self.state = State.HALF_OPEN
        self.probing = True
        return Admission.PROBE

    def wait_s(self, now: float) -> float | None:
        """How long a refused caller should wait before asking again; None: until
        the probe's result changes the state."""
        if self.state == State.OPEN:
            return max(0.0, self.open_until - now)
        return None

    def success(self, admission: Admission | None) -> None:
        """The endpoint answered (a 2xx, or a response that is not its failure)."""
        self.state = State.CLOSED
        self.failures = 0
        if admission == Admission.PROBE:
            self.probing = False

    def failure(self, now: float, admission: Admission | None, hold_s: float = 0.0) -> None:
        """A 5xx, 408, 429, timeout or connection error. `hold_s`: the endpoint's
        Retry-After, which an opening breaker honours if it is the longer wait."""
        self.failures += 1
        if admission == Admission.PROBE:
            self.probing = False
            self._open(now, hold_s)
        elif self.state == State.CLOSED and self.failures >= self.threshold:
            self._open(now, hold_s)

    def release(self, admission: Admission | None) -> None:
        """The caller made no request after all; a probe goes to the next caller."""
        if admission == Admission.PROBE:
            self.probing = False

    def _open(self, now: float, hold_s: float) -> None:
        self.state = State.OPEN
        self.open_until = now + max(self.cooldown_s, hold_s)
