"""Writing to and draining the transactional outbox.

Every row carries its priority class (0 critical .. 3 low), and its topic is
its lane: a tenant's run topic, or a shared one such as run-completed. The
relay drains by class, then round-robin across lanes, oldest first within a
lane (read_fair), so a flood in one tenant's lane delays no other tenant's, and
critical rows never queue behind normal ones.

Where a record of a class goes on its topic is the Kafka module's
(cronwheel.kafka, "Topics laid out by priority class").
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass

import psycopg

from cronwheel.core.clock import to_dt
from cronwheel.core.events import OutboxRow
from cronwheel.core.runs import NORMAL_RANK
from cronwheel.store.pgarrays import (
    PackedArray,
    bytea_array,
    int2_array,
    int8_array,
    text_array,
    timestamptz_array,
)
from cronwheel.store.quotas import fair_shares
from cronwheel.store.sql_loader import queries

log = logging.getLogger("cronwheel.outbox")

Q = queries("outbox")
NORMAL = NORMAL_RANK
# Every row says its class and hold (cronwheel.core.events.OutboxRow); the
# name a row that said them once had, for callers that still use it.
RankedRow = OutboxRow


def append(conn: psycopg.Connection, rows: Sequence[OutboxRow]) -> None:
    """Add rows in the caller's transaction and wake the relay when it commits.
    One row (a CompleteRun's RunCompleted, a trigger's run) is one statement."""
    if not rows:
        return
    if len(rows) == 1:
        (r,) = rows
        conn.execute(
            Q["append_one"],
            {
                "p": r.partition_id, "topic": r.topic, "key": r.key, "value": r.value,
                "headers": json.dumps(r.headers) if r.headers else None,
                "priority": r.priority, "not_before": _at(r.not_before_ms),
            },
        )  # fmt: skip
        return
    conn.execute(
        Q["append"],
        {
            "partitions": int2_array([r.partition_id for r in rows]),
            "topics": text_array([r.topic for r in rows]),
            "keys": bytea_array([r.key for r in rows]),
            "values": bytea_array([r.value for r in rows]),
            "headers": text_array([json.dumps(r.headers) if r.headers else None for r in rows]),
            "priorities": int2_array([r.priority for r in rows]),
            "not_before": timestamptz_array([r.not_before_ms for r in rows]),
        },
    )
    conn.execute(Q["notify"])


def read_batch(conn: psycopg.Connection, partitions: Sequence[int], limit: int) -> list[tuple]:
    """Oldest first, ignoring classes and lanes (tools and tests)."""
    return conn.execute(
        Q["read_batch"], {"partitions": list(partitions), "limit": limit}
    ).fetchall()


@dataclass
class FairBatch:
    # (id, topic, key, value, headers, priority, not_before_ms, partition_id),
    # in publishing order
    rows: list[tuple]
    lanes: int  # lanes that had rows
    more: bool  # some lane may hold more than this batch took


def read_small(
    conn: psycopg.Connection,
    partitions: Sequence[int] | PackedArray,
    limit: int,
    exclude: Sequence[int] = (),
    hold_until: int | None = None,
) -> FairBatch | None:
    """Every pending row by class then age, except `exclude` (in flight) and
    rows not to be published before `hold_until` (ms; None: no such limit),
    when there are at most `limit`; None when there are more (a backlog:
    read_fair decides who goes first)."""
    rows = conn.execute(
        Q["read_small"],
        {
            "partitions": _partitions(partitions),
            "limit": limit + 1,
            "exclude": int8_array(list(exclude)),
            "hold_until": _until(hold_until),
        },
    ).fetchall()
    if len(rows) > limit:
        return None
    rows.sort(key=lambda r: (r[5], r[0]))
    return FairBatch(rows, len({(r[5], r[1]) for r in rows}), False)


def read_fair(
    conn: psycopg.Connection,
    partitions: Sequence[int] | PackedArray,
    limit: int,
    turn: int = 0,
    rounds: int = 3,
    hold_until: int | None = None,
) -> FairBatch:
    """Up to `limit` rows by class, then an equal share per lane (fair_shares),
    in up to `rounds` rounds: a lane that holds less than its share leaves the
    rest to the others in the next round. Rows come back interleaved (each
    lane's first, then each lane's second, ...) within each class."""
    parts = _partitions(partitions)
    lanes = [(r[0], r[1]) for r in conn.execute(Q["lanes"], {"partitions": parts}).fetchall()]
    n_lanes = len(lanes)
    after: dict[tuple[int, str], int] = {}
    order: dict[tuple[int, str], int] = {}  # rows read per lane so far
    keyed: list[tuple[tuple, tuple]] = []
    room = limit
    for _ in range(rounds):
        quota = fair_shares(lanes, room, turn)
        if not quota:
            break
        rows = conn.execute(
            Q["read_lanes"],
            {
                "partitions": parts,
                "prio": [lane[0] for lane in quota],
                "topic": [lane[1] for lane in quota],
                "quota": list(quota.values()),
                "after": [after.get(lane, 0) for lane in quota],
                "hold_until": _until(hold_until),
            },
        ).fetchall()
        got: dict[tuple[int, str], int] = {}
        for row in rows:
            lane = (row[5], row[1])
            got[lane] = got.get(lane, 0) + 1
            after[lane] = max(after.get(lane, 0), row[0])
            position = order.get(lane, 0)
            order[lane] = position + 1
            keyed.append(((row[5], position, row[1]), row))
        room -= len(rows)
        lanes = [lane for lane in lanes if lane not in quota or got.get(lane, 0) >= quota[lane]]
        if room <= 0:
            break
    keyed.sort(key=lambda kr: kr[0])
    return FairBatch([row for _k, row in keyed], n_lanes, bool(lanes))


def _partitions(partitions: Sequence[int] | PackedArray) -> PackedArray:
    """Partitions as a binary smallint[] (Leases.owned_array is one already)."""
    return partitions if isinstance(partitions, PackedArray) else int2_array(list(partitions))


def _at(ms: int | None):
    return None if ms is None else to_dt(ms)


def _until(ms: int | None):
    """hold_until as a parameter: far in the future when there is no limit."""
    return to_dt(ms if ms is not None else 253_402_300_799_000)  # 9999-12-31


def delete_delivered(conn: psycopg.Connection, ids: Sequence[int]) -> int:
    if not ids:
        return 0
    return conn.execute(Q["delete_delivered"], {"ids": list(ids)}).rowcount


def backlog(conn: psycopg.Connection) -> int:
    return conn.execute(Q["backlog"]).fetchone()[0]
