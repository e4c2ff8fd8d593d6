"""A tenant's rows in one cell's database, as the move protocol handles them
(cronwheel/moves.py; docs/cells.md "Moving a tenant"). Its SQL is
sql/moves.sql. The connections are each cell's owner's: the mover reads and
writes one tenant's rows across every table, outside row-level security.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Sequence
from datetime import datetime

import psycopg

from cronwheel.store import timers
from cronwheel.store.sql_loader import queries

# Every table that holds a tenant's rows, parents before children (the copy
# inserts in this order; the delete goes children first). Not here: the
# outbox (drained before the last copy), and what is no tenant's (leases,
# processed, schema_migrations).
TABLES = (
    "tenants",
    "api_keys",
    "tenant_limits",
    "tenant_quotas",
    "idempotency_keys",
    "jobs",
    "runs_daily",
    "run_attempts_daily",
    "timers",
    "webhook_secrets",
    "workflows",
    "workflow_nodes",
    "workflow_runs",
    "workflow_run_nodes",
)


@functools.cache
def _q() -> dict[str, str]:
    return queries("moves")


def connect(dsn: str) -> psycopg.Connection:
    """An owner's connection with the settings the checksums depend on (a
    timestamp's text is the session's time zone's)."""
    conn = psycopg.connect(dsn, autocommit=True, connect_timeout=10)
    conn.execute("SET TimeZone = 'UTC'")
    conn.execute("SET extra_float_digits = 3")
    return conn


def migrations(conn: psycopg.Connection) -> list[int]:
    return list(conn.execute(_q()["migrations"]).fetchone()[0])


def tenant_state(conn: psycopg.Connection, tenant_id: str) -> str | None:
    row = conn.execute(_q()["tenant_state"], {"t": tenant_id}).fetchone()
    return row[0] if row else None


def copy(source: psycopg.Connection, target: psycopg.Connection, tenant_id: str, cell: str) -> None:
    """The tenant's rows in `source` become its rows in `target`, which holds
    it `standby` in `cell`: read in one snapshot of the source, written in one
    transaction on the target that deletes what an earlier copy left and
    inserts every row as the source has it (so a copy repeated after a crash,
    or to catch up, ends the same)."""
    params = {"t": tenant_id}
    with _snapshot(source), target.transaction():
        target.execute(_q()["delete_history"], params)
        target.execute(timers.Q["drop_tenant_timers"], params)
        target.execute(_q()["delete_small"], params)
        for table in TABLES:
            _copy_rows(source, target, _q()["rows_" + table], table, params)
        target.execute(_q()["standby"], {"t": tenant_id, "cell": cell})


# The history (store/sql/moves.sql, recent_<table>): what the freeze's
# catch-up copies only in part; every other table it copies whole again.
HISTORY = ("runs_daily", "run_attempts_daily", "workflow_runs", "workflow_run_nodes")


def catch_up(
    source: psycopg.Connection,
    target: psycopg.Connection,
    tenant_id: str,
    cell: str,
    since: datetime,
) -> None:
    """What `copy` does, for the rows that can have changed since a copy read
    at `since` or later: the small tables whole, of the history the rows
    unfinished or finished since `since` (a finished run does not change).
    One source snapshot, one target transaction; what it cannot see (a row
    of the history deleted, a transaction older than `since` committing a
    finished run) the checksums find, and the caller copies whole."""
    params = {"t": tenant_id, "since": since}
    with _snapshot(source), target.transaction():
        # The workflows go and come back below while their kept (finished)
        # runs stay: their reference is checked at the commit (0028).
        target.execute(_q()["defer_workflow_refs"])
        target.execute(timers.Q["drop_tenant_timers"], params)
        target.execute(_q()["delete_small"], params)
        for table in TABLES:
            if table in HISTORY:
                continue
            _copy_rows(source, target, _q()["rows_" + table], table, params)
        for table in HISTORY:
            target.execute(_q()["stage_" + table])
            _copy_rows(source, target, _q()["recent_" + table], f"moved_{table}", params)
        target.execute(_q()["forget_recent_children"], params)
        target.execute(_q()["forget_recent_parents"], params)
        for table in HISTORY:
            target.execute(_q()["drop_staged_" + table])
            target.execute(_q()["insert_staged_" + table])
        target.execute(_q()["standby"], {"t": tenant_id, "cell": cell})


def _copy_rows(
    source: psycopg.Connection, target: psycopg.Connection, rows: str, into: str, params: dict
) -> None:
    with (
        source.cursor().copy(f"COPY ({rows}) TO STDOUT (FORMAT binary)", params) as out,
        target.cursor().copy(f"COPY {into} FROM STDIN (FORMAT binary)") as sink,
    ):
        for block in out:
            sink.write(block)


@contextlib.contextmanager
def _snapshot(conn: psycopg.Connection):
    """A read-only transaction whose statements all see one snapshot (a run
    and its attempts as of one instant, while the source keeps firing)."""
    before = conn.isolation_level
    conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
    try:
        with conn.transaction():
            conn.execute("SET TRANSACTION READ ONLY")
            yield
    finally:
        conn.isolation_level = before


def checksums(conn: psycopg.Connection, tenant_id: str) -> dict[str, tuple[int, str]]:
    """Per table: how many of the tenant's rows and an md5 over their text,
    in a stable order. Equal in two cells: the same rows."""
    out = {}
    with _snapshot(conn):
        for table in TABLES:
            rows = _q().get("compare_" + table) or _q()["rows_" + table]
            sql = _q()["checksum_of"].replace("(ROWS)", f"({rows})")
            row = conn.execute(sql, {"t": tenant_id}).fetchone()
            out[table] = (row[0], row[1])
    return out


def freeze(conn: psycopg.Connection, tenant_id: str) -> bool:
    """Freeze the tenant in this (the source) cell: nothing of it fires and no
    write of it commits here once this commits (sql/moves.sql: move_lock,
    freeze and park_timers). False when the tenant is not active or frozen
    here."""
    params = {"t": tenant_id}
    with conn.transaction():
        conn.execute(_q()["move_lock"], params)  # the tenant's writes in flight end first
        if conn.execute(_q()["freeze"], params).fetchone() is None:
            return False
        conn.execute(timers.Q["park_timers"], params)
    return True


def unfreeze(conn: psycopg.Connection, tenant_id: str) -> None:
    """A rollback's: the tenant active here again with its timers back."""
    params = {"t": tenant_id}
    with conn.transaction():
        conn.execute(timers.Q["unpark_timers"], params)
        conn.execute(_q()["reactivate"], params)
        conn.execute(_q()["wake_timers"])


def activate(conn: psycopg.Connection, tenant_id: str, cell: str) -> None:
    """The tenant active in this (the target) cell: its timers fire here."""
    with conn.transaction():
        conn.execute(_q()["activate"], {"t": tenant_id, "cell": cell})
        conn.execute(_q()["wake_timers"])


def remove(conn: psycopg.Connection, tenant_id: str, *, only_state: str | None = None) -> None:
    """Every row of the tenant in this cell, gone (the source after the move,
    or the target after a rollback); with `only_state`, only while the
    tenant's row is absent or in that state (checked under its lock, in the
    transaction that deletes); in another state nothing is touched."""
    params = {"t": tenant_id}
    with conn.transaction():
        state = conn.execute(_q()["lock_tenant"], params).fetchone()
        if state is not None and only_state is not None and state[0] != only_state:
            return
        conn.execute(_q()["delete_history"], params)
        conn.execute(timers.Q["drop_tenant_timers"], params)
        conn.execute(_q()["delete_small"], params)


def tenant_runs(conn: psycopg.Connection, tenant_id: str) -> int:
    """How many runs the tenant has here (grows when a completion creates one)."""
    return conn.execute(_q()["tenant_runs"], {"t": tenant_id}).fetchone()[0]


def workflows_under_way(conn: psycopg.Connection, tenant_id: str) -> bool:
    """Whether the tenant has a workflow run not ended here."""
    return conn.execute(_q()["workflows_under_way"], {"t": tenant_id}).fetchone()[0]


def platform_attempts(conn: psycopg.Connection, tenant_id: str) -> int:
    """The tenant's attempts under way by the platform's own workers (the
    webhook and executor services), whose ends they write here directly."""
    return conn.execute(_q()["platform_attempts"], {"t": tenant_id}).fetchone()[0]


def outbox_high(conn: psycopg.Connection) -> int:
    return conn.execute(_q()["outbox_high"]).fetchone()[0]


def outbox_left(
    conn: psycopg.Connection, tenant_id: str, upto: int, shared: Sequence[str] = ()
) -> int:
    """The tenant's records appended up to outbox id `upto` that the relay
    has not published yet (its topics name it: cronwheel/kafka.py Topics),
    and every tenant's on the platform's topics `shared` (whose names do not
    tell tenants apart)."""
    params = {"upto": upto, "needle": "." + tenant_id, "shared": list(shared)}
    return conn.execute(_q()["outbox_left"], params).fetchone()[0]
