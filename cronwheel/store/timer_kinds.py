"""The registry of timer kinds: every kind of time-driven event and the handler
the firing loop calls for its due timers, inside the firing transaction.

A feature that needs time-driven events adds its kind here (its statements go
in timers.py); the firing loop (store/firing.py, services/timer) does not
change for it.
"""

from __future__ import annotations

from collections.abc import Callable

from cronwheel.kafka import Topics
from cronwheel.store.jobs import JobTimers
from cronwheel.store.lifecycle import Lifecycle
from cronwheel.store.pending import PendingRuns
from cronwheel.store.timers import Handler
from cronwheel.store.workflows import Workflows


def _job(topics: Topics, ahead_ms: int) -> Handler:
    return JobTimers(topics, ahead_ms=ahead_ms)  # a job's next instant(s)


def _lease(topics: Topics, ahead_ms: int) -> Handler:
    return Lifecycle(topics).on_expiry  # a lease not renewed by heartbeats


def _retry(topics: Topics, ahead_ms: int) -> Handler:
    return Lifecycle(topics).on_retry  # a retry's backoff is over


def _pending(topics: Topics, ahead_ms: int) -> Handler:
    # A partition's PENDING runs past their deadline, announced again; with the
    # default deadlines (services/timer passes its settings' in its place).
    return PendingRuns(topics).on_timers


def _workflow(topics: Topics, ahead_ms: int) -> Handler:
    return Workflows(topics).on_timers  # a workflow's next instant(s)


# kind -> its handler, made for the firing's topics and lead (`ahead_ms`: how
# long before its instant a job's run is created; only `job` takes it: every
# other kind acts when due).
KINDS: dict[str, Callable[[Topics, int], Handler]] = {
    "job": _job,
    "lease": _lease,
    "timeout": _lease,  # a run's timeout: ends the attempt as an expired lease does
    "retry": _retry,
    "workflow": _workflow,
    "pending": _pending,
}


def handlers(topics: Topics, *, ahead_ms: int = 0) -> dict[str, Handler]:
    """A handler for every kind (Firing's)."""
    return {kind: make(topics, ahead_ms) for kind, make in KINDS.items()}


def timer_handlers(topics: Topics) -> dict[str, Handler]:
    """Every kind but `job`: the handlers services/timer hands to Firing, which
    has them already (handlers); `job`'s needs the firing's lead, so Firing
    makes it."""
    return {kind: h for kind, h in handlers(topics).items() if kind != "job"}
