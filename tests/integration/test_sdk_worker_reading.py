"""The SDK worker reads its queue topic while a start-batch is out: records that
arrive meanwhile are held at once and go together in the next start-batch.

A real broker and the real Worker; only the gateway is replaced, by a stand-in
for WorkerApi whose first start-batch does not answer until the test says so
(the gateway's own side of the protocol has its tests in test_gateway_worker*).
"""

from __future__ import annotations

import threading
import uuid

from cronwheel import kafka, principals
from cronwheel.core.avro import default_registry
from cronwheel.sdk.worker import Worker
from tests.support.kafka import delete_topics, tenant_credentials
from tests.support.wait import wait_for


class HeldGateway:
    """start_many answers every run as won, the first call only once released."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.starts: list[list[str]] = []
        self.completed: list[str] = []
        self._lock = threading.Lock()

    def start_many(self, worker_id, runs):
        with self._lock:
            self.starts.append([run_id for run_id, _attempt in runs])
            first = len(self.starts) == 1
        if first:
            assert self.release.wait(30), "the test never released the first start-batch"
        return [
            (200, {"start_token": f"tok-{r}", "attempt": a, "lease_ms": 30_000}) for r, a in runs
        ]

    def complete_many(self, items):
        with self._lock:
            self.completed += [item["run_id"] for item in items]
        return [(200, {})] * len(items)

    def heartbeat(self, run_id, attempt, start_token):  # pragma: no cover - runs are instant
        raise AssertionError("no run lives long enough to heartbeat")

    def close(self) -> None:
        pass


def _run_ready(run_id: str) -> bytes:
    return default_registry().encode(
        "RunReady",
        {
            "run_id": run_id, "tenant_id": "ten_read", "job_id": "job_read",
            "workflow_run_id": None, "node": None, "attempt": 1,
            "scheduled_at": 1_700_000_000_000, "created_at": 1_700_000_000_000,
            "priority": "normal", "target_type": "queue", "queue": "q", "payload": "{}",
            "partition_id": 0, "covers": None,
        },
    )  # fmt: skip


def test_worker__start_batch_out__reads_on_and_starts_the_rest_together(
    kafka_bootstrap, topic_prefix
):
    topics = kafka.Topics(topic_prefix)
    topic = topics.queue("ten_reading", "reading")
    # The dispatcher makes and writes queue topics; the worker reads as its tenant.
    kafka.ensure_topics([topic], partitions=1, bootstrap=kafka_bootstrap, principal="dispatcher")
    producer = kafka.producer(kafka_bootstrap, principal="dispatcher")
    creds = tenant_credentials(kafka_bootstrap, topics, "ten_reading")

    def produce(run_id: str) -> None:
        producer.produce(topic, key=run_id.encode(), value=_run_ready(run_id))
        assert producer.flush(10) == 0

    gateway = HeldGateway()
    worker = Worker(
        topic,
        lambda run: {"ok": run.run_id},
        api_url="http://127.0.0.1:9",
        bootstrap=kafka_bootstrap,
        group_id=f"{principals.tenant_group_prefix(topics, 'ten_reading')}{uuid.uuid4().hex[:6]}",
        concurrency=8,
        kafka_username=creds and creds.username,
        kafka_password=creds and creds.password,
    )
    worker._api.close()
    worker._api = gateway
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        produce("run-1")
        wait_for(lambda: gateway.starts, what="the first start-batch")
        for k in (2, 3, 4):
            produce(f"run-{k}")
        # The first request is still out, and the worker holds the three others.
        wait_for(lambda: worker._offsets.in_flight() == 4, what="all four records read", timeout=20)
        assert gateway.starts == [["run-1"]]

        gateway.release.set()
        wait_for(lambda: len(gateway.completed) == 4, what="four completions", timeout=20)
        assert gateway.starts == [["run-1"], ["run-2", "run-3", "run-4"]]
        assert sorted(gateway.completed) == ["run-1", "run-2", "run-3", "run-4"]
    finally:
        gateway.release.set()
        worker.stop()
        thread.join(30)
        delete_topics(kafka_bootstrap, [topic_prefix])
    assert not thread.is_alive()
    assert worker.completed == 4
