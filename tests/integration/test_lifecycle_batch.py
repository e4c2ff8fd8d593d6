"""start_many / complete_many: each call's answer and effects are what the call
alone gives (the single-call path is the oracle, run on twin runs), repeats of
a run within one batch see the earlier call, and a job's buffered instant is
released once however many of its runs end in the batch."""

from __future__ import annotations

import psycopg
import pytest

from cronwheel.core.clock import to_dt, to_ms
from cronwheel.core.errors import ValidationError
from cronwheel.kafka import Topics
from cronwheel.store import lifecycle
from cronwheel.store.jobs import Jobs, create_tenant
from cronwheel.store.lifecycle import CompleteCall, Lifecycle, StartCall
from cronwheel.store.run_days import recent_days

pytestmark = pytest.mark.integration

T0 = 1_900_000_000_000


@pytest.fixture
def conn(database_url):
    with psycopg.connect(database_url, autocommit=True) as c:
        yield c


@pytest.fixture
def world(conn, topic_prefix):
    topics = Topics(topic_prefix)
    jobs = Jobs(topics)
    acme, other = create_tenant(conn, "acme"), create_tenant(conn, "other")

    def job(tenant, **extra) -> dict:
        body = {
            "name": "work",
            "schedule": {"cron": "0 0 1 1 *", "timezone": "UTC"},
            "target": {"type": "queue", "queue": "q"},
            "retry": {"max_attempts": 2, "initial_backoff_ms": 1000},
            **extra,
        }
        return jobs.create(conn, tenant, body, T0)

    made = iter(range(10**6))  # a trigger's run id is its job's and instant's

    def runs(tenant, j, n: int) -> list[str]:
        return [
            jobs.trigger(conn, tenant, j["job_id"], T0 + next(made))["run_id"] for _ in range(n)
        ]

    return topics, Lifecycle(topics), acme, other, job, runs


def outcome(answer) -> tuple:
    """An answer without what differs between twins (tokens, ids, expiry)."""
    if isinstance(answer, Exception):
        return type(answer).__name__, getattr(answer, "code", None), getattr(answer, "field", None)
    return tuple(sorted((k, v) for k, v in answer.items() if k in ("attempt", "state", "payload")))


def effects(conn, topics: Topics, run_id: str) -> tuple:
    """The state a run is left in: its row, attempts, timers and records."""
    run = conn.execute(
        "SELECT state, attempt, worker_id IS NOT NULL, start_token IS NOT NULL,"
        " lease_expires_at IS NOT NULL, finished_at IS NOT NULL FROM runs_daily WHERE run_id = %s",
        [run_id],
    ).fetchone()
    attempts = conn.execute(
        "SELECT attempt, outcome, finished_at IS NOT NULL FROM run_attempts_daily"
        " WHERE run_id = %s ORDER BY attempt",
        [run_id],
    ).fetchall()
    timers = conn.execute(
        "SELECT kind, attempt FROM timers WHERE owner_id = %s ORDER BY kind", [run_id]
    ).fetchall()
    records = conn.execute(
        "SELECT count(*) FROM outbox WHERE key = %s AND topic = %s",
        [run_id.encode(), topics.run_completed],
    ).fetchone()[0]
    return run, attempts, timers, records


NOW = T0 + 10


def test_start_many__each_call_answered_and_left_as_alone(conn, world):
    topics, life, acme, other, job, runs = world
    j, j_other = job(acme), job(other)
    # Twin sets: the oracle takes `single` one call at a time, the batch `batch`.
    single, batch = runs(acme, j, 4), runs(acme, j, 4)
    foreign = runs(other, j_other, 1)[0]

    def calls(r: list[str]) -> list[StartCall]:
        return [
            StartCall(acme["tenant_id"], r[0], "w1"),
            StartCall(acme["tenant_id"], r[0], "w2"),  # the same run again: ALREADY_STARTED
            StartCall(acme["tenant_id"], r[1], "w1", attempt=2),  # STALE_ATTEMPT
            StartCall(acme["tenant_id"], foreign, "w1"),  # another tenant's: not found
            StartCall(acme["tenant_id"], "not-a-run-id", "w1"),
            StartCall(acme["tenant_id"], r[2], ""),  # invalid worker_id
            StartCall(acme["tenant_id"], r[3], "w1", attempt=1),
        ]

    alone = []
    for c in calls(single):
        try:
            alone.append(life.start(conn, c.tenant_id, c.run_id, c.worker_id, NOW, c.attempt))
        except Exception as e:  # noqa: BLE001 - the answer under comparison
            alone.append(e)
    together = life.start_many(conn, calls(batch), NOW)

    assert [outcome(a) for a in together] == [outcome(a) for a in alone]
    assert outcome(together[1])[1] == "ALREADY_STARTED"
    assert outcome(together[2])[1] == "STALE_ATTEMPT"
    assert outcome(together[3])[0] == "NotFound"
    assert isinstance(together[5], ValidationError) and together[5].field == "worker_id"
    assert together[0]["start_token"] and together[0]["run_id"] == batch[0]
    for s, b in zip(single, batch, strict=True):
        assert effects(conn, topics, b) == effects(conn, topics, s)
    assert effects(conn, topics, foreign)[0][0] == "PENDING"


def test_complete_many__each_call_answered_and_left_as_alone(conn, world):
    topics, life, acme, _other, job, runs = world
    j = job(acme)
    single, batch = runs(acme, j, 5), runs(acme, j, 5)
    t = acme["tenant_id"]

    def started(r: list[str]) -> list[dict]:
        got = life.start_many(conn, [StartCall(t, run, "w") for run in r], NOW)
        assert all(isinstance(g, dict) for g in got), got
        return got

    def calls(r: list[str], s: list[dict]) -> list[CompleteCall]:
        return [
            CompleteCall(t, r[0], 1, s[0]["start_token"], "SUCCEEDED", result={"n": 1}),
            CompleteCall(t, r[0], 1, s[0]["start_token"], "SUCCEEDED"),  # duplicate: stale
            CompleteCall(t, r[1], 1, s[1]["start_token"], "FAILED", error="flaky"),  # retry
            CompleteCall(t, r[2], 1, s[2]["start_token"], "FAILED", error="no", retryable=False),
            CompleteCall(t, r[3], 1, "not-the-token", "SUCCEEDED"),
            CompleteCall(t, r[4], 1, s[4]["start_token"], "MAYBE"),
        ]

    alone = []
    for c in calls(single, started(single)):
        try:
            alone.append(
                life.complete(
                    conn, c.tenant_id, c.run_id, c.attempt, c.start_token, c.outcome, NOW + 5,
                    result=c.result, error=c.error, retryable=c.retryable,
                )
            )  # fmt: skip
        except Exception as e:  # noqa: BLE001 - the answer under comparison
            alone.append(e)
    together = life.complete_many(conn, calls(batch, started(batch)), NOW + 5)

    assert [outcome(a) for a in together] == [outcome(a) for a in alone]
    assert [outcome(a)[1] if isinstance(a, Exception) else a["state"] for a in together] == [
        "SUCCEEDED", "STALE_ATTEMPT", "RETRY_WAIT", "FAILED", "STALE_ATTEMPT", "INVALID_FIELD",
    ]  # fmt: skip
    for s, b in zip(single, batch, strict=True):
        assert effects(conn, topics, b) == effects(conn, topics, s)
    retry_due = conn.execute(
        "SELECT due_at FROM timers WHERE timer_id = %s", [f"retry:{batch[1]}"]
    ).fetchone()[0]
    assert NOW + 5 + 500 <= to_ms(retry_due) <= NOW + 5 + 1000  # half fixed, half jittered


def test_complete_many__two_runs_of_a_buffering_job__its_instant_released_once(conn, world):
    topics, life, acme, _other, job, runs = world
    j = job(acme, schedule={"cron": "0 0 1 1 *", "timezone": "UTC", "overlap": "buffer_one"})
    r = runs(acme, j, 2)
    t = acme["tenant_id"]
    s = life.start_many(conn, [StartCall(t, run, "w") for run in r], NOW)
    buffered = T0 + 60_000
    conn.execute(
        "UPDATE jobs SET buffered_at = %s WHERE job_id = %s", [to_dt(buffered), j["job_id"]]
    )

    got = life.complete_many(
        conn, [CompleteCall(t, run, 1, a["start_token"], "SUCCEEDED") for run, a in zip(r, s, strict=True)],
        NOW + 5,
    )  # fmt: skip

    assert [a["state"] for a in got] == ["SUCCEEDED", "SUCCEEDED"]
    new = conn.execute(
        "SELECT count(*) FROM runs_daily WHERE job_id = %s AND scheduled_at = %s",
        [j["job_id"], to_dt(buffered)],
    ).fetchone()[0]
    assert new == 1
    assert (
        conn.execute("SELECT buffered_at FROM jobs WHERE job_id = %s", [j["job_id"]]).fetchone()[0]
        is None
    )


def test_start_many__inside_an_open_transaction__rolls_back_with_it(conn, world):
    topics, life, acme, _other, job, runs = world
    r = runs(acme, job(acme), 2)
    with pytest.raises(RuntimeError), conn.transaction():
        got = life.start_many(conn, [StartCall(acme["tenant_id"], x, "w") for x in r], NOW)
        assert all(isinstance(g, dict) for g in got)
        raise RuntimeError("the caller's transaction fails after the batch")
    assert [effects(conn, topics, x)[0][0] for x in r] == ["PENDING", "PENDING"]
    assert all(effects(conn, topics, x)[2] == [] for x in r)


def test_batches__in_a_transaction__generic_plans_for_it_only__autocommit_untouched(conn, world):
    """The batch statements are planned once per connection (a plan for three
    runs' arrays always looked cheaper, so each call planned afresh): forced
    for the caller's transaction, never beyond it."""
    _topics, life, acme, _other, job, runs = world
    r = runs(acme, job(acme), 4)
    mode = lambda: conn.execute("SHOW plan_cache_mode").fetchone()[0]  # noqa: E731
    assert mode() == "auto"
    with conn.transaction():
        started = life.start_many(conn, [StartCall(acme["tenant_id"], x, "w") for x in r[:2]], NOW)
        assert mode() == "force_generic_plan"
    assert mode() == "auto"
    calls = [
        CompleteCall(acme["tenant_id"], x, s["attempt"], s["start_token"], "SUCCEEDED")
        for x, s in zip(r[:2], started, strict=True)
    ]
    assert [a["state"] for a in life.complete_many(conn, calls, NOW + 1)] == ["SUCCEEDED"] * 2
    assert mode() == "auto"  # complete_many's own transaction ended with it
    assert all(isinstance(a, dict) for a in life.start_many(
        conn, [StartCall(acme["tenant_id"], x, "w") for x in r[2:]], NOW))  # fmt: skip
    assert mode() == "auto"


def _scans_of(plan: dict, relation: str) -> list[dict]:
    """The plan nodes (EXPLAIN FORMAT JSON) that read `relation`."""
    found = [plan] if plan.get("Relation Name") == relation and "Scan" in plan["Node Type"] else []
    for child in plan.get("Plans", []):
        found += _scans_of(child, relation)
    return found


def test_complete__a_busy_jobs_partition__its_timers_deleted_by_whole_key(conn, world, monkeypatch):
    """Every run of a job shares its partition, and so do their lease timers:
    CompleteRun must find a run's two timers by (partition_id, timer_id), not
    read every lease of the partition (or the whole table) for each run."""
    _topics, life, acme, _other, job, runs = world
    t = acme["tenant_id"]
    r = runs(acme, job(acme), 600)  # leases on more pages than a scan per run could afford
    started = life.start_many(conn, [StartCall(t, run, "w") for run in r], NOW)
    conn.execute("ANALYZE timers")  # statistics that know of the leases
    plans: list[dict] = []
    execute = conn.execute

    window = recent_days(NOW + 5)  # the statements as the window writes them

    def explaining(query, params=None, **kw):
        if query in (
            window.sql(lifecycle.Q["end_attempts"]),
            window.sql(lifecycle.Q["end_attempt"]),
        ):
            plans.append(execute("EXPLAIN (FORMAT JSON) " + query, params).fetchone()[0][0])
        return execute(query, params, **kw)

    monkeypatch.setattr(conn, "execute", explaining)
    done = life.complete_many(
        conn,
        [CompleteCall(t, r[i], 1, started[i]["start_token"], "SUCCEEDED") for i in range(20)],
        NOW + 5,
    )
    life.complete(conn, t, r[20], 1, started[20]["start_token"], "SUCCEEDED", NOW + 5)
    monkeypatch.undo()

    assert [d["state"] for d in done] == ["SUCCEEDED"] * 20
    assert len(plans) == 2
    for plan in plans:
        scans = _scans_of(plan["Plan"], "timers")
        assert scans, plan
        for scan in scans:
            assert scan["Node Type"] == "Index Scan", scan
            assert "timer_id" in scan["Index Cond"] and "partition_id" in scan["Index Cond"], scan
    assert (
        conn.execute("SELECT count(*) FROM timers WHERE owner_id = ANY(%s)", [r[:21]]).fetchone()[0]
        == 0
    )
    assert (
        conn.execute(
            "SELECT count(*) FROM timers WHERE owner_id = ANY(%s) AND kind = 'lease'", [r[21:]]
        ).fetchone()[0]
        == 579
    )


def test_start_and_retry__timers_take_the_runs_class__scalar_and_batch_alike(conn, world):
    from cronwheel.core.runs import PRIORITIES, PRIORITY_RANK

    topics, lc, _acme, _other, job, runs = world
    tenant = create_tenant(conn, "every-class", priority_classes=list(PRIORITIES))
    for cls in PRIORITIES:
        j = job(tenant, priority=cls, timeout_ms=60_000)
        single, *batch = runs(tenant, j, 3)
        lc.start(conn, tenant["tenant_id"], single, "w", NOW)
        lc.start_many(conn, [StartCall(tenant["tenant_id"], r, "w") for r in batch], NOW)
        started = [single, *batch]
        got = conn.execute(
            "SELECT kind, priority FROM timers WHERE owner_id = ANY(%s) ORDER BY kind",
            [started],
        ).fetchall()
        assert got == [("lease", PRIORITY_RANK[cls])] * 3 + [("timeout", PRIORITY_RANK[cls])] * 3
        # A retryable failure's backoff timer: the same class, single and batched.
        tokens = dict(
            conn.execute(
                "SELECT run_id, start_token FROM runs_daily WHERE run_id = ANY(%s)", [started]
            ).fetchall()
        )
        lc.complete(conn, tenant["tenant_id"], single, 1, tokens[single], "FAILED", NOW)
        calls = [CompleteCall(tenant["tenant_id"], r, 1, tokens[r], "FAILED") for r in batch]
        lc.complete_many(conn, calls, NOW)
        got = conn.execute(
            "SELECT kind, priority FROM timers WHERE owner_id = ANY(%s)", [started]
        ).fetchall()
        assert got == [("retry", PRIORITY_RANK[cls])] * 3


def test_warm__runs_the_start_and_spec_statements__writes_nothing(conn, world):
    """Lifecycle.warm (a service's start) touches no run, attempt, timer or
    record: the database's rows are the same before and after."""
    topics, life, acme, _other, job, runs = world
    run = runs(acme, job(acme), 1)[0]

    def everything() -> tuple:
        return tuple(
            conn.execute(
                f"SELECT count(*), md5(string_agg(t::text, ',' ORDER BY t::text)) FROM {name} t"
            ).fetchone()
            for name in ("runs_daily", "run_attempts_daily", "timers", "outbox")
        )

    asked: list[str] = []
    for name in ("start", "spec"):  # the statements run, not skipped
        real = getattr(life, name)
        setattr(
            life,
            name,
            lambda *a, _real=real, _name=name, **k: asked.append(_name) or _real(*a, **k),
        )
    before = everything()
    life.warm(conn, "w1", NOW)
    assert everything() == before
    assert sorted(asked) == ["spec", "start"]
    assert effects(conn, topics, run)[0][0] == "PENDING"
