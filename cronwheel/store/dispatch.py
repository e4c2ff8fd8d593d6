"""The dispatcher's store: which messages it already forwarded.

Kafka redelivers (a relay crash between publish and delete, a dispatcher crash
between forward and commit, a rebalance), so the dispatcher asks here before
forwarding and records here after the broker acknowledged the forward. A crash
in between forwards again; it never loses a record.
"""

from __future__ import annotations

from collections.abc import Sequence

import psycopg

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
