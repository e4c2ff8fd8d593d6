"""`cronwheel migrate`: ordered, recorded, idempotent, and safe when run twice at once."""

from __future__ import annotations

import threading
import uuid

import psycopg
import pytest

from cronwheel.store.migrate import discover, migrate
from tests.support import db as dbsupport

pytestmark = pytest.mark.integration


@pytest.fixture
def empty_database(servers):
    name = f"cw_empty_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(servers.database_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield dbsupport.with_dbname(servers.database_url, name)
    dbsupport.drop(servers.database_url, name)


def test_migrate__twice__second_applies_nothing(empty_database):
    first = migrate(empty_database)
    assert [m.version for m in first] == [m.version for m in discover()]
    assert migrate(empty_database) == []


def test_migrate__concurrently__each_version_recorded_once(empty_database):
    results, errors = [], []

    def run():
        try:
            results.append(migrate(empty_database))
        except Exception as e:  # pragma: no cover - the assertion below reports it
            errors.append(e)

    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    assert sorted(len(r) for r in results) == [0, 0, len(discover())]
    with psycopg.connect(empty_database) as conn:
        rows = conn.execute("SELECT version, count(*) FROM schema_migrations GROUP BY 1").fetchall()
    assert all(n == 1 for _, n in rows) and len(rows) == len(discover())


def test_migrate__two_databases_of_one_cluster_at_once__both_complete(servers):
    # Roles are the cluster's and the advisory lock is per database: every
    # database's migrate sets the same roles' logins (ALTER ROLE), and PostgreSQL
    # fails the later of two concurrent writers of one pg_authid row with
    # "tuple concurrently updated". Both migrations must still complete.
    names = [f"cw_pair_{uuid.uuid4().hex[:10]}" for _ in range(4)]
    with psycopg.connect(servers.database_url, autocommit=True) as conn:
        for name in names:
            conn.execute(f'CREATE DATABASE "{name}"')
    urls = [dbsupport.with_dbname(servers.database_url, n) for n in names]
    errors = []
    try:
        # The first round applies every migration (0018's role statements race
        # too); the later ones find nothing pending and race on the logins.
        for _ in range(5):
            barrier = threading.Barrier(len(urls))

            def run(url, barrier=barrier):
                barrier.wait(30)
                try:
                    migrate(url)
                except Exception as e:  # pragma: no cover - the assertion below reports it
                    errors.append(e)

            threads = [threading.Thread(target=run, args=(u,)) for u in urls]
            for t in threads:
                t.start()
            for t in threads:
                t.join(120)
        assert errors == []
        for url in urls:
            assert migrate(url) == []
    finally:
        for name in names:
            dbsupport.drop(servers.database_url, name)


def test_migrate__failing_migration__rolls_back_and_records_nothing(empty_database, tmp_path):
    (tmp_path / "0001_ok.sql").write_text("CREATE TABLE a (x int);")
    (tmp_path / "0002_bad.sql").write_text("CREATE TABLE b (x int); SELECT 1/0;")
    with pytest.raises(psycopg.errors.DivisionByZero):
        migrate(empty_database, tmp_path)
    with psycopg.connect(empty_database) as conn:
        assert conn.execute("SELECT version FROM schema_migrations").fetchall() == [(1,)]
        assert conn.execute("SELECT to_regclass('b')").fetchone()[0] is None


def test_discover__gap_in_numbers__refused(tmp_path):
    (tmp_path / "0001_a.sql").write_text("")
    (tmp_path / "0003_c.sql").write_text("")
    with pytest.raises(ValueError, match="without gaps"):
        discover(tmp_path)


def test_run_indexes__start_of_a_run__heap_only_update(empty_database):
    """0010-0011, kept by runs_daily (0025, 0029): no index names `state`, so
    PENDING -> RUNNING changes no indexed column and, with room on the page
    (fillfactor), is a HOT update; the unfinished-runs index answers "has
    this job an open run"."""
    migrate(empty_database)
    with psycopg.connect(empty_database) as conn:
        indexes = dict(
            conn.execute(
                "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'runs_daily'"
            ).fetchall()
        )
        assert "runs_daily_open_job" in indexes
        assert not [name for name, d in indexes.items() if "state" in d]
        # No day partition made: the run lands in the DEFAULT one.
        conn.execute(
            "INSERT INTO runs_daily (partition_id, run_id, tenant_id, job_id, scheduled_at, spec)"
            " VALUES (1, '001' || repeat('a', 29), 't', 'job_1', now(), '{}')"
        )
        conn.commit()
        conn.execute(
            "UPDATE runs_daily SET state = 'RUNNING', start_token = 'tok', worker_id = 'w',"
            " started_at = now(), lease_expires_at = now() + interval '30 s', updated_at = now()"
        )
        hot = "SELECT pg_stat_get_xact_tuples_hot_updated('runs_daily_default'::regclass)"
        assert conn.execute(hot).fetchone()[0] == 1
        # What overlap checks ask (firing.sql jobs_for_timers) is its predicate.
        indexdef = indexes["runs_daily_open_job"]
        assert "(job_id)" in indexdef and "finished_at IS NULL" in indexdef
