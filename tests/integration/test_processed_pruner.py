"""The `processed` pruner (cronwheel.store.dispatch.Pruner) prunes on a thread
of its own: its first pass before `start_once` returns (a service prunes before
it records anything), the later ones without the service's loop, and a pass
that came back full is followed by the next at once, so a table filling
faster than a pass's ten bites a minute is still kept to its retention.
Against the real database, as the dispatcher's role."""

from __future__ import annotations

import logging
import threading
import uuid

import psycopg
import pytest

from cronwheel.store.dispatch import Processed, Pruner
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration

DAY_MS = 86_400_000


def _old_rows(conn: psycopg.Connection, consumer: str, n: int) -> None:
    conn.execute(
        "INSERT INTO processed (consumer, message_key, processed_at)"
        " SELECT %s, 'old-' || i, now() - interval '8 days' - i * interval '1 ms'"
        "   FROM generate_series(1, %s) i",
        [consumer, n],
    )


def _left(conn: psycopg.Connection, consumer: str) -> int:
    return conn.execute(
        "SELECT count(*) FROM processed WHERE consumer = %s", [consumer]
    ).fetchone()[0]


def test_pruner__first_pass_before_start_returns__a_full_pass_followed_at_once_on_its_thread(
    database_url,
):
    consumer = f"prune-{uuid.uuid4().hex[:8]}"
    stop = threading.Event()
    with psycopg.connect(database_url, autocommit=True) as conn:
        _old_rows(conn, consumer, 62_000)  # more than a pass's 10 bites of 5,000
        conn.execute(
            "INSERT INTO processed (consumer, message_key, processed_at)"
            " VALUES (%s, 'recent', now() - interval '6 days')",
            [consumer],
        )
        # Every hour: only a full pass's follow-up can prune the rest now.
        pruner = Pruner(Processed(consumer), 7 * DAY_MS, every_ms=3_600_000)
        try:
            pruner.start_once(database_url, stop, logging.getLogger("test"))
            # The first pass is done when start returns: ten full bites.
            assert pruner.pruned_total >= 50_000
            wait_for(lambda: _left(conn, consumer) == 1, timeout=30, what="the rest pruned")
            wait_for(lambda: pruner.pruned_total == 62_000, timeout=10, what="the count")
            rows = conn.execute(
                "SELECT message_key FROM processed WHERE consumer = %s", [consumer]
            ).fetchall()
            assert rows == [("recent",)]
        finally:
            stop.set()
            pruner.stop()
            conn.execute("DELETE FROM processed WHERE consumer = %s", [consumer])
