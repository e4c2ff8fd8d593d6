"""Connections for the services' loops."""

from __future__ import annotations

import psycopg


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
