"""The firing path end to end, in-process: job -> timer -> run + outbox -> relay -> Kafka."""

from __future__ import annotations

import psycopg
import pytest

from cronwheel import kafka
from cronwheel.core import events
from cronwheel.core.clock import iso, now_ms, to_ms
from cronwheel.core.events import OutboxRow
from cronwheel.core.ids import PARTITIONS, run_id_for_instant
from cronwheel.kafka import Topics
from cronwheel.store import outbox
from cronwheel.store.firing import Firing
from cronwheel.store.jobs import Jobs, create_tenant
from services.relay.service import Relay
from services.timer.service import TimerService
from tests.support.kafka import drain
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
    timer = TimerService(database_url, topics, lease_ttl_ms=5000)
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
        "SELECT run_id, scheduled_at FROM runs WHERE job_id = %s ORDER BY scheduled_at",
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
    count = "SELECT count(*) FROM runs WHERE job_id = %s"
    with running(TimerService(database_url, topics, lease_ttl_ms=5000)):
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
    with running(TimerService(database_url, topics, lease_ttl_ms=5000)):
        wait_for(
            lambda: conn.execute("SELECT count(*) FROM runs").fetchone()[0] >= 40, what="firing"
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
    timer = TimerService(database_url, topics, lease_ttl_ms=30_000, idle_ms=5_000, wheel_limit=3)
    with running(timer):
        wait_for(
            lambda: conn.execute("SELECT count(*) FROM runs").fetchone()[0] >= 12,
            timeout=20,
            what="12 runs",
        )
    rows = conn.execute("SELECT scheduled_at, created_at FROM runs ORDER BY 1 LIMIT 12").fetchall()
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
    topics = Topics(topic_prefix)
    tenant = create_tenant(conn, "acme")
    topic = topics.runs(tenant["tenant_id"])
    kafka.ensure_topics([topic], bootstrap=kafka_bootstrap)
    VALUE = events.run_ready(
        run_id="r", tenant_id=tenant["tenant_id"], partition_id=0, attempt=1,
        scheduled_ms=1, created_ms=1, priority="normal",
        target={"type": "queue", "queue": "q"}, payload="{}",
    )  # fmt: skip
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
