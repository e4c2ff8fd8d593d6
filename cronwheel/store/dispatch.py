"""The dispatcher's store: which messages it already forwarded.

Kafka redelivers (a relay crash between publish and delete, a dispatcher crash
between forward and commit, a rebalance), so the dispatcher asks here before
forwarding and records here after the broker acknowledged the forward. A crash
in between forwards again; it never loses a record.
"""

from __future__ import annotations

from collections.abc import Sequence

import psycopg

from cronwheel import metrics
from cronwheel.core.clock import to_dt
from cronwheel.store.sql_loader import queries

Q = queries("dispatch")


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

    def prune(self, conn: psycopg.Connection, before_ms: int, limit: int = 5_000) -> int:
        """Delete up to `limit` rows recorded before `before_ms`; returns how many."""
        return conn.execute(
            Q["prune"], {"consumer": self.consumer, "before": to_dt(before_ms), "limit": limit}
        ).rowcount


class Pruner:
    """Prunes one consumer's `processed` rows now and then from its service loop:
    a bite per `every_ms`, more bites at once while a bite comes back full."""

    def __init__(self, processed: Processed, retention: int, every_ms: int = 60_000):
        self.processed = processed
        self.retention_ms = retention
        self.every_ms = every_ms
        self.pruned_total = 0
        self._next = 0

    def due(self, now: int) -> bool:
        return now >= self._next

    def run(self, conn: psycopg.Connection, now: int, limit: int = 5_000, bites: int = 10) -> int:
        self._next = now + self.every_ms
        n = 0
        for _ in range(bites):
            got = self.processed.prune(conn, now - self.retention_ms, limit)
            n += got
            if got < limit:
                break
        self.pruned_total += n
        metrics.PROCESSED_PRUNED.labels(self.processed.consumer).inc(n)
        return n
