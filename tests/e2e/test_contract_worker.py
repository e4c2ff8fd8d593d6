"""A worker written only from CONTRACT.md: plain confluent-kafka, fastavro reading
the schema file, and httpx. No cronwheel import on the worker's side: if this
passes, a worker in any language can be written from the contract.

The platform runs as processes (gateway, timer, relay, dispatcher), started the
way an operator starts them."""

from __future__ import annotations

import io
import json
import socket
import time
import uuid
from pathlib import Path

import fastavro
import httpx
import pytest
from confluent_kafka import Consumer
from fastavro.schema import fingerprint, to_parsing_canonical_form

from tests.support.procs import launcher
from tests.support.wait import wait_for

pytestmark = pytest.mark.e2e

# Every version of the record, as docs/workers.md says: a record names its
# writer's schema by fingerprint (this release writes v2).
SCHEMA_FILES = sorted((Path(__file__).resolve().parents[2] / "schemas").glob("RunReady.v*.avsc"))
OPERATOR_KEY = "cwop_test_" + uuid.uuid4().hex


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ContractWorker:
    """What a team would write from the contract alone."""

    def __init__(self, topic: str, api: httpx.Client, kafka: dict):
        self.by_fingerprint = {}
        for path in SCHEMA_FILES:
            parsed = fastavro.parse_schema(json.loads(path.read_text()), named_schemas={})
            fp = bytes.fromhex(fingerprint(to_parsing_canonical_form(parsed), "CRC-64-AVRO"))
            self.by_fingerprint[fp] = parsed
        self.api = api
        # The `kafka` credentials of POST /v1/tenants, as any Kafka client takes them.
        self.consumer = Consumer(
            {"bootstrap.servers": kafka["bootstrap"],
             "security.protocol": kafka["security_protocol"],
             "sasl.mechanism": kafka["sasl_mechanism"],
             "sasl.username": kafka["username"], "sasl.password": kafka["password"],
             "group.id": f"{kafka['group_prefix']}contract-{uuid.uuid4().hex[:6]}",
             "auto.offset.reset": "earliest", "enable.auto.commit": True}
        )  # fmt: skip
        self.consumer.subscribe([topic])

    def next_record(self, timeout: float = 30) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            msg = self.consumer.poll(0.2)
            if msg is None or msg.error():
                continue
            value = msg.value()
            assert value[:2] == b"\xc3\x01", "single-object encoding marker"
            writer = self.by_fingerprint.get(value[2:10])
            assert writer is not None, "fingerprint of a schema file"
            record = fastavro.schemaless_reader(io.BytesIO(value[10:]), writer)
            assert msg.key().decode() == record["run_id"]
            return record
        raise AssertionError("no record on the queue topic")

    def start(self, run_id: str, **body):
        return self.api.post(f"/v1/runs/{run_id}/start", json={"worker_id": "w1", **body})

    def heartbeat(self, run_id: str, attempt: int, token: str):
        return self.api.post(
            f"/v1/runs/{run_id}/heartbeat", json={"attempt": attempt, "start_token": token}
        )

    def complete(self, run_id: str, attempt: int, token: str, outcome: str, **extra):
        body = {"attempt": attempt, "start_token": token, "outcome": outcome, **extra}
        return self.api.post(f"/v1/runs/{run_id}/complete", json=body)

    def close(self):
        self.consumer.close()


@pytest.fixture
def platform(database_url, kafka_bootstrap, topic_prefix):
    port = _free_port()
    with launcher(database_url, kafka_bootstrap, topic_prefix) as launch:
        env = {"CRONWHEEL_HTTP_ADDR": f"127.0.0.1:{port}", "CRONWHEEL_OPERATOR_KEY": OPERATOR_KEY}
        for name in ("gateway", "timer", "relay", "dispatcher"):
            launch.start(name, **env)
        base = f"http://127.0.0.1:{port}"

        def ready():
            try:
                return httpx.get(f"{base}/readyz", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(ready, timeout=60, interval=0.2, what="gateway ready")
        yield base


def _tenant(base: str, name: str) -> dict:
    r = httpx.post(
        f"{base}/v1/tenants",
        json={"name": name},
        headers={"Authorization": f"Bearer {OPERATOR_KEY}"},
    )
    assert r.status_code == 201, r.text
    return r.json()


def test_contract_worker__start_retry_heartbeat_lease_fencing(platform, kafka_bootstrap):
    acme, other = _tenant(platform, "acme"), _tenant(platform, "other")
    api = httpx.Client(base_url=platform, headers={"Authorization": f"Bearer {acme['api_key']}"})
    intruder = httpx.Client(
        base_url=platform, headers={"Authorization": f"Bearer {other['api_key']}"}
    )
    job = api.post(
        "/v1/jobs",
        json={
            "name": "nightly",
            "schedule": {"every_ms": 86_400_000},
            "target": {"type": "queue", "queue": "etl"},
            "payload": {"table": "orders"},
            "retry": {"max_attempts": 3, "initial_backoff_ms": 100, "max_backoff_ms": 200},
            "lease_ms": 1000,
        },
    )
    assert job.status_code == 201, job.text
    worker = ContractWorker(job.json()["topic"], api, acme["kafka"])
    try:
        # Attempt 1: start wins once; another start and another tenant are refused.
        run_id = api.post(f"/v1/jobs/{job.json()['job_id']}/trigger").json()["run_id"]
        rec = worker.next_record()
        assert (rec["run_id"], rec["attempt"], rec["tenant_id"]) == (run_id, 1, acme["tenant_id"])
        assert json.loads(rec["payload"]) == {"table": "orders"}
        assert intruder.post(f"/v1/runs/{run_id}/start", json={"worker_id": "x"}).status_code == 404
        s1 = worker.start(run_id)
        assert s1.status_code == 200, s1.text
        one = s1.json()
        assert one["attempt"] == 1 and one["payload"] == {"table": "orders"} and one["start_token"]
        again = worker.start(run_id)
        assert again.status_code == 409 and again.json()["code"] == "ALREADY_STARTED"

        # A retryable failure: the attempt-1 token is refused from then on.
        failed = worker.complete(
            run_id, 1, one["start_token"], "FAILED", error="db down", retryable=True
        )
        assert failed.status_code == 200 and failed.json()["state"] == "RETRY_WAIT"
        dup = worker.complete(run_id, 1, one["start_token"], "FAILED", error="db down")
        assert dup.status_code == 409 and dup.json()["code"] == "STALE_ATTEMPT"

        # Attempt 2 comes back on the topic after the backoff.
        rec2 = worker.next_record()
        assert (rec2["run_id"], rec2["attempt"]) == (run_id, 2)
        two = worker.start(run_id).json()
        assert two["attempt"] == 2
        stale = worker.heartbeat(run_id, 1, one["start_token"])
        assert stale.status_code == 409 and stale.json()["code"] == "STALE_ATTEMPT"

        # Heartbeats hold the lease well past its 1 s length.
        held_until = time.monotonic() + 2.5
        while time.monotonic() < held_until:
            hb = worker.heartbeat(run_id, 2, two["start_token"])
            assert hb.status_code == 200, hb.text
            time.sleep(0.25)  # the heartbeat cadence itself, not a wait for a condition
        done = worker.complete(run_id, 2, two["start_token"], "SUCCEEDED", result={"rows": 7})
        assert done.status_code == 200 and done.json()["state"] == "SUCCEEDED"
        dup2 = worker.complete(run_id, 2, two["start_token"], "SUCCEEDED")
        assert dup2.status_code == 409 and dup2.json()["code"] == "STALE_ATTEMPT"
        run = api.get(f"/v1/runs/{run_id}").json()
        assert run["state"] == "SUCCEEDED" and run["attempt"] == 2
        assert run["result"] == {"rows": 7}
        assert len(run["attempts"]) == 2

        # A worker that stops heartbeating loses the run when the lease expires.
        lost_id = api.post(f"/v1/jobs/{job.json()['job_id']}/trigger").json()["run_id"]
        rec3 = worker.next_record()
        assert rec3["run_id"] == lost_id and rec3["attempt"] == 1
        first = worker.start(lost_id).json()
        rec4 = worker.next_record(timeout=30)
        assert (rec4["run_id"], rec4["attempt"]) == (lost_id, 2)
        late = worker.complete(lost_id, 1, first["start_token"], "SUCCEEDED")
        assert late.status_code == 409 and late.json()["code"] == "STALE_ATTEMPT"
        assert worker.start(lost_id).json()["attempt"] == 2
    finally:
        worker.close()
        api.close()
        intruder.close()
