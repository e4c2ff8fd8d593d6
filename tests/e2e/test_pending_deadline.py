"""No run waits forever (docs/pending-deadline.md), against the platform running
as processes (gateway, timer, relay, dispatcher; test_sdk_worker's), the real
broker and database and a real SDK worker (tests/support/sdk_worker.py): a run's RunReady is lost on purpose, once before the
relay publishes it (deleted from the outbox) and once after the dispatcher
forwarded it (a consumer of the workers' group reads it, commits and drops
it). Each time the timer announces the run again past its deadline, the
worker runs it exactly once, and an `overlap: skip` job fires again."""

from __future__ import annotations

import uuid
from datetime import datetime

import psycopg
import pytest
from confluent_kafka import Consumer, TopicPartition

from cronwheel import kafka
from cronwheel.core.clock import now_ms
from cronwheel.core.ids import partition_of_run, run_id_for_instant
from cronwheel.kafka import Topics
from cronwheel.store.new_runs import insert_runs
from tests.e2e import test_sdk_worker
from tests.e2e.test_sdk_worker import WorkerProc
from tests.support.kafka import tenant_conf
from tests.support.wait import wait_for

pytestmark = pytest.mark.e2e
platform = test_sdk_worker.platform  # the fixture, used by `stack`

DEADLINE_MS = 3000


@pytest.fixture
def short_deadlines(monkeypatch):
    """Every class's deadline short, checked twice a second (the services take
    the test process's environment): the tests wait seconds, not minutes."""
    for c in ("CRITICAL", "HIGH", "NORMAL", "LOW"):
        monkeypatch.setenv(f"CRONWHEEL_PENDING_DEADLINE_{c}_MS", str(DEADLINE_MS))
    monkeypatch.setenv("CRONWHEEL_PENDING_SWEEP_MS", "500")


@pytest.fixture
def stack(short_deadlines, platform):
    """test_sdk_worker's platform (gateway, timer, relay, dispatcher as
    processes, a tenant and its client) with those deadlines."""
    return platform


def _job(api, **schedule) -> dict:
    body = {
        "name": f"j-{uuid.uuid4().hex[:6]}",
        "schedule": {"every_ms": 86_400_000, **schedule},
        "target": {"type": "queue", "queue": f"q{uuid.uuid4().hex[:6]}"},
        "payload": {"n": 1},
    }
    r = api.post("/v1/jobs", json=body)
    assert r.status_code == 201, r.text
    return r.json()


def _executions(database_url, run_id: str) -> list[int]:
    with psycopg.connect(database_url) as conn:
        rows = conn.execute(
            "SELECT attempt FROM sdk_executions WHERE run_id = %s", [run_id]
        ).fetchall()
    return [a for (a,) in rows]


def _state(api, run_id: str) -> dict:
    return api.get(f"/v1/runs/{run_id}").json()


def _succeeded(api, run_id: str, what: str, timeout: float = 60) -> dict:
    """The run once SUCCEEDED (as the API shows it)."""
    return wait_for(
        lambda: (r := _state(api, run_id))["state"] == "SUCCEEDED" and r,
        timeout=timeout,
        interval=0.1,
        what=what,
    )


def test_deleted_before_the_relay__announced_again__run_once__overlap_skip_not_blocked(
    stack, database_url, kafka_bootstrap
):
    launch, api, _env, base, tenant = stack
    relay = next(svc for svc in launch.started if svc.name == "relay")
    relay.stop()
    job = _job(api, every_ms=2000, overlap="skip")
    with psycopg.connect(database_url, autocommit=True) as conn:
        # No relay yet: the first run's record waits in the outbox. Lose it.
        first = wait_for(
            lambda: conn.execute(
                "SELECT run_id FROM runs_daily WHERE job_id = %s", [job["job_id"]]
            ).fetchone(),
            timeout=30,
            what="the job's first run",
        )[0]
        lost = conn.execute("DELETE FROM outbox WHERE key = %s", [first.encode()]).rowcount
        assert lost >= 1
        # The lost run holds the job: no second run while it is PENDING.
        skipped = wait_for(
            lambda: conn.execute(
                "SELECT overlap_skipped FROM jobs WHERE job_id = %s AND overlap_skipped > 0",
                [job["job_id"]],
            ).fetchone(),
            timeout=30,
            what="an instant skipped for the lost run",
        )
        assert skipped[0] >= 1
        assert (
            conn.execute(
                "SELECT count(*) FROM runs_daily WHERE job_id = %s", [job["job_id"]]
            ).fetchone()[0]
            == 1
        )

    launch.start("relay")
    worker = WorkerProc(job["topic"], base, tenant, database_url, kafka_bootstrap)
    try:
        done = _succeeded(api, first, "the lost run announced again and run")
        assert done["attempt"] == 1
        assert done["reannounced"] >= 1 and done["last_reannounced_at"] is not None
        assert _executions(database_url, first) == [1]  # once, at its one attempt

        # Not blocked for good: the job's next instant runs too.
        def a_later_run_succeeded():
            runs = api.get("/v1/runs", params={"job_id": job["job_id"]}).json()["items"]
            return [r for r in runs if r["run_id"] != first and r["state"] == "SUCCEEDED"]

        wait_for(a_later_run_succeeded, timeout=60, interval=0.2, what="a later run of the job")
        assert _executions(database_url, first) == [1]
    finally:
        assert worker.term() == 0


def _drop_from_queue(
    kafka_bootstrap: str, topic: str, group: str, run_id: str, creds: dict | None
) -> None:
    """Read the queue topic as the workers' group would (with the tenant's Kafka
    credentials), find `run_id`'s record, and commit past it without starting
    the run: a worker that lost it."""
    consumer = Consumer(
        {"bootstrap.servers": kafka_bootstrap, "group.id": group, "enable.auto.commit": False,
         **tenant_conf(creds)}
    )  # fmt: skip
    try:

        def partitions():
            meta = consumer.list_topics(topic, timeout=5).topics.get(topic)
            return sorted(meta.partitions) if meta and meta.partitions and not meta.error else None

        parts = wait_for(partitions, timeout=30, what=f"topic {topic}")
        consumer.assign([TopicPartition(topic, p, 0) for p in parts])

        def read_it():
            msg = consumer.poll(0.5)
            if msg is None or msg.error() or msg.key() != run_id.encode():
                return None
            return msg

        msg = wait_for(read_it, timeout=30, interval=0, what="the run's record on the queue")
        consumer.commit(
            offsets=[TopicPartition(topic, msg.partition(), msg.offset() + 1)], asynchronous=False
        )
    finally:
        consumer.close()


def test_dropped_by_a_worker_after_dispatch__announced_again__forwarded_again__run_once(
    stack, database_url, kafka_bootstrap
):
    launch, api, _env, base, tenant = stack
    job = _job(api)
    run_id = api.post(f"/v1/jobs/{job['job_id']}/trigger").json()["run_id"]
    group = f"cronwheel-worker.{job['topic']}"  # the SDK's default group
    _drop_from_queue(kafka_bootstrap, job["topic"], group, run_id, tenant["kafka"])
    # The dispatcher records a forward as processed after the broker's ack, so
    # the record can be read (as above) a moment before its row is written.
    with psycopg.connect(database_url, autocommit=True) as conn:
        wait_for(
            lambda: (
                conn.execute(
                    "SELECT 1 FROM processed WHERE consumer = 'dispatcher' AND message_key LIKE %s",
                    [f"{run_id}:1:%"],
                ).fetchone()
                or _state(api, run_id)["reannounced"] >= 1
            ),
            timeout=30,
            interval=0.1,
            what="the dropped run recorded as forwarded by the dispatcher",
        )

    worker = WorkerProc(job["topic"], base, tenant, database_url, kafka_bootstrap)
    try:
        done = _succeeded(api, run_id, "the dropped run announced again, forwarded again and run")
        assert done["attempt"] == 1 and done["reannounced"] >= 1
        assert _executions(database_url, run_id) == [1]
    finally:
        assert worker.term() == 0


def test_sdk__not_due_yet__started_after_its_instant__records_behind_it_go_on(
    stack, database_url, kafka_bootstrap, topic_prefix
):
    """A record that reaches a worker before its run's instant (by more than
    StartRun's one second of slack) is refused NOT_RUNNABLE; the SDK starts it
    again after the instant instead of dropping it, and the record behind it
    on the same partition is not held up meanwhile. The early record never
    went through the outbox: before its deadline only the worker's retry can
    start its run."""
    launch, api, _env, base, tenant = stack
    job = _job(api)
    now = now_ms()
    early_at, due_at = now + 10_000, now - 1000  # the worker takes seconds to join
    spec = {"target": job["target"], "payload": "{}", "retry": job["retry"],
            "timeout_ms": None, "lease_ms": 30_000}  # fmt: skip
    runs = [
        {"partition_id": partition_of_run(run_id_for_instant(job["job_id"], at)),
         "run_id": run_id_for_instant(job["job_id"], at), "tenant_id": tenant["tenant_id"],
         "job_id": job["job_id"], "scheduled_ms": at, "priority": "normal", "spec": spec}
        for at in (early_at, due_at)
    ]  # fmt: skip
    with psycopg.connect(database_url, autocommit=True) as conn:
        records = insert_runs(conn, Topics(topic_prefix), runs, now)
    # Queue topics are the dispatcher's to make and write.
    kafka.ensure_topics([job["topic"]], bootstrap=kafka_bootstrap, principal="dispatcher")
    producer = kafka.producer(kafka_bootstrap, principal="dispatcher")
    for r in records:  # the early record first, the due one behind it
        producer.produce(job["topic"], r.value, r.key, partition=0)
    assert producer.flush(10) == 0
    early, due = (r["run_id"] for r in runs)

    worker = WorkerProc(job["topic"], base, tenant, database_url, kafka_bootstrap)
    try:
        _succeeded(api, due, "the due run behind the early one", timeout=30)
        assert now_ms() < early_at  # ... before the early run's instant
        assert _state(api, early)["state"] == "PENDING"
        done = _succeeded(api, early, "the early run started after its instant", timeout=30)
        assert _executions(database_url, early) == [1]
        assert done["attempt"] == 1
        started = datetime.fromisoformat(done["started_at"]).timestamp() * 1000
        assert early_at - 1000 <= started < early_at + DEADLINE_MS
    finally:
        assert worker.term() == 0
