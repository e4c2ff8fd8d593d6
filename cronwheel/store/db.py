"""Connections for the services' loops, and transactions in pipeline mode."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import psycopg
from psycopg import pq


def connect(dsn: str, *, idle_tx_timeout_ms: int | None = None) -> psycopg.Connection:
    """An autocommit connection (transactions are explicit `with conn.transaction()`).

    `idle_tx_timeout_ms` bounds how long a frozen process (SIGSTOP, a hang, a
    partition) can hold a transaction's row locks: the server ends it, so a new
    lease owner is not blocked by claimed timers or share-locked lease rows for
    longer than about one lease TTL.
    """
    conn = psycopg.connect(dsn, autocommit=True)
    if idle_tx_timeout_ms:
        conn.execute(
            "SELECT set_config('idle_in_transaction_session_timeout', %s, false)",
            [f"{int(idle_tx_timeout_ms)}ms"],
        )
    return conn


class Reconnecting:
    """One connection for a consumer loop that outlives database restarts: `call`
    runs `fn(conn)`, reconnecting with backoff while the database is away."""

    def __init__(self, dsn: str, log) -> None:
        self.dsn = dsn
        self.log = log
        self.conn: psycopg.Connection | None = None

    def call(self, fn, stop, stopped=None):
        """`fn(conn)`; `stopped` when `stop` is set while waiting to reconnect."""
        backoff = 0.1
        while True:
            try:
                if self.conn is None or self.conn.closed:
                    self.conn = psycopg.connect(self.dsn, autocommit=True)
                return fn(self.conn)
            except psycopg.OperationalError as exc:
                self.log.warning("database unavailable (%s); retrying", exc)
                self.close()
                if stop.wait(backoff):
                    return stopped
                backoff = min(backoff * 2, 5.0)

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


@contextlib.contextmanager
def pipelined_transaction(conn) -> Iterator[psycopg.Pipeline]:
    """BEGIN ... COMMIT in psycopg's pipeline mode. Not `conn.transaction()`: in a
    pipeline it syncs after BEGIN and again after COMMIT, two more round trips.
    BEGIN goes out with the caller's first statement, which it should end with
    the pipeline's `sync()` (libpq learns it is in a transaction only then);
    COMMIT with what nobody reads (outbox row, notify) in the final sync."""
    try:
        with conn.pipeline() as pipeline:
            conn.execute(_BEGIN)
            yield pipeline
            conn.execute(_COMMIT)
    except BaseException:
        if conn.pgconn.transaction_status != pq.TransactionStatus.IDLE:
            with contextlib.suppress(psycopg.Error):
                conn.execute(_ROLLBACK)
        raise


_BEGIN, _COMMIT, _ROLLBACK = b"BEGIN", b"COMMIT", b"ROLLBACK"
