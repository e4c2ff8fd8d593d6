"""The real PostgreSQL: a state change and its outbox row commit or roll back together."""

from __future__ import annotations

import psycopg
import pytest

pytestmark = pytest.mark.integration

# A run's instant: the same run is the same instant, so the same key (runs_daily's
# primary key holds its partition key, scheduled_at).
AT = "2026-01-01 00:00:00+00"


def _insert_run_and_outbox(conn: psycopg.Connection, run_id: str) -> None:
    conn.execute(
        "INSERT INTO tenants (tenant_id, name) VALUES ('t1', 'acme') ON CONFLICT DO NOTHING"
    )
    conn.execute(
        "INSERT INTO runs_daily (partition_id, run_id, tenant_id, scheduled_at, spec)"
        " VALUES (7, %s, 't1', %s, '{}')",
        [run_id, AT],
    )
    conn.execute(
        "INSERT INTO outbox (partition_id, topic, key, value) VALUES (7, 'cw.runs.t1', %s, 'x')",
        [run_id.encode()],
    )


def _counts(url: str, run_id: str) -> tuple[int, int]:
    with psycopg.connect(url) as conn:
        runs = conn.execute(
            "SELECT count(*) FROM runs_daily WHERE run_id = %s", [run_id]
        ).fetchone()[0]
        out = conn.execute(
            "SELECT count(*) FROM outbox WHERE key = %s", [run_id.encode()]
        ).fetchone()[0]
    return runs, out


def test_run_and_outbox__commit__both_visible(database_url):
    with psycopg.connect(database_url) as conn, conn.transaction():
        _insert_run_and_outbox(conn, "r-commit")
    assert _counts(database_url, "r-commit") == (1, 1)


def test_run_and_outbox__error_mid_transaction__neither_visible(database_url):
    with psycopg.connect(database_url) as conn, pytest.raises(RuntimeError), conn.transaction():
        _insert_run_and_outbox(conn, "r-rollback")
        raise RuntimeError("crash between the two writes' commit")
    assert _counts(database_url, "r-rollback") == (0, 0)


def test_duplicate_run_id__on_conflict_do_nothing__one_row(database_url):
    with psycopg.connect(database_url) as conn:
        _insert_run_and_outbox(conn, "r-dup")
        conn.commit()
        inserted = conn.execute(
            "INSERT INTO runs_daily (partition_id, run_id, tenant_id, scheduled_at, spec)"
            " VALUES (7, 'r-dup', 't1', %s, '{}')"
            " ON CONFLICT (partition_id, run_id, scheduled_at) DO NOTHING RETURNING run_id",
            [AT],
        ).fetchall()
        conn.commit()
    assert inserted == []
    assert _counts(database_url, "r-dup")[0] == 1


def test_terminal_state_without_finished_at__rejected_by_constraint(database_url):
    with psycopg.connect(database_url) as conn:
        _insert_run_and_outbox(conn, "r-bad")
        with pytest.raises(psycopg.errors.CheckViolation, match="finished_iff_terminal"):
            conn.execute("UPDATE runs_daily SET state = 'SUCCEEDED' WHERE run_id = 'r-bad'")
