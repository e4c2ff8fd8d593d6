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


def message_key(run_id: str, attempt: int) -> str:
    """The idempotency key of a RunReady: a retry (attempt + 1) is a new message."""
    return f"{run_id}:{attempt}"


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
