"""The firing path end to end, in-process: job -> timer -> run + outbox -> relay -> Kafka."""

from __future__ import annotations

import json

import psycopg
import pytest

from cronwheel.core.avro import default_registry, fast_writer
from cronwheel.core.clock import iso, now_ms, to_ms
from cronwheel.core.events import OutboxRow
from cronwheel.core.ids import PARTITIONS, run_id_for_instant
from cronwheel.kafka import Topics
from cronwheel.store import outbox, pgarrays
from cronwheel.store.firing import Firing, run_spec, run_spec_text
from cronwheel.store.jobs import Jobs, create_tenant
from services.relay.service import Relay
from services.timer.service import TimerService
from tests.support.kafka import drain, run_topic_and_record
from tests.support.running import running
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
def conn(database_url):
    with psycopg.connect(database_url, autocommit=True) as c:
        yield c


def test_every_ms_job__fires_on_its_instants__records_reach_the_tenant_topic(
    database_url, kafka_bootstrap, topic_prefix, conn
):
    topics = Topics(topic_prefix)
    tenant = create_tenant(conn, "acme")
    job = Jobs(topics).create(
        conn,
        tenant,
        {
            "name": "tick",
            "schedule": {"every_ms": 200},
            "target": {"type": "queue", "queue": "billing"},
            "payload": {"hello": "world"},
        },
        now_ms(),
    )
    assert job["topic"] == topics.queue(tenant["tenant_id"], "billing")
    timer = TimerService(database_url, topics, lease_ttl_ms=5000, ahead_ms=0)
    relay = Relay(database_url, kafka_bootstrap)
    with running(relay):
        with running(timer):
            records = drain(kafka_bootstrap, topics.runs(tenant["tenant_id"]), want=5)
        outbox_rows = "SELECT count(*) FROM outbox"
        wait_for(lambda: conn.execute(outbox_rows).fetchone()[0] == 0, what="outbox drained")
    assert len(records) >= 5
    for _topic, key, name, datum, _msg in records:
        assert name == "RunReady"
        assert key.decode() == datum["run_id"]
        assert datum["run_id"] == run_id_for_instant(job["job_id"], datum["scheduled_at"])
        assert datum["payload"] == '{"hello":"world"}'
        assert datum["queue"] == "billing"
    rows = conn.execute(
        "SELECT run_id, scheduled_at FROM runs_daily WHERE job_id = %s ORDER BY scheduled_at",
        [job["job_id"]],
    ).fetchall()
    instants = [to_ms(r[1]) for r in rows]
    # Every instant from the first on fired, once, 200 ms apart.
    assert all(b - a == 200 for a, b in zip(instants, instants[1:], strict=False))
    assert {r[3]["run_id"] for r in records} <= {r[0] for r in rows}


def test_timer__database_session_killed__reconnects_and_keeps_firing(
    database_url, topic_prefix, conn
):
    topics = Topics(topic_prefix)
    tenant = create_tenant(conn, "acme")
    job = Jobs(topics).create(
        conn,
        tenant,
        {"name": "tick", "schedule": {"every_ms": 200}, "target": {"type": "queue", "queue": "q"}},
        now_ms(),
    )
    count = "SELECT count(*) FROM runs_daily WHERE job_id = %s"
    with running(TimerService(database_url, topics, lease_ttl_ms=5000, ahead_ms=0)):
        wait_for(lambda: conn.execute(count, [job["job_id"]]).fetchone()[0] >= 3, what="first runs")
        killed = conn.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchone()[0]
        assert killed >= 1
        before = conn.execute(count, [job["job_id"]]).fetchone()[0]
        wait_for(
            lambda: conn.execute(count, [job["job_id"]]).fetchone()[0] >= before + 5,
            timeout=30,
            what="firing to resume after the sessions were killed",
        )


def test_pause_resume_while_firing__no_deadlock(database_url, topic_prefix, conn):
    """Job operations and the firing loop lock a job's timer and row in the same
    order; pausing jobs that are firing used to raise DeadlockDetected."""
    topics = Topics(topic_prefix)
    jobs = Jobs(topics)
    tenant = create_tenant(conn, "acme")
    body = {"schedule": {"every_ms": 100}, "target": {"type": "queue", "queue": "q"}}
    ids = [
        jobs.create(conn, tenant, {**body, "name": f"j{i}"}, now_ms())["job_id"] for i in range(40)
    ]
    with running(TimerService(database_url, topics, lease_ttl_ms=5000, ahead_ms=0)):
        wait_for(
            lambda: conn.execute("SELECT count(*) FROM runs_daily").fetchone()[0] >= 40,
            what="firing",
        )
        for _ in range(5):
            for job_id in ids:
                jobs.pause(conn, tenant, job_id, now_ms())
                jobs.resume(conn, tenant, job_id, now_ms())
    assert all(not jobs.get(conn, tenant["tenant_id"], j)["paused"] for j in ids)


def test_more_due_than_one_wheel_load__each_fires_on_time__not_at_the_idle_tick(
    database_url, topic_prefix, conn
):
    """The wheel loads at most `wheel_limit` due times per class; past the last
    of them it must look again, not sleep until the idle tick (5 s here) or
    the next instant it learnt from a firing (each job's next, 4 s later)."""
    topics = Topics(topic_prefix)
    tenant = create_tenant(conn, "acme")
    base = now_ms() - 2_500  # anchors in the past: first instants 1.5 s from now
    instants = [base + 100 * i + 4_000 for i in range(12)]
    for i in range(12):
        body = {
            "name": f"tick-{i}",
            "schedule": {"every_ms": 4_000},
            "target": {"type": "queue", "queue": "q"},
        }
        Jobs(topics).create(conn, tenant, body, base + 100 * i)
    timer = TimerService(
        database_url, topics, lease_ttl_ms=30_000, idle_ms=5_000, wheel_limit=3, ahead_ms=0
    )
    with running(timer):
        wait_for(
            lambda: conn.execute("SELECT count(*) FROM runs_daily").fetchone()[0] >= 12,
            timeout=20,
            what="12 runs",
        )
    rows = conn.execute(
        "SELECT scheduled_at, created_at FROM runs_daily ORDER BY 1 LIMIT 12"
    ).fetchall()
    late = [to_ms(created) - to_ms(scheduled) for scheduled, created in rows]
    assert [to_ms(r[0]) for r in rows] == instants
    # A wheel that slept past what it was never told of fires these up to 5 s late.
    assert max(late) < 1_000, late


def test_upcoming__a_class_fills_its_limit__complete_only_up_to_its_last(
    database_url, topic_prefix, conn
):
    topics = Topics(topic_prefix)
    tenant = create_tenant(conn, "acme")
    t0 = now_ms() + 60_000
    for i in range(5):
        body = {
            "name": f"once-{i}",
            "schedule": {"at": iso(t0 + 1000 * i)},
            "target": {"type": "queue", "queue": "q"},
        }
        Jobs(topics).create(conn, tenant, body, now_ms())
    firing = Firing(topics)
    everything = list(range(PARTITIONS))
    capped = firing.upcoming(conn, everything, t0 + 10_000, limit=3)
    assert capped.due_ms == [t0, t0 + 1000, t0 + 2000]
    assert capped.complete_until == t0 + 2000
    whole = firing.upcoming(conn, everything, t0 + 10_000, limit=10)
    assert whole.due_ms == [t0 + 1000 * i for i in range(5)]
    assert whole.complete_until == t0 + 10_000


def test_relay__rows_trickling_in__each_published_once__none_reread_while_in_flight(
    database_url, kafka_bootstrap, topic_prefix, conn
):
    """The relay produces a pass and reads the next before the first is
    acknowledged: rows in flight must not be read (and published) again."""
    topic, VALUE = run_topic_and_record(conn, Topics(topic_prefix), kafka_bootstrap)
    relay = Relay(database_url, kafka_bootstrap)
    with running(relay):
        for i in range(40):
            with conn.transaction():
                outbox.append(
                    conn,
                    [OutboxRow(i % 7, topic, f"k{i}-{j}".encode(), VALUE) for j in range(5)],
                )
        wait_for(lambda: relay.published_total >= 200, timeout=30, what="200 acknowledged")
        wait_for(
            lambda: conn.execute("SELECT count(*) FROM outbox").fetchone()[0] == 0,
            what="outbox drained",
        )
    assert relay.published_total == 200
    records = drain(kafka_bootstrap, topic, want=201, timeout=5)
    keys = [key for _t, key, *_ in records]
    assert len(keys) == 200 and len(set(keys)) == 200


# -- what the firing loop's cheaper encodings must keep -------------------------


def test_run_ready__compiled_writer__same_bytes_as_fastavro():
    """events.run_ready goes through avro.fast_writer; fastavro is the reference."""
    registry = default_registry()
    cases = [
        {"job_id": "job_1", "queue": "q", "covers": None},
        {"job_id": None, "workflow_run_id": "wfr_1", "node": "n-é", "queue": None},
        {"job_id": "j", "queue": "𝄞 queue", "covers": [0, 1, -1, 1_700_000_000_123, 2**62]},
        {"job_id": "j", "queue": "q", "covers": []},
        {"job_id": "j", "queue": "q", "traceparent": f"00-{'ab' * 16}-{3:016x}-00", "cell": "eu"},
    ]
    for i, extra in enumerate(cases):
        datum = {
            "run_id": f"{i:03x}" + "a" * 29, "tenant_id": "ten_ü", "workflow_run_id": None,
            "node": None, "attempt": 64 + i, "scheduled_at": 1_700_000_000_000 + i,
            "created_at": -5 - i, "priority": "critical", "target_type": "queue",
            "payload": '{"x": "\\u00e9"}', "partition_id": 1023, "covers": None,
            "traceparent": None, "cell": None, **extra,
        }  # fmt: skip
        assert fast_writer("RunReady")(datum) == registry.encode("RunReady", datum)
        assert registry.decode(fast_writer("RunReady")(datum)) == ("RunReady", datum)


def test_packed_arrays__round_trip_through_postgres(conn):
    """The firing loop's binary array parameters read back as psycopg's own."""
    texts = ["a", "", None, "é€𝄞", "x" * 300]
    ms = [0, 1_700_000_000_123, None, -1]
    got = conn.execute(
        "SELECT %(t)b::text[], %(b)b::bytea[], %(s)b::smallint[], %(l)b::bigint[],"
        " %(ts)b::timestamptz[], %(e)b::text[], %(n)b::smallint[], %(i)b::int[],"
        " %(q)b::bool[]",
        {
            "t": pgarrays.text_array(texts),
            "b": pgarrays.bytea_array([b"\x00\xff", None, b""]),
            "s": pgarrays.int2_array([0, 1023, -32768, 32767]),
            "l": pgarrays.int8_array([2**62, -(2**63), None]),
            "ts": pgarrays.timestamptz_array(ms),
            "e": pgarrays.text_array([]),
            "n": pgarrays.int2_array([1, None]),
            "i": pgarrays.int4_array([1, None, 2**31 - 1, -(2**31)]),
            "q": pgarrays.bool_array([True, False, None]),
        },
    ).fetchone()
    assert got[0] == texts
    assert got[1] == [b"\x00\xff", None, b""]
    assert got[2] == [0, 1023, -32768, 32767]
    assert got[3] == [2**62, -(2**63), None]
    assert [None if d is None else to_ms(d) for d in got[4]] == ms
    assert got[5] == [] and got[6] == [1, None]
    assert got[7] == [1, None, 2**31 - 1, -(2**31)] and got[8] == [True, False, None]


def test_run_spec_text__same_document_as_run_spec(conn):
    job = {
        "target": {"type": "webhook", "url": 'https://example.com/é?a="b"'},
        "payload": '{"k": "v\\n"}',
        "retry": {"max_attempts": 3, "backoff_ms": 100},
        "timeout_ms": None,
        "lease_ms": 30000,
    }
    text = run_spec_text(
        json.dumps(job["target"]), job["payload"], json.dumps(job["retry"]), None, 30000
    )
    assert json.loads(text) == run_spec(job)
    same = conn.execute("SELECT %s::jsonb = %s::jsonb", [text, json.dumps(run_spec(job))])
    assert same.fetchone()[0]


def test_critical_batch__storm_led_by_critical__small_critical_batch_then_critical_alone(conn):
    """Critical first (docs/priority.md): with critical_batch set, the first
    batch of a backlog led by critical timers is that many critical timers,
    the next takes the rest of the critical class and nothing lower, and only
    then do the lower classes get batches."""
    from tests.integration.test_priority import all_leases, bulk_jobs

    big = create_tenant(conn, "big", priority_classes=["critical", "high", "normal", "low"])
    small = create_tenant(conn, "small", priority_classes=["critical", "high", "normal", "low"])
    due = now_ms() - 1000
    bulk_jobs(conn, big["tenant_id"], 600, due, "normal")
    bulk_jobs(conn, big["tenant_id"], 40, due, "critical")
    bulk_jobs(conn, small["tenant_id"], 40, due, "critical")
    firing = Firing(Topics("t"), critical_batch=20)
    leases = all_leases(conn)
    batches = []
    for i in range(4):
        before = dict(
            conn.execute("SELECT priority, count(*) FROM runs_daily GROUP BY 1").fetchall()
        )
        report = firing.fire_due(conn, leases, now_ms(), limit=200)
        after = dict(
            conn.execute("SELECT priority, count(*) FROM runs_daily GROUP BY 1").fetchall()
        )
        batches.append({k: v - before.get(k, 0) for k, v in after.items() if v > before.get(k, 0)})
        assert firing.backlog
        assert report.timers == sum(batches[-1].values())
        if i == 0:  # fair within the class: both tenants' critical runs in the first batch
            tenants = "SELECT count(DISTINCT tenant_id) FROM runs_daily WHERE priority = 'critical'"
            assert conn.execute(tenants).fetchone()[0] == 2
    assert batches[0] == {"critical": 20}
    assert batches[1] == {"critical": 60}
    assert batches[2] == {"normal": 200} and batches[3] == {"normal": 200}


def test_firing_lateness__observed_per_priority_class(database_url, topic_prefix, conn):
    from prometheus_client import REGISTRY

    def count(priority: str) -> float:
        name = "cronwheel_firing_lateness_seconds_count"
        return REGISTRY.get_sample_value(name, {"priority": priority}) or 0.0

    topics = Topics(topic_prefix)
    tenant = create_tenant(conn, "acme", priority_classes=["critical", "normal"])
    body = {
        "name": "urgent",
        "schedule": {"every_ms": 200},
        "target": {"type": "queue", "queue": "q"},
        "priority": "critical",
    }
    Jobs(topics).create(conn, tenant, body, now_ms())
    before = {p: count(p) for p in ("critical", "normal")}
    with running(TimerService(database_url, topics, lease_ttl_ms=5000, ahead_ms=0)):
        wait_for(lambda: count("critical") - before["critical"] >= 3, what="three critical fires")
    assert count("normal") == before["normal"]  # only the critical job fired here
