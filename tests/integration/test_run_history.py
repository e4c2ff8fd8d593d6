"""Run history by day (issue 25; migration 0025): runs mirrored into
runs_daily in their writers' transactions, a duplicate fire still one run
across a day boundary, the backfill resumable after a kill and copying every
row once, retention dropping whole days yet keeping a run not finished, a
tenant's own retention, set by the operator, honoured; (v0.3.0) the run
reads from runs_daily, cut at the tenant's retention, a dropped day gone from
them; and the contract steps (0030-0031): `runs` and `run_attempts` gone, the
backfill done with nothing to copy.

The mirror and the backfill need the legacy tables: their tests run on a
database migrated without the contract steps (expand_only_admin_database_url),
as a platform has it mid-upgrade; the others on the whole schema."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
from datetime import UTC, date, datetime, timedelta

import psycopg
import pytest

from cronwheel import run_history
from cronwheel.core.clock import iso, to_ms
from cronwheel.core.ssrf import allowed_networks
from cronwheel.kafka import Topics
from cronwheel.store import runs_daily
from services.gateway.app import create_app
from tests.support.gateway import served
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration

OPERATOR_KEY = "cwop_run_history_operator_key_0123456789abcd"
OP = {"Authorization": f"Bearer {OPERATOR_KEY}"}
EVERY_SECOND = {"cron": "* * * * * *", "timezone": "UTC"}


def _gateway(database_url: str, kafka_bootstrap: str, topic_prefix: str):
    app = create_app(
        database_url, Topics(topic_prefix), kafka_bootstrap, OPERATOR_KEY,
        webhook_allow=allowed_networks("127.0.0.0/8"),
    )  # fmt: skip
    return served(app)


@pytest.fixture
def client(database_url, kafka_bootstrap, topic_prefix):
    with _gateway(database_url, kafka_bootstrap, topic_prefix) as c:
        yield c


@pytest.fixture
def legacy_client(expand_only_database_url, kafka_bootstrap, topic_prefix):
    """A gateway on the database without the contract steps (`runs` still there)."""
    with _gateway(expand_only_database_url, kafka_bootstrap, topic_prefix) as c:
        yield c


def _tenant(client, name: str) -> dict:
    r = client.post("/v1/tenants", json={"name": name}, headers=OP)
    assert r.status_code == 201, r.text
    return {
        "tenant_id": r.json()["tenant_id"],
        "auth": {"Authorization": f"Bearer {r.json()['api_key']}"},
    }


def _job(client, tenant: dict) -> str:
    body = {"name": "every-second", "schedule": EVERY_SECOND,
            "target": {"type": "queue", "queue": "work"}}  # fmt: skip
    r = client.post("/v1/jobs", json=body, headers=tenant["auth"])
    assert r.status_code == 201, r.text
    return r.json()["job_id"]


def _tenant_job(client, name: str) -> tuple[dict, str]:
    """A new tenant and its job firing every second (fired by _fire only: no timer runs)."""
    t = _tenant(client, name)
    return t, _job(client, t)


def _fire(client, tenant: dict, job_id: str, start: datetime, end: datetime) -> dict:
    """The job's instants in [start, end] fired through the firing loop's insert
    (a job backfill computes the same deterministic ids as a scheduled fire)."""
    body = {"from": iso(to_ms(start)), "to": iso(to_ms(end))}
    r = client.post(f"/v1/jobs/{job_id}/backfill", json=body, headers=tenant["auth"])
    assert r.status_code == 200, r.text
    return r.json()


def _two_runs(client, name: str, admin_database_url: str) -> tuple[dict, str, list[str]]:
    """A tenant and job of `name`, fired for two instants 30 s and 29 s ago;
    the runs' ids, in order."""
    t, job = _tenant_job(client, name)
    now = datetime.now(UTC).replace(microsecond=0)
    _fire(client, t, job, now - timedelta(seconds=30), now - timedelta(seconds=28))
    with psycopg.connect(admin_database_url, autocommit=True) as conn:
        return t, job, [r[0] for r in _runs_at(conn, job)]


def _runs_at(conn, job_id: str) -> list[tuple]:
    """(run_id, scheduled_at, the table holding it) of the job's runs in runs_daily."""
    return conn.execute(
        "SELECT run_id, scheduled_at, tableoid::regclass::text FROM runs_daily"
        " WHERE job_id = %s ORDER BY scheduled_at",
        [job_id],
    ).fetchall()


def _start(client, tenant: dict, run_id: str) -> dict:
    r = client.post(f"/v1/runs/{run_id}/start", json={"worker_id": "w"}, headers=tenant["auth"])
    assert r.status_code == 200, r.text
    return r.json()


def _succeed(client, tenant: dict, run_id: str) -> None:
    got = _start(client, tenant, run_id)
    body = {"attempt": got["attempt"], "start_token": got["start_token"], "outcome": "SUCCEEDED"}
    r = client.post(f"/v1/runs/{run_id}/complete", json=body, headers=tenant["auth"])
    assert r.status_code == 200, r.text


def _midnight(day: date) -> datetime:
    return datetime(day.year, day.month, day.day, tzinfo=UTC)


def _same_rows(conn) -> tuple[int, int]:
    """runs == runs_daily and run_attempts == run_attempts_daily, row for row
    (AssertionError naming the difference); returns the two counts. On a
    database without the contract steps (expand_only_admin_database_url)."""
    cols = ", ".join(
        r[0]
        for r in conn.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = 'runs'"
            " ORDER BY ordinal_position"
        )
    )
    for a, b in (("runs", "runs_daily"), ("runs_daily", "runs")):
        diff = conn.execute(f"SELECT run_id FROM (SELECT {cols} FROM {a} EXCEPT ALL"
                            f" SELECT {cols} FROM {b}) d").fetchall()  # fmt: skip
        assert not diff, f"in {a}, not in {b}: {diff[:5]}"
    att = "partition_id, run_id, attempt, worker_id, started_at, finished_at, outcome, error"
    for a, b in (("run_attempts", "run_attempts_daily"), ("run_attempts_daily", "run_attempts")):
        diff = conn.execute(f"SELECT {att} FROM {a} EXCEPT ALL SELECT {att} FROM {b}").fetchall()
        assert not diff, f"in {a}, not in {b}: {diff[:5]}"
    n = conn.execute("SELECT count(*) FROM runs").fetchone()[0]
    m = conn.execute("SELECT count(*) FROM run_attempts").fetchone()[0]
    return n, m


# -- the expand step: both shapes written in the same transaction -----------------------
# (on the schema before the contract steps, which drop `runs` and the mirror)


def test_mirror__runs_and_attempts__written_updated_and_rolled_back_with_runs(
    legacy_client, expand_only_admin_database_url
):
    """Before the contract steps (a platform mid-upgrade): each write reaches
    the other table in the writer's transaction, and a rollback takes back both."""
    client, admin_database_url = legacy_client, expand_only_admin_database_url
    t, job, run_ids = _two_runs(client, "mirror", admin_database_url)
    _succeed(client, t, run_ids[0])
    _start(client, t, run_ids[1])

    with psycopg.connect(admin_database_url, autocommit=True) as conn:
        assert _same_rows(conn) == (3, 2)
        with pytest.raises(psycopg.errors.DivisionByZero), conn.transaction():
            conn.execute("UPDATE runs SET error = 'gone' WHERE run_id = %s", [run_ids[2]])
            conn.execute("SELECT 1 / 0")
        assert conn.execute(
            "SELECT error FROM runs_daily WHERE run_id = %s", [run_ids[2]]
        ).fetchone() == (None,)
        states = dict(conn.execute("SELECT run_id, state FROM runs_daily").fetchall())
    assert [states[r] for r in run_ids] == ["SUCCEEDED", "RUNNING", "PENDING"]


def test_mirror__both_ways__a_write_on_either_table_reaches_the_other_once(
    legacy_client, expand_only_admin_database_url
):
    """Migration 0029, on the schema before the contract steps: v0.4.0 on
    writes runs_daily (mirrored back to runs), v0.3.0 runs (mirrored to
    runs_daily), both at once during a rolling upgrade. A write crosses
    once: were it mirrored back again, the two triggers would call each
    other until PostgreSQL's stack limit."""
    client, admin_database_url = legacy_client, expand_only_admin_database_url
    t, job = _tenant_job(client, "mirror-both")
    now = datetime.now(UTC).replace(microsecond=0)
    _fire(client, t, job, now - timedelta(seconds=30), now - timedelta(seconds=27))
    with psycopg.connect(admin_database_url, autocommit=True) as conn:
        run_ids = [r[0] for r in _runs_at(conn, job)]
    _start(client, t, run_ids[0])  # this release: runs_daily first

    with psycopg.connect(admin_database_url, autocommit=True) as conn:
        assert _same_rows(conn) == (4, 1)
        # The previous release's writes, on runs and run_attempts.
        conn.execute("UPDATE runs SET error = 'old' WHERE run_id = %s", [run_ids[1]])
        conn.execute(
            "INSERT INTO run_attempts (partition_id, run_id, attempt, worker_id, started_at)"
            " SELECT partition_id, run_id, 1, 'old-worker', now() FROM runs WHERE run_id = %s",
            [run_ids[1]],
        )
        # This release's, on the new tables: an update, then deletes both ways.
        conn.execute("UPDATE runs_daily SET error = 'new' WHERE run_id = %s", [run_ids[2]])
        assert _same_rows(conn) == (4, 2)
        conn.execute("DELETE FROM run_attempts_daily WHERE run_id = %s", [run_ids[1]])
        conn.execute("DELETE FROM runs_daily WHERE run_id = %s", [run_ids[3]])
        conn.execute("DELETE FROM runs WHERE run_id = %s", [run_ids[2]])
        assert _same_rows(conn) == (2, 1)
        errors = dict(conn.execute("SELECT run_id, error FROM runs_daily").fetchall())
    assert errors == {run_ids[0]: None, run_ids[1]: "old"}


def test_duplicate_fire__across_a_day_boundary__still_one_run_per_instant(
    client, admin_database_url
):
    t, job = _tenant_job(client, "boundary")
    today = datetime.now(UTC).date()
    yesterday = today - timedelta(days=1)
    with psycopg.connect(admin_database_url, autocommit=True) as conn:
        runs_daily.ensure_days(conn, [yesterday, today])
    start, end = _midnight(today) - timedelta(seconds=2), _midnight(today) + timedelta(seconds=1)

    first = _fire(client, t, job, start, end)
    again = _fire(client, t, job, start, end)

    assert (first["created"], again["created"], again["already_existed"]) == (4, 0, 4)
    with psycopg.connect(admin_database_url, autocommit=True) as conn:
        rows = _runs_at(conn, job)
        assert [where for _, _, where in rows] == (
            [runs_daily.runs_part(yesterday)] * 2 + [runs_daily.runs_part(today)] * 2
        )
        assert len({run_id for run_id, _, _ in rows}) == 4
        # The key alone refuses the duplicate too: the same run carries the
        # same scheduled_at, so the same key.
        for run_id, _, _ in rows:
            cur = conn.execute(
                "INSERT INTO runs_daily SELECT * FROM runs_daily WHERE run_id = %s"
                " ON CONFLICT (partition_id, run_id, scheduled_at) DO NOTHING",
                [run_id],
            )
            assert cur.rowcount == 0
        assert conn.execute("SELECT count(*) FROM runs_daily").fetchone()[0] == 4


# -- the migrate step: the backfill ------------------------------------------------------
# (from `runs`: on the schema before the contract steps)


def _as_before_the_expand(conn) -> None:
    """runs and run_attempts as a database has them when 0025 is applied: rows
    the mirror never saw (its copies removed, with the reverse mirror of
    migration 0029 held off so that `runs` keeps them), the backfill not done."""
    with conn.transaction():
        conn.execute(
            "ALTER TABLE run_attempts_daily DISABLE TRIGGER run_attempts_legacy_mirror_delete"
        )
        conn.execute("ALTER TABLE runs_daily DISABLE TRIGGER runs_legacy_mirror_delete")
        conn.execute("DELETE FROM run_attempts_daily")
        conn.execute("DELETE FROM runs_daily")
        conn.execute(
            "ALTER TABLE run_attempts_daily ENABLE TRIGGER run_attempts_legacy_mirror_delete"
        )
        conn.execute("ALTER TABLE runs_daily ENABLE TRIGGER runs_legacy_mirror_delete")
    runs_daily.backfill_reset(conn)


def _backfill_row(url: str) -> dict:
    with psycopg.connect(url, autocommit=True) as conn:
        return next(r for r in runs_daily.backfill_rows(conn) if r["name"] == "runs_daily")


def test_backfill__killed_midway_then_resumed__copies_every_row_once(
    legacy_client, expand_only_admin_database_url, tmp_path
):
    """Before the contract steps, which drop `runs`, its source."""
    client, admin_database_url = legacy_client, expand_only_admin_database_url
    t, job = _tenant_job(client, "backfill")
    now = datetime.now(UTC).replace(microsecond=0)
    made = _fire(client, t, job, now - timedelta(seconds=400), now - timedelta(seconds=101))
    n = made["created"]
    assert n == 300
    with psycopg.connect(admin_database_url, autocommit=True) as conn:
        some = [r[0] for r in _runs_at(conn, job)][:5]
    for run_id in some:
        _succeed(client, t, run_id)
    with psycopg.connect(admin_database_url, autocommit=True) as conn:
        _as_before_the_expand(conn)
        assert conn.execute("SELECT count(*) FROM runs_daily").fetchone()[0] == 0

    env = {**os.environ, "CRONWHEEL_ADMIN_DATABASE_URL": admin_database_url}
    log = (tmp_path / "backfill.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "services.entrypoints", "backfill", "--batch", "7", "--rate", "100"],
        env=env, stdout=subprocess.DEVNULL, stderr=log,
    )  # fmt: skip
    try:
        wait_for(lambda: _backfill_row(admin_database_url)["visited"] >= 70,
                 what="the backfill's first batches")  # fmt: skip
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
    killed = _backfill_row(admin_database_url)
    assert 0 < killed["visited"] < n and killed["finished_at"] is None
    assert killed["visited"] % 7 == 0 and killed["copied"] == killed["visited"]

    done = run_history.backfill(admin_database_url, run_history.BackfillOptions(batch=50))

    assert done.done
    assert (done.visited, done.copied, done.copied_attempts) == (n, n, 5)
    with psycopg.connect(admin_database_url, autocommit=True) as conn:
        assert _same_rows(conn) == (n, 5)


def test_backfill__default_partition_locked_while_a_day_is_made__waits_then_copies_all(
    legacy_client, expand_only_admin_database_url, caplog
):
    """A day's partition is made under the default partition's lock, with a
    lock_timeout; an autovacuum of the default partition held it past that
    once (CI, the backfill process died). The backfill waits and goes on."""
    client, admin_database_url = legacy_client, expand_only_admin_database_url
    t, job = _tenant_job(client, "backfill-locked")
    now = datetime.now(UTC).replace(microsecond=0)
    n = _fire(client, t, job, now - timedelta(seconds=60), now - timedelta(seconds=1))["created"]
    with psycopg.connect(admin_database_url, autocommit=True) as conn:
        _as_before_the_expand(conn)
        assert runs_daily.days(conn) == []  # the copy has to make today's
    result: dict = {}
    with psycopg.connect(admin_database_url) as holder:
        # What autovacuum takes; it conflicts with create_day's LOCK TABLE.
        holder.execute("LOCK TABLE runs_daily_default IN SHARE UPDATE EXCLUSIVE MODE")
        copier = threading.Thread(
            target=lambda: result.update(
                done=run_history.backfill(admin_database_url, run_history.BackfillOptions(batch=50))
            ),
            daemon=True,
        )
        with caplog.at_level(logging.WARNING, logger="cronwheel"):
            copier.start()
            wait_for(lambda: "waiting to make a day's partition" in caplog.text, 30,
                     what="the backfill to meet the lock")  # fmt: skip
            holder.rollback()
            copier.join(timeout=60)

    assert result["done"].done and result["done"].copied == n
    with psycopg.connect(admin_database_url, autocommit=True) as conn:
        assert _same_rows(conn) == (n, 0)


def test_backfill__runs_written_while_it_runs__mirrored_not_copied_again(
    legacy_client, expand_only_admin_database_url
):
    """Before the contract steps, which drop `runs`, its source."""
    client, admin_database_url = legacy_client, expand_only_admin_database_url
    t, job = _tenant_job(client, "backfill-live")
    now = datetime.now(UTC).replace(microsecond=0)
    _fire(client, t, job, now - timedelta(seconds=100), now - timedelta(seconds=51))
    with psycopg.connect(admin_database_url, autocommit=True) as conn:
        _as_before_the_expand(conn)
        first = runs_daily.backfill_batch(conn, now, 20, now - timedelta(days=30))
    assert (first.visited, first.copied) == (20, 20)

    with psycopg.connect(admin_database_url, autocommit=True) as conn:
        # The last of the first 50 in the copy's order: not copied yet.
        uncopied = conn.execute(
            "SELECT run_id FROM runs ORDER BY partition_id DESC, run_id DESC LIMIT 1"
        ).fetchone()[0]
    _fire(client, t, job, now - timedelta(seconds=50), now - timedelta(seconds=1))  # 50 more
    with psycopg.connect(admin_database_url, autocommit=True) as conn:
        # The previous release ending it, as that release writes (on runs):
        # this one's worker protocol finds runs in runs_daily only (0026
        # holds it back until the backfill is done). Mirrored before the
        # copy reaches it.
        conn.execute(
            "UPDATE runs SET state = 'SUCCEEDED', finished_at = now(), updated_at = now()"
            " WHERE run_id = %s",
            [uncopied],
        )

    cursor = _backfill_row(admin_database_url)
    with psycopg.connect(admin_database_url, autocommit=True) as conn:
        ahead = conn.execute(
            "SELECT count(*) FROM runs WHERE (partition_id, run_id) > (%s, %s)",
            [cursor["after_partition_id"], cursor["after_run_id"]],
        ).fetchone()[0]

    done = run_history.backfill(admin_database_url, run_history.BackfillOptions(batch=20))

    # Visited: the first 20, then every run after the cursor, new ones among
    # them (those before it are the mirror's alone). Copied: the 29 older runs
    # after the first batch but the updated one, which the mirror wrote whole.
    assert (done.done, done.visited, done.copied, done.copied_attempts) == (
        True, 20 + ahead, 20 + 29, 0
    )  # fmt: skip
    with psycopg.connect(admin_database_url, autocommit=True) as conn:
        assert _same_rows(conn) == (100, 0)


# -- retention -----------------------------------------------------------------------------


def _parts(conn) -> list[date]:
    return runs_daily.days(conn)


def test_retention__day_past_the_horizon__dropped_whole_and_unfinished_run_kept(
    client, admin_database_url
):
    t, job = _tenant_job(client, "retention")
    today = datetime.now(UTC).date()
    old, recent = today - timedelta(days=40), today - timedelta(days=1)
    for day in (old, recent):
        _fire(client, t, job, _midnight(day) + timedelta(hours=12),
              _midnight(day) + timedelta(hours=12, seconds=2))  # fmt: skip
    with psycopg.connect(admin_database_url, autocommit=True) as conn:
        rows = _runs_at(conn, job)
        # Fired before their days had partitions: in the default one, then moved.
        assert {where for _, _, where in rows} == {"runs_daily_default"}
        runs_daily.ensure_days(conn, [old, recent])
        rows = _runs_at(conn, job)
        assert [where for _, _, where in rows] == (
            [runs_daily.runs_part(old)] * 3 + [runs_daily.runs_part(recent)] * 3
        )
    old_ids = [r[0] for r in rows[:3]]
    _succeed(client, t, old_ids[0])
    _succeed(client, t, old_ids[1])
    started = _start(client, t, old_ids[2])  # RUNNING, 40 days after its instant

    done = run_history.retention_pass(admin_database_url, default_days=30, ahead_days=2)

    assert [d.day for d in done.dropped] == [old]
    assert done.dropped[0].kept_runs == 1 and done.dropped[0].kept_attempts == 1
    with psycopg.connect(admin_database_url, autocommit=True) as conn:
        assert _parts(conn) == [recent, today, today + timedelta(days=1), today + timedelta(days=2)]
        assert conn.execute(
            "SELECT to_regclass(%s), to_regclass(%s)",
            [runs_daily.runs_part(old), runs_daily.attempts_part(old)],
        ).fetchone() == (None, None)
        left = _runs_at(conn, job)
        assert [(r[0], r[2]) for r in left[:1]] == [(old_ids[2], "runs_daily_default")]
        assert len(left) == 4
        assert conn.execute(
            "SELECT state FROM runs_daily WHERE run_id = %s", [old_ids[2]]
        ).fetchone() == ("RUNNING",)
        assert conn.execute(
            "SELECT count(*) FROM run_attempts_daily WHERE run_id = ANY(%s)", [old_ids]
        ).fetchone() == (1,)

    # Finished, the kept run goes from the default partition by the next pass.
    body = {"attempt": started["attempt"], "start_token": started["start_token"],
            "outcome": "SUCCEEDED"}  # fmt: skip
    got = client.post(f"/v1/runs/{old_ids[2]}/complete", json=body, headers=t["auth"])
    assert got.status_code == 200, got.text
    again = run_history.retention_pass(admin_database_url, default_days=30, ahead_days=2)
    assert again.dropped == [] and again.default_deleted == 1
    with psycopg.connect(admin_database_url, autocommit=True) as conn:
        assert len(_runs_at(conn, job)) == 3
        assert conn.execute("SELECT count(*) FROM run_attempts_daily_default").fetchone() == (0,)


def test_retention__a_writer_closes_a_deadlock_with_a_days_ddl__the_day_tried_again_and_made(
    admin_database_url, monkeypatch
):
    """Making a day locks both default partitions, runs' first; a writer's
    transaction that holds attempts' default and then asks for runs' closes a
    cycle, and PostgreSQL fails the one that waited first (CI saw `cronwheel
    retention` exit with `deadlock detected`). Rolled back whole, the day's
    DDL is tried again and the day is made.

    PostgreSQL looks for a cycle once per waiter, deadlock_timeout (1 s) after
    its wait began. The day's DDL is the victim only if the writer's request
    comes inside that second; on a loaded machine it came later once (CI), the
    DDL's look found no cycle yet and the writer's look failed the writer. That
    round shows nothing, so it is set up again on another day, up to 5 times."""
    # Above deadlock_timeout (1 s), so the cycle, not the lock timeout, ends the wait.
    monkeypatch.setattr(runs_daily, "LOCK_TIMEOUT", "20s")
    late = []
    for round_ in range(5):
        day = datetime.now(UTC).date() + timedelta(days=20 + round_)
        made, writer_failed = _deadlock_round(admin_database_url, day)
        if not writer_failed:
            break
        late.append(day)
        assert made == [day], made  # the writer was the victim: the DDL went on
    else:
        raise AssertionError(f"the writer's request came too late every round: {late}")

    assert made == [day], made
    with psycopg.connect(admin_database_url, autocommit=True) as conn:
        assert day in runs_daily.days(conn)


def _deadlock_round(admin_database_url: str, day: date) -> tuple[object, bool]:
    """One round: the day's DDL waits holding runs' default, the writer closes
    the cycle. Returns what ensure_days returned (or raised) and whether the
    writer was the one failed."""
    result: dict = {}

    def make() -> None:
        try:
            with psycopg.connect(admin_database_url, autocommit=True) as conn:
                result["made"] = runs_daily.ensure_days(conn, [day])
        except psycopg.Error as e:
            result["made"] = e

    writer_failed = False
    with (
        psycopg.connect(admin_database_url) as writer,
        psycopg.connect(admin_database_url, autocommit=True) as watch,
    ):
        writer.execute("LOCK TABLE run_attempts_daily_default IN ROW EXCLUSIVE MODE")
        maker = threading.Thread(target=make, daemon=True)
        maker.start()
        wait_for(
            lambda: watch.execute(
                "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation"
                " WHERE NOT l.granted AND c.relname = 'run_attempts_daily_default'"
            ).fetchone()[0] == 1,
            30, what="the day's DDL to hold runs' default and wait for attempts'",
        )  # fmt: skip
        try:
            writer.execute("LOCK TABLE runs_daily_default IN ROW EXCLUSIVE MODE")  # the cycle
            writer.commit()
        except psycopg.errors.DeadlockDetected:
            writer.rollback()
            writer_failed = True
        maker.join(timeout=60)
    return result.get("made"), writer_failed


def test_retention__a_tenants_longer_override__keeps_the_day_until_it_passes(
    client, admin_database_url
):
    t, job = _tenant_job(client, "keeps-long")
    today = datetime.now(UTC).date()
    old = today - timedelta(days=40)
    _fire(client, t, job, _midnight(old), _midnight(old) + timedelta(seconds=1))
    with psycopg.connect(admin_database_url, autocommit=True) as conn:
        runs_daily.ensure_days(conn, [old])
    r = client.put(f"/v1/tenants/{t['tenant_id']}/retention",
                   json={"run_retention_days": 60}, headers=OP)  # fmt: skip
    assert r.status_code == 200, r.text
    assert r.json() == {"tenant_id": t["tenant_id"], "run_retention_days": 60,
                        "default_days": 30, "effective_days": 60}  # fmt: skip

    kept = run_history.retention_pass(admin_database_url, default_days=30, ahead_days=1)

    assert kept.dropped == []
    r = client.put(f"/v1/tenants/{t['tenant_id']}/retention",
                   json={"run_retention_days": None}, headers=OP)  # fmt: skip
    assert r.status_code == 200 and r.json()["effective_days"] == 30
    gone = run_history.retention_pass(admin_database_url, default_days=30, ahead_days=1)
    assert [d.day for d in gone.dropped] == [old]
    r = client.get(f"/v1/tenants/{t['tenant_id']}/retention", headers=OP)
    assert r.status_code == 200 and r.json()["run_retention_days"] is None


def test_retention__a_pass_killed_between_detach_and_drop__next_pass_drops_the_tables(
    admin_database_url,
):
    old = datetime.now(UTC).date() - timedelta(days=40)
    with psycopg.connect(admin_database_url, autocommit=True) as conn:
        runs_daily.ensure_days(conn, [old])
        conn.execute(f"ALTER TABLE runs_daily DETACH PARTITION {runs_daily.runs_part(old)}")
        conn.execute(
            f"ALTER TABLE run_attempts_daily DETACH PARTITION {runs_daily.attempts_part(old)}"
        )
        assert runs_daily.detached(conn) == [old]

    run_history.retention_pass(admin_database_url, default_days=30, ahead_days=1)

    with psycopg.connect(admin_database_url, autocommit=True) as conn:
        assert runs_daily.detached(conn) == []
        assert conn.execute(
            "SELECT to_regclass(%s), to_regclass(%s)",
            [runs_daily.runs_part(old), runs_daily.attempts_part(old)],
        ).fetchone() == (None, None)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"run_retention_days": 0}, "run_retention_days"),
        ({"run_retention_days": 3651}, "run_retention_days"),
        ({"run_retention_days": "30"}, "run_retention_days"),
        ({"run_retention_days": True}, "run_retention_days"),
        ({}, "run_retention_days"),
        ({"run_retention_days": 30, "days": 3}, "days"),
    ],
)
def test_put_retention__bad_body__422_naming_the_field(client, body, field):
    t = _tenant(client, "bad-body")
    r = client.put(f"/v1/tenants/{t['tenant_id']}/retention", json=body, headers=OP)
    assert r.status_code == 422, r.text
    assert field in r.text


def test_retention_routes__operator_only_and_unknown_tenant_404(client):
    t = _tenant(client, "op-only")
    body = {"run_retention_days": 7}
    r = client.put(f"/v1/tenants/{t['tenant_id']}/retention", json=body, headers=t["auth"])
    assert r.status_code == 403, r.text
    r = client.put("/v1/tenants/ten_nobody/retention", json=body, headers=OP)
    assert r.status_code == 404, r.text


# -- the reads switched (v0.3.0): from runs_daily, cut at the tenant's retention ---------


def _listed(client, tenant: dict, job_id: str) -> set[str]:
    r = client.get("/v1/runs", params={"job_id": job_id, "limit": 200}, headers=tenant["auth"])
    assert r.status_code == 200, r.text
    return {run["run_id"] for run in r.json()["items"]}


def _retention(client, tenant: dict, days: int | None) -> None:
    r = client.put(f"/v1/tenants/{tenant['tenant_id']}/retention",
                   json={"run_retention_days": days}, headers=OP)  # fmt: skip
    assert r.status_code == 200, r.text


def test_run_reads__cut_at_the_tenants_retention__unfinished_runs_shown(
    client,
    admin_database_url,
):
    t, job = _tenant_job(client, "reads")
    today = datetime.now(UTC).date()
    old, recent = today - timedelta(days=40), today - timedelta(days=1)
    _fire(client, t, job, _midnight(old), _midnight(old) + timedelta(seconds=1))
    _fire(client, t, job, _midnight(recent), _midnight(recent))
    with psycopg.connect(admin_database_url, autocommit=True) as conn:
        done, pending, fresh = (r[0] for r in _runs_at(conn, job))
    _succeed(client, t, done)
    _succeed(client, t, fresh)

    assert _listed(client, t, job) == {pending, fresh}
    assert client.get(f"/v1/runs/{done}", headers=t["auth"]).status_code == 404
    got = client.get(f"/v1/runs/{fresh}", headers=t["auth"])
    assert got.status_code == 200 and [a["outcome"] for a in got.json()["attempts"]] == [
        "SUCCEEDED"
    ]
    _retention(client, t, 60)
    assert _listed(client, t, job) == {done, pending, fresh}
    _retention(client, t, 1)
    assert _listed(client, t, job) == {pending}  # `fresh` is from yesterday's midnight


def test_run_reads__day_dropped_by_retention__gone_its_unfinished_run_kept(
    client,
    admin_database_url,
):
    t, job = _tenant_job(client, "reads-dropped")
    old = datetime.now(UTC).date() - timedelta(days=40)
    _fire(client, t, job, _midnight(old), _midnight(old) + timedelta(seconds=1))
    with psycopg.connect(admin_database_url, autocommit=True) as conn:
        runs_daily.ensure_days(conn, [old])
        done, pending = (r[0] for r in _runs_at(conn, job))
    _succeed(client, t, done)
    _retention(client, t, 60)
    assert _listed(client, t, job) == {done, pending}
    _retention(client, t, None)

    dropped = run_history.retention_pass(admin_database_url, default_days=30, ahead_days=1)

    assert [d.day for d in dropped.dropped] == [old]
    _retention(client, t, 60)
    assert _listed(client, t, job) == {pending}
    assert client.get(f"/v1/runs/{pending}", headers=t["auth"]).json()["state"] == "PENDING"


# -- the contract steps (0030-0031): the legacy tables gone ------------------------------


def _snapshot(conn) -> tuple:
    """Every row of the run history and the backfill's progress, as they stand."""
    return (
        conn.execute("SELECT * FROM runs_daily ORDER BY run_id").fetchall(),
        conn.execute("SELECT * FROM run_attempts_daily ORDER BY run_id, attempt").fetchall(),
        conn.execute("SELECT * FROM backfills ORDER BY name").fetchall(),
    )


def test_contract__legacy_tables_and_mirror_gone__backfill_done_and_changes_nothing(
    client, admin_database_url
):
    """The whole schema (contract steps applied): `runs`, `run_attempts`, the
    mirror's triggers and functions are gone; `cronwheel backfill` has nothing
    left to copy, says so in one line and writes nothing, not even `--reset`'s
    rewind, whatever the backfill's row said; `cronwheel migrate --status`
    still reports."""
    t, job, run_ids = _two_runs(client, "contract", admin_database_url)
    _succeed(client, t, run_ids[0])
    with psycopg.connect(admin_database_url, autocommit=True) as conn:
        assert conn.execute(
            "SELECT to_regclass('runs'), to_regclass('run_attempts')"
        ).fetchone() == (None, None)
        assert (
            conn.execute("SELECT proname FROM pg_proc WHERE proname LIKE '%mirror%'").fetchall()
            == []
        )
        assert (
            conn.execute(
                "SELECT tgname FROM pg_trigger WHERE NOT tgisinternal"
                " AND tgrelid IN ('runs_daily'::regclass, 'run_attempts_daily'::regclass)"
            ).fetchall()
            == []
        )
        before = _snapshot(conn)
    assert len(before[0]) == 3 and len(before[1]) == 1 and before[2][0][-1] is not None

    env = {**os.environ, "CRONWHEEL_ADMIN_DATABASE_URL": admin_database_url}
    command = [sys.executable, "-m", "services.entrypoints"]
    out = subprocess.run([*command, "backfill", "--reset"], env=env, capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "backfill runs_daily: done, nothing to copy (`runs` was dropped by the contract step)"
    ]
    with psycopg.connect(admin_database_url, autocommit=True) as conn:
        assert _snapshot(conn) == before
        # As a `--reset` before the contract steps left it: not finished.
        runs_daily.backfill_reset(conn)
        reset = _snapshot(conn)

    done = run_history.backfill(admin_database_url, run_history.BackfillOptions(batch=10))

    assert done.done and done.source_dropped and (done.visited, done.copied) == (0, 0)
    with psycopg.connect(admin_database_url, autocommit=True) as conn:
        assert _snapshot(conn) == reset
    status = subprocess.run([*command, "migrate", "--status"], env=env, capture_output=True,
                            text=True, timeout=60)  # fmt: skip
    assert status.returncode == 0, status.stderr
    lines = status.stdout.splitlines()
    contract = [line.split()[1:] for line in lines if line.startswith(("0030_", "0031_"))]
    assert contract == [["contract", "applied"]] * 2, status.stdout
    [backfill] = [line for line in lines if line.startswith("backfill ")]
    assert backfill.endswith("; done: nothing to copy, `runs` was dropped (contract step)")
