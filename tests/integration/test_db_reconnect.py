"""The services' reconnect policy (cronwheel/store/db.py) against a real
PostgreSQL: a session the server ends is waited out and tried again on a new
connection, whichever error psycopg raises for it. A session ended for
idling in a transaction raises InternalError (25P03), not OperationalError:
a timer cut off from the database inside its firing transaction heard that
when it could hear again, and exited (pg_partition, CI 2026-12-03)."""

from __future__ import annotations

import logging
import threading
import time

import psycopg
import pytest

from cronwheel.store.db import Reconnecting, keep_connected

pytestmark = pytest.mark.integration


def _ended_while_idle_in_transaction(dsn: str) -> None:
    """What the cut timer met: its transaction left idle past the server's
    timeout, then its next statement."""
    with psycopg.connect(dsn) as conn:
        conn.execute("SET idle_in_transaction_session_timeout = '100ms'")
        conn.commit()
        conn.execute("SELECT 1")  # a transaction, left open
        time.sleep(
            0.5
        )  # the fault itself: idle past the 100 ms timeout, not a wait for a condition
        conn.execute("SELECT 1")


def test_keep_connected__session_ended_idle_in_transaction__the_loop_runs_again(
    database_url, caplog
):
    calls = []

    def loop(stop: threading.Event) -> None:
        calls.append(time.monotonic())
        if len(calls) == 1:
            _ended_while_idle_in_transaction(database_url)

    with caplog.at_level(logging.WARNING, logger="test-reconnect"):
        keep_connected(loop, threading.Event(), logging.getLogger("test-reconnect"))
    assert len(calls) == 2
    assert any("idle-in-transaction" in r.getMessage() for r in caplog.records)


def test_reconnecting__session_ended_idle_in_transaction__called_again_on_a_new_connection(
    database_url,
):
    db = Reconnecting(database_url, logging.getLogger("test-reconnect"))
    seen = []

    def fn(conn: psycopg.Connection) -> int:
        seen.append(conn.info.backend_pid)
        if len(seen) == 1:
            conn.execute("SET idle_in_transaction_session_timeout = '100ms'")
            with conn.transaction():
                conn.execute("SELECT 1")
                time.sleep(0.5)  # the fault itself: idle past the server's 100 ms timeout
                conn.execute("SELECT 1")
        return conn.execute("SELECT 7").fetchone()[0]

    try:
        assert db.call(fn, threading.Event()) == 7
    finally:
        db.close()
    assert len(seen) == 2 and seen[0] != seen[1]
