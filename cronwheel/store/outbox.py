"""Writing to and draining the transactional outbox."""

from __future__ import annotations

import json
from collections.abc import Sequence

import psycopg

from cronwheel.core.events import OutboxRow
from cronwheel.store.sql_loader import queries

Q = queries("outbox")


def append(conn: psycopg.Connection, rows: Sequence[OutboxRow]) -> None:
    """Add rows in the caller's transaction and wake the relay when it commits."""
    if not rows:
        return
    conn.execute(
        Q["append"],
        {
            "partitions": [r.partition_id for r in rows],
            "topics": [r.topic for r in rows],
            "keys": [r.key for r in rows],
            "values": [r.value for r in rows],
            "headers": [json.dumps(r.headers) if r.headers else None for r in rows],
        },
    )
    conn.execute(Q["notify"])


def read_batch(conn: psycopg.Connection, partitions: Sequence[int], limit: int) -> list[tuple]:
    return conn.execute(
        Q["read_batch"], {"partitions": list(partitions), "limit": limit}
    ).fetchall()


def delete_delivered(conn: psycopg.Connection, ids: Sequence[int]) -> int:
    if not ids:
        return 0
    return conn.execute(Q["delete_delivered"], {"ids": list(ids)}).rowcount


def backlog(conn: psycopg.Connection) -> int:
    return conn.execute(Q["backlog"]).fetchone()[0]
