"""The worker protocol finds a run by id within the days around now first,
then over every day (cronwheel/store/lifecycle.py, "where a run is looked
for"): a run whose instant is days away from now, in its own day's partition,
is started, heartbeaten, completed, retried and cancelled as a recent one is,
one call at a time and in batches; a call about no run is still NOT_FOUND."""

from __future__ import annotations

from datetime import timedelta

import psycopg
import pytest

from cronwheel.core.clock import to_dt
from cronwheel.core.errors import Conflict, NotFound
from cronwheel.kafka import Topics
from cronwheel.store import runs_daily, webhooks
from cronwheel.store.jobs import Jobs, create_tenant
from cronwheel.store.lifecycle import CompleteCall, Lifecycle, StartCall
from cronwheel.store.run_days import recent_days
from cronwheel.store.timers import FireReport, Timer

pytestmark = pytest.mark.integration

T0 = 1_900_000_000_000  # 2030-03-17 17:46:40 UTC
DAY_MS = 86_400_000


@pytest.fixture
def world(admin_database_url, database_url, topic_prefix):
    today = to_dt(T0).date()
    with psycopg.connect(admin_database_url, autocommit=True) as owner:
        runs_daily.ensure_days(owner, [today + timedelta(days=d) for d in range(-6, 5)])
    with psycopg.connect(database_url, autocommit=True) as conn:
        topics = Topics(topic_prefix)
        jobs = Jobs(topics)
        tenant = create_tenant(conn, "acme")
        job = jobs.create(
            conn,
            tenant,
            {
                "name": "work",
                "schedule": {"cron": "0 0 1 1 *", "timezone": "UTC"},
                "target": {"type": "queue", "queue": "q"},
                "retry": {"max_attempts": 3, "initial_backoff_ms": 1000},
            },
            T0,
        )
        made = iter(range(10**6))

        def run(at: int) -> str:
            return jobs.trigger(conn, tenant, job["job_id"], at + next(made))["run_id"]

        yield conn, Lifecycle(topics), tenant["tenant_id"], run


def _table(conn, run_id: str) -> str:
    return conn.execute(
        "SELECT tableoid::regclass::text FROM runs_daily WHERE run_id = %s", [run_id]
    ).fetchone()[0]


def test_run_days_old__outside_the_first_window__every_call_still_finds_it(world):
    conn, life, t, run = world
    old, old2, old3 = (run(T0 - 5 * DAY_MS) for _ in range(3))
    recent, future = run(T0 - 1000), run(T0 + 3 * DAY_MS)
    window = recent_days(T0)
    assert _table(conn, old).endswith("_p20300312")  # five days before T0's day
    assert to_dt(T0 - 5 * DAY_MS) < window.lo and to_dt(T0 + 3 * DAY_MS) >= window.hi

    # One at a time: start, heartbeat, a retryable failure (its policy read),
    # then a stale CompleteRun of the attempt that ended.
    got = life.start(conn, t, old, "w", T0)
    assert got["attempt"] == 1
    assert life.heartbeat(conn, t, old, 1, got["start_token"], T0)["lease_expires_at"]
    ended = life.complete(conn, t, old, 1, got["start_token"], "FAILED", T0, error="x")
    assert ended == {"state": "RETRY_WAIT", "attempt": 1}
    with pytest.raises(Conflict) as stale:
        life.complete(conn, t, old, 1, got["start_token"], "SUCCEEDED", T0)
    assert stale.value.code == "STALE_ATTEMPT"

    # In a batch, beside a recent run: both start and both complete.
    started = life.start_many(conn, [StartCall(t, old2, "w"), StartCall(t, recent, "w")], T0)
    assert [(s["run_id"], s["attempt"]) for s in started] == [(old2, 1), (recent, 1)]
    done = life.complete_many(
        conn,
        [
            CompleteCall(t, old2, 1, started[0]["start_token"], "FAILED", retryable=True),
            CompleteCall(t, recent, 1, started[1]["start_token"], "SUCCEEDED"),
        ],
        T0,
    )
    assert done == [{"state": "RETRY_WAIT", "attempt": 1}, {"state": "SUCCEEDED", "attempt": 1}]

    # A cancel; a run not due yet is found and refused as such; no run is 404.
    assert life.cancel(conn, t, old3, T0) == {"state": "CANCELLED"}
    with pytest.raises(Conflict) as early:
        life.start(conn, t, future, "w", T0)
    assert early.value.code == "NOT_RUNNABLE"
    assert life.spec(conn, t, future, T0)["target"] == {"type": "queue", "queue": "q"}
    with pytest.raises(NotFound):
        life.start(conn, t, "000" + "f" * 29, "w", T0)

    states = dict(conn.execute("SELECT run_id, state FROM runs_daily").fetchall())
    assert [states[r] for r in (old, old2, old3, recent, future)] == [
        "RETRY_WAIT", "RETRY_WAIT", "CANCELLED", "SUCCEEDED", "PENDING",
    ]  # fmt: skip
    attempts = conn.execute(
        "SELECT run_id, outcome FROM run_attempts_daily WHERE run_id = ANY(%s) ORDER BY run_id",
        [[old, old2]],
    ).fetchall()
    assert sorted(attempts) == sorted([(old, "FAILED"), (old2, "FAILED")])


def test_delivery_targets__run_days_old__found_beside_recent_ones(world):
    conn, _life, _t, run = world
    old, recent = run(T0 - 5 * DAY_MS), run(T0 - 1000)

    got = webhooks.delivery_targets(conn, [old, recent, "000" + "e" * 29, "not-a-run"], T0)

    assert sorted(got) == sorted([old, recent])
    assert got[old].state == "PENDING" and got[old].attempt == 1


def _timer(conn, run_id: str, kind: str) -> Timer:
    p, timer_id, owner, due, attempt, tenant, prio = conn.execute(
        "SELECT partition_id, timer_id, owner_id, due_at, attempt, tenant_id, priority"
        " FROM timers WHERE owner_id = %s AND kind = %s",
        [run_id, kind],
    ).fetchone()
    return Timer(p, timer_id, kind, owner, int(due.timestamp() * 1000), attempt, tenant, prio)


def test_timers_of_a_run_days_old__retry_and_lease_expiry__end_and_bring_it_back(world):
    conn, life, t, run = world
    old = run(T0 - 5 * DAY_MS)
    got = life.start(conn, t, old, "w", T0)
    life.complete(conn, t, old, 1, got["start_token"], "FAILED", T0, error="x")

    retry = _timer(conn, old, "retry")
    with conn.transaction():
        assert len(life.on_retry(conn, [retry], retry.due_ms, FireReport())) == 1
    again = life.start(conn, t, old, "w", retry.due_ms)
    assert again["attempt"] == 2
    lease = _timer(conn, old, "lease")
    with conn.transaction():
        life.on_expiry(conn, [lease], lease.due_ms + 1, FireReport())

    state = conn.execute(
        "SELECT state, attempt FROM runs_daily WHERE run_id = %s", [old]
    ).fetchone()
    assert state == ("RETRY_WAIT", 2)
    outcomes = conn.execute(
        "SELECT attempt, outcome FROM run_attempts_daily WHERE run_id = %s ORDER BY attempt", [old]
    ).fetchall()
    assert outcomes == [(1, "FAILED"), (2, "TIMED_OUT")]


def test_heartbeat__repeated__its_prepared_statement_keeps_the_generic_plan(world):
    """The recent days are constants in the statement's text and every other
    value a parameter, so a custom plan is no cheaper than the generic one and
    PostgreSQL keeps the generic plan (lifecycle.sql, run_days.py). Were the
    bounds parameters folded at planning, each call would be planned anew."""
    conn, life, t, run = world
    recent = run(T0 - 1000)
    got = life.start(conn, t, recent, "w", T0)
    for i in range(20):
        life.heartbeat(conn, t, recent, 1, got["start_token"], T0 + i)
    plans = conn.execute(
        "SELECT generic_plans, custom_plans FROM pg_prepared_statements"
        " WHERE statement LIKE '%UPDATE runs_daily%SET lease_expires_at%'"
    ).fetchone()
    assert plans is not None and plans[0] >= 5, conn.execute(
        "SELECT left(statement, 60), generic_plans, custom_plans FROM pg_prepared_statements"
    ).fetchall()


def test_heartbeat__its_generic_plan_locks_only_the_recent_days(world):
    """PostgreSQL 15 locks every partition a generic plan names, at each
    execution, before it prunes; the recent days written into the statement
    as constants are pruned at planning, so the plan names only theirs
    (run_days.py). With the bounds as parameters, each heartbeat locked all
    eleven days of this fixture and the default partition."""
    conn, life, t, run = world
    recent = run(T0 - 1000)
    got = life.start(conn, t, recent, "w", T0)
    # psycopg prepares the statement at its 6th run, and PostgreSQL makes five
    # custom plans of it before the generic one: 16 runs reach the generic plan.
    for i in range(16):
        with conn.transaction():
            life.heartbeat(conn, t, recent, 1, got["start_token"], T0 + i)
            locked = conn.execute(
                "SELECT c.relname FROM pg_locks l JOIN pg_class c ON c.oid = l.relation"
                " WHERE l.pid = pg_backend_pid() AND c.relkind = 'r'"
                " AND c.relname LIKE 'runs_daily%%' ORDER BY 1"
            ).fetchall()
    generic = conn.execute(
        "SELECT generic_plans FROM pg_prepared_statements"
        " WHERE statement LIKE '%UPDATE runs_daily%SET lease_expires_at%'"
    ).fetchone()
    assert generic is not None and generic[0] >= 1  # the last heartbeats ran the generic plan
    assert [name for (name,) in locked] == [
        "runs_daily_p20300316",
        "runs_daily_p20300317",
        "runs_daily_p20300318",
    ]
