"""The dispatcher's store: which messages it already forwarded.

Kafka redelivers (a relay crash between publish and delete, a dispatcher crash
between forward and commit, a rebalance), so the dispatcher asks here before
forwarding and records here after the broker acknowledged the forward. A crash
in between forwards again; it never loses a record.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

import psycopg

from cronwheel import metrics
from cronwheel.core.clock import now_ms, to_dt
from cronwheel.store.db import Reconnecting
from cronwheel.store.sql_loader import queries

Q = queries("dispatch")
log = logging.getLogger("cronwheel.store.dispatch")
BITE = 5_000  # rows a prune statement deletes at most: a short transaction
BITES = 10  # bites a pass


def message_key(run_id: str, attempt: int, created_ms: int) -> str:
    """The idempotency key of a RunReady: the announcement of one attempt,
    named by when it was made (the record's created_at). The same record read
    twice (a relay's publish repeated, a redelivery, a replay) is skipped; a
    new announcement of the attempt is forwarded: a retry (attempt + 1), a
    re-announcement of an overdue run (made now), and the firing again of a
    run whose first firing PostgreSQL lost in a crash (synchronous_commit
    off) after the relay had published its record: by (run_id, attempt)
    alone the second was skipped as the first, whose StartRun had found no
    run, and the run waited PENDING for its deadline (fault harness,
    pg_immediate; docs/reliability.md)."""
    return f"{run_id}:{attempt}:{created_ms}"


def legacy_message_key(run_id: str, attempt: int) -> str:
    """The key a dispatcher of v0.3.0 and before records, (run_id, attempt):
    a re-announcement forgets it (pending.py) while such a dispatcher may run
    (a rolling upgrade). A new announcement never has this dispatcher's key of
    an earlier one, so there is no other mark to forget."""
    return f"{run_id}:{attempt}"


def run_of(key: str) -> tuple[str, int] | None:
    """(run_id, attempt) of a message key, None if it is not one."""
    run_id, _, rest = key.partition(":")
    attempt = rest.partition(":")[0]
    return (run_id, int(attempt)) if run_id and attempt.isdigit() else None


class Processed:
    """The `processed` rows of one consumer."""

    def __init__(self, consumer: str = "dispatcher"):
        self.consumer = consumer

    def seen(self, conn: psycopg.Connection, keys: Sequence[str]) -> set[str]:
        """The subset of `keys` already recorded."""
        if not keys:
            return set()
        rows = conn.execute(Q["seen"], {"consumer": self.consumer, "keys": list(keys)})
        return {r[0] for r in rows}

    def mark(self, conn: psycopg.Connection, keys: Sequence[str]) -> int:
        """Record `keys` in one statement; returns how many were new."""
        if not keys:
            return 0
        return conn.execute(
            Q["mark_processed"], {"consumer": self.consumer, "keys": list(keys)}
        ).rowcount

    def prune(self, conn: psycopg.Connection, before_ms: int, limit: int = BITE) -> int:
        """Delete up to `limit` rows recorded before `before_ms`; returns how many."""
        return conn.execute(
            Q["prune"], {"consumer": self.consumer, "before": to_dt(before_ms), "limit": limit}
        ).rowcount


class Pruner:
    """Prunes one consumer's `processed` rows on a thread of its own, through
    a connection of its own: a pass every `every_ms`, of bites of `limit`
    rows while a bite comes back full (`bites` a pass; a full pass is
    followed by the next at once). Run on the service's loop, a pass held
    it a round trip per bite: a minute's rows of a dispatcher forwarding
    1,000 runs a second are 60,000, twelve bites, more than a pass's ten,
    so the table also outgrew its pruning.

    `start_once` runs the first pass before it returns (waiting out a database
    that is away until `stop`), so a service prunes before it records
    anything: what it records in its first turn is kept a whole retention
    (tests/faults/scenarios.py, replay_retention)."""

    def __init__(
        self,
        processed: Processed,
        retention: int,
        every_ms: int = 60_000,
        clock: Callable[[], int] = now_ms,
    ):
        self.processed = processed
        self.retention_ms = retention
        self.every_ms = every_ms
        self.clock = clock
        self.pruned_total = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def run(self, conn: psycopg.Connection, now: int, limit: int = BITE, bites: int = BITES) -> int:
        """One pass: up to `bites` bites of `limit` rows; how many went."""
        n = 0
        for _ in range(bites):
            got = self.processed.prune(conn, now - self.retention_ms, limit)
            n += got
            self.pruned_total += got
            metrics.PROCESSED_PRUNED.labels(self.processed.consumer).inc(got)
            if got < limit:
                break
        return n

    def start_once(self, dsn: str, stop: threading.Event, service_log: logging.Logger) -> None:
        """At the first call: the first pass now, on the caller's thread; then
        the thread, on the same connection (one more per service instance).
        Later calls do nothing (a service calls it at each turn's start)."""
        if self._thread is not None:
            return
        db = Reconnecting(dsn, service_log)
        full = self._pass(db, stop)
        self._thread = threading.Thread(
            target=self._passes,
            args=(db, stop, full),
            name=f"prune-{self.processed.consumer}",
            daemon=True,
        )
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _pass(self, db: Reconnecting, stop: threading.Event) -> bool:
        """One pass through `db`; whether it came back full (more to prune)."""
        n = db.call(lambda c: self.run(c, self.clock()), stop, stopped=0)
        return n >= BITE * BITES

    def _passes(self, db: Reconnecting, stop: threading.Event, full: bool) -> None:
        """A pass every `every_ms`, or at once after a full one, until
        `stop()` or the service's `stop`."""
        try:
            while full or not self._stop.wait(self.every_ms / 1000):
                if stop.is_set() or self._stop.is_set():
                    break
                try:
                    full = self._pass(db, stop)
                except Exception:  # a statement that failed: tried again next pass
                    log.exception("pruning %s's processed rows failed", self.processed.consumer)
                    full = False
        finally:
            db.close()
