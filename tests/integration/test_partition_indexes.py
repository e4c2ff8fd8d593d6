"""An index declared ON ONLY a partitioned table, completed partition by
partition (cronwheel/store/partition_indexes.py, run by `cronwheel migrate`)."""

from __future__ import annotations

import psycopg
import pytest

from cronwheel.store import partition_indexes

pytestmark = pytest.mark.integration

SETUP = """
CREATE TABLE pi_t (id int NOT NULL, d date NOT NULL, v int) PARTITION BY RANGE (d);
CREATE TABLE pi_t_default PARTITION OF pi_t DEFAULT;
CREATE TABLE pi_t_p1 PARTITION OF pi_t FOR VALUES FROM ('2026-01-01') TO ('2026-01-02');
CREATE TABLE pi_t_p2 PARTITION OF pi_t FOR VALUES FROM ('2026-01-02') TO ('2026-01-03');
INSERT INTO pi_t SELECT g, '2026-01-01', g FROM generate_series(1, 100) g;
INSERT INTO pi_t SELECT g, '2026-01-02', g FROM generate_series(1, 100) g;
INSERT INTO pi_t VALUES (1, '2026-01-02', 0), (7, '2030-01-01', 7);
CREATE INDEX pi_t_v ON ONLY pi_t (v) WHERE v IS NOT NULL;
CREATE UNIQUE INDEX pi_t_key ON ONLY pi_t (id, d);
"""


def _attached(conn, parent_index: str) -> dict[str, bool]:
    """The partitions' indexes attached to `parent_index`, with their validity."""
    rows = conn.execute(
        "SELECT c.relname, x.indisvalid FROM pg_inherits h"
        " JOIN pg_class c ON c.oid = h.inhrelid JOIN pg_index x ON x.indexrelid = c.oid"
        " WHERE h.inhparent = %s::regclass",
        [parent_index],
    ).fetchall()
    return dict(rows)


def _valid(conn, index: str) -> bool:
    return conn.execute(
        "SELECT indisvalid FROM pg_index WHERE indexrelid = %s::regclass", [index]
    ).fetchone()[0]


def test_complete__partitions_without_the_index__built_attached_and_parent_valid(
    admin_database_url,
):
    with psycopg.connect(admin_database_url, autocommit=True) as conn:
        conn.execute(SETUP)
        # A concurrent build that failed before (a duplicate key) left an
        # invalid index under the name complete() gives that partition's.
        with pytest.raises(psycopg.errors.UniqueViolation):
            conn.execute("CREATE UNIQUE INDEX CONCURRENTLY pi_t_p2_key ON pi_t_p2 (id, d)")
        assert not _valid(conn, "pi_t_p2_key")
        conn.execute("DELETE FROM pi_t WHERE d = '2026-01-02' AND v = 0")
        assert not _valid(conn, "pi_t_key") and not _valid(conn, "pi_t_v")

        built = partition_indexes.complete(conn)

        assert sorted(built) == sorted(
            f"pi_t_{part}_{suffix}" for part in ("default", "p1", "p2") for suffix in ("key", "v")
        )
        for parent in ("pi_t_key", "pi_t_v"):
            assert _valid(conn, parent)
            assert set(_attached(conn, parent).values()) == {True}
            assert len(_attached(conn, parent)) == 3
        # The unique one holds on each partition; a partition made later has
        # both with its table; nothing is left to build.
        with pytest.raises(psycopg.errors.UniqueViolation):
            conn.execute("INSERT INTO pi_t VALUES (5, '2026-01-01', 5)")
        conn.execute(
            "CREATE TABLE pi_t_p3 PARTITION OF pi_t FOR VALUES FROM ('2026-01-03') TO ('2026-01-04')"
        )
        assert len(_attached(conn, "pi_t_v")) == 4
        assert partition_indexes.complete(conn) == []


def test_migrated_schema__runs_daily_open_job__valid_on_every_partition(admin_database_url):
    with psycopg.connect(admin_database_url, autocommit=True) as conn:
        assert _valid(conn, "runs_daily_open_job")
        parts = conn.execute(
            "SELECT count(*) FROM pg_inherits WHERE inhparent = 'runs_daily'::regclass"
        ).fetchone()[0]
        assert len(_attached(conn, "runs_daily_open_job")) == parts


def test_child_name__past_63_bytes__cut_and_told_apart_by_a_hash():
    long_table = "run_attempts_daily_p20261204"
    a = partition_indexes.child_name(
        "run_attempts_daily_a_long_index_name_one", "run_attempts_daily", long_table
    )
    b = partition_indexes.child_name(
        "run_attempts_daily_a_long_index_name_two", "run_attempts_daily", long_table
    )
    assert len(a.encode()) <= 63 and len(b.encode()) <= 63 and a != b
    assert partition_indexes.child_name("pi_t_v", "pi_t", "pi_t_p1") == "pi_t_p1_v"
