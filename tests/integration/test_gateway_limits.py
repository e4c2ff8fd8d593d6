"""Idempotency-Key replays and the per-key rate limit, over HTTP."""

from __future__ import annotations

import threading

import httpx
import pytest

from cronwheel.kafka import Topics
from services.gateway.app import create_app
from services.gateway.service import GatewayService
from tests.support.running import running

pytestmark = pytest.mark.integration

OPERATOR_KEY = "cwop_limits_operator"
OP = {"Authorization": f"Bearer {OPERATOR_KEY}"}
JOB = {
    "name": "j",
    "schedule": {"cron": "0 0 1 1 *", "timezone": "UTC"},
    "target": {"type": "queue", "queue": "q"},
}


class Clock:
    now = 1_800_000_000_000

    def __call__(self) -> int:
        return self.now


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def server(database_url, kafka_bootstrap, topic_prefix, clock, request):
    limits = getattr(request, "param", {})
    app = create_app(
        database_url, Topics(topic_prefix), kafka_bootstrap, OPERATOR_KEY, clock=clock, **limits
    )
    try:
        with running(GatewayService(app, "127.0.0.1", 0, "warning")) as svc:
            yield svc
    finally:
        app.state.gateway.close()


@pytest.fixture
def client(server):
    with httpx.Client(base_url=server.url, timeout=10) as c:
        yield c


def tenant(client, name: str = "acme") -> dict:
    key = client.post("/v1/tenants", json={"name": name}, headers=OP).json()["api_key"]
    return {"Authorization": f"Bearer {key}"}


def test_idempotency__replay__first_response_and_nothing_done(client):
    h = tenant(client)
    first = client.post("/v1/jobs", json=JOB, headers={**h, "Idempotency-Key": "create-1"})
    again = client.post("/v1/jobs", json=JOB, headers={**h, "Idempotency-Key": "create-1"})
    assert first.status_code == again.status_code == 201
    assert again.content == first.content
    assert again.headers["idempotent-replayed"] == "true"
    assert len(client.get("/v1/jobs", headers=h).json()["items"]) == 1


def test_idempotency__same_key_other_body__422(client):
    h = tenant(client)
    client.post("/v1/jobs", json=JOB, headers={**h, "Idempotency-Key": "k"})
    r = client.post(
        "/v1/jobs", json={**JOB, "name": "other"}, headers={**h, "Idempotency-Key": "k"}
    )
    assert r.status_code == 422
    assert r.json()["code"] == "IDEMPOTENCY_KEY_REUSED" and r.json()["field"] == "Idempotency-Key"
    assert len(client.get("/v1/jobs", headers=h).json()["items"]) == 1


def test_idempotency__keys_are_per_tenant(client):
    a, b = tenant(client, "a"), tenant(client, "b")
    ra = client.post("/v1/jobs", json=JOB, headers={**a, "Idempotency-Key": "same"})
    rb = client.post("/v1/jobs", json=JOB, headers={**b, "Idempotency-Key": "same"})
    assert ra.status_code == rb.status_code == 201
    assert ra.json()["job_id"] != rb.json()["job_id"]
    assert "idempotent-replayed" not in rb.headers


def test_idempotency__trigger_replay_later__same_run_no_new_one(client, clock):
    h = tenant(client)
    job = client.post("/v1/jobs", json=JOB, headers=h).json()["job_id"]
    first = client.post(f"/v1/jobs/{job}/trigger", headers={**h, "Idempotency-Key": "t"})
    clock.now += 5_000  # without the key this would be a new run
    again = client.post(f"/v1/jobs/{job}/trigger", headers={**h, "Idempotency-Key": "t"})
    assert again.json() == first.json() and again.status_code == first.status_code == 201
    assert len(client.get("/v1/runs", headers=h).json()["items"]) == 1


def test_idempotency__start_replay__same_token_not_already_started(client):
    h = tenant(client)
    job = client.post("/v1/jobs", json=JOB, headers=h).json()["job_id"]
    run = client.post(f"/v1/jobs/{job}/trigger", headers=h).json()["run_id"]
    hk = {**h, "Idempotency-Key": "start-1"}
    first = client.post(f"/v1/runs/{run}/start", json={"worker_id": "w"}, headers=hk)
    again = client.post(f"/v1/runs/{run}/start", json={"worker_id": "w"}, headers=hk)
    assert first.status_code == again.status_code == 200
    assert again.json()["start_token"] == first.json()["start_token"]
    other = client.post(f"/v1/runs/{run}/start", json={"worker_id": "w"}, headers=h)
    assert other.json()["code"] == "ALREADY_STARTED"


def test_idempotency__a_4xx_is_recorded_too(client):
    h = tenant(client)
    hk = {**h, "Idempotency-Key": "bad"}
    first = client.post("/v1/jobs", json={**JOB, "name": ""}, headers=hk)
    again = client.post("/v1/jobs", json={**JOB, "name": ""}, headers=hk)
    assert first.status_code == again.status_code == 422
    assert again.content == first.content and again.headers["idempotent-replayed"] == "true"


def test_idempotency__concurrent_duplicates__one_effect(server):
    with httpx.Client(base_url=server.url, timeout=10) as c:
        h = {**tenant(c), "Idempotency-Key": "race"}
    results: list[httpx.Response] = []

    def send():
        with httpx.Client(base_url=server.url, timeout=10) as c:
            results.append(c.post("/v1/jobs", json=JOB, headers=h))

    threads = [threading.Thread(target=send) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert [r.status_code for r in results] == [201] * 4
    assert len({r.json()["job_id"] for r in results}) == 1


@pytest.mark.parametrize("server", [{"rate_per_s": 1.0, "burst": 3.0}], indirect=True)
def test_rate_limit__over_the_burst__429_with_retry_after_per_key(client):
    a, b = tenant(client, "a"), tenant(client, "b")
    codes = [client.get("/v1/jobs", headers=a).status_code for _ in range(4)]
    assert codes == [200, 200, 200, 429]
    r = client.get("/v1/jobs", headers=a)
    assert r.status_code == 429 and r.json()["code"] == "RATE_LIMITED"
    assert r.headers["content-type"].startswith("application/problem+json")
    assert int(r.headers["retry-after"]) >= 1
    assert client.get("/v1/jobs", headers=b).status_code == 200  # another key: its own bucket
