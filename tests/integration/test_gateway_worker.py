"""The worker protocol of CONTRACT.md over HTTP: start, heartbeat, complete, the
409 codes, and a retry through the timer's firing loop, on one injected clock."""

from __future__ import annotations

import httpx
import psycopg
import pytest

from cronwheel.kafka import Topics
from services.gateway.app import create_app
from services.timer.service import TimerService
from tests.support.gateway import ManualClock, new_run, tenant_client

pytestmark = pytest.mark.integration

OPERATOR_KEY = "cwop_worker_operator"


@pytest.fixture
def clock():
    return ManualClock()


@pytest.fixture
def client(database_url, kafka_bootstrap, topic_prefix, clock):
    app = create_app(database_url, Topics(topic_prefix), kafka_bootstrap, OPERATOR_KEY, clock=clock)
    with tenant_client(app, OPERATOR_KEY) as c:
        yield c


def start(client, run_id: str, **extra) -> httpx.Response:
    return client.post(f"/v1/runs/{run_id}/start", json={"worker_id": "w1", **extra})


def complete(client, run_id: str, attempt: int, token: str, outcome: str, **extra):
    body = {"attempt": attempt, "start_token": token, "outcome": outcome, **extra}
    return client.post(f"/v1/runs/{run_id}/complete", json=body)


def code_of(r: httpx.Response) -> str:
    assert r.status_code == 409, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    return r.json()["code"]


def test_start__200_with_contract_fields__second_start_already_started(client):
    run_id = new_run(client)
    r = start(client, run_id)
    assert r.status_code == 200
    body = r.json()
    assert {"attempt", "start_token", "lease_expires_at", "payload"} <= body.keys()
    assert body["attempt"] == 1 and body["payload"] == {"n": 1}
    assert code_of(start(client, run_id, worker_id="w2")) == "ALREADY_STARTED"


def test_heartbeat__extends_the_lease(client, clock):
    run_id = new_run(client)
    first = start(client, run_id).json()
    clock.advance(10_000)
    r = client.post(
        f"/v1/runs/{run_id}/heartbeat",
        json={"attempt": 1, "start_token": first["start_token"]},
    )
    assert r.status_code == 200
    assert r.json()["lease_expires_at"] > first["lease_expires_at"]


def test_complete__duplicate_after_success__is_stale_and_changes_nothing(client, clock):
    run_id = new_run(client)
    token = start(client, run_id).json()["start_token"]
    done = complete(client, run_id, 1, token, "SUCCEEDED", result={"rows": 3})
    assert done.status_code == 200 and done.json()["state"] == "SUCCEEDED"
    before = client.get(f"/v1/runs/{run_id}").json()
    clock.advance(1_000)
    dup = complete(client, run_id, 1, token, "FAILED", error="late", retryable=False)
    assert code_of(dup) == "STALE_ATTEMPT"
    assert client.get(f"/v1/runs/{run_id}").json() == before
    assert before["result"] == {"rows": 3} and before["finished_at"] is not None
    assert code_of(start(client, run_id)) == "NOT_RUNNABLE"
    beat = client.post(f"/v1/runs/{run_id}/heartbeat", json={"attempt": 1, "start_token": token})
    assert code_of(beat) == "STALE_ATTEMPT"


def test_start__not_yet_due__not_runnable(client, clock):
    run_id = new_run(client)
    clock.advance(-10_000)
    assert code_of(start(client, run_id)) == "NOT_RUNNABLE"
    clock.advance(10_000)
    assert start(client, run_id).status_code == 200


def test_complete__retryable_failure__attempt_2_after_backoff_and_attempt_1_token_refused(
    client, clock, database_url, topic_prefix
):
    run_id = new_run(client)
    token1 = start(client, run_id).json()["start_token"]
    failed = complete(client, run_id, 1, token1, "FAILED", error="boom", retryable=True)
    assert failed.json()["state"] == "RETRY_WAIT"

    timer = TimerService(
        database_url, Topics(topic_prefix), lease_ttl_ms=60_000, clock=clock, ahead_ms=0
    )
    with psycopg.connect(database_url, autocommit=True) as conn:
        timer.leases.tick(conn, clock())
        timer.fire_once(conn, clock.advance(100))  # before the backoff: nothing yet
        assert client.get(f"/v1/runs/{run_id}").json()["state"] == "RETRY_WAIT"
        assert code_of(start(client, run_id)) == "NOT_RUNNABLE"
        timer.fire_once(conn, clock.advance(2_000))  # past any backoff of attempt 1
    run = client.get(f"/v1/runs/{run_id}").json()
    assert (run["state"], run["attempt"]) == ("PENDING", 2)

    second = start(client, run_id, attempt=2).json()
    assert second["attempt"] == 2 and second["start_token"] != token1
    assert code_of(complete(client, run_id, 1, token1, "SUCCEEDED")) == "STALE_ATTEMPT"
    beat = client.post(f"/v1/runs/{run_id}/heartbeat", json={"attempt": 1, "start_token": token1})
    assert code_of(beat) == "STALE_ATTEMPT"
    assert code_of(start(client, run_id, attempt=1)) == "STALE_ATTEMPT"
    assert (
        complete(client, run_id, 2, second["start_token"], "SUCCEEDED").json()["state"]
        == "SUCCEEDED"
    )

    history = client.get(f"/v1/runs/{run_id}").json()["attempts"]
    assert [(a["attempt"], a["outcome"]) for a in history] == [(1, "FAILED"), (2, "SUCCEEDED")]
    assert history[0]["error"] == "boom"


def test_complete__non_retryable_or_last_attempt__failed(client):
    run_id = new_run(client)
    token = start(client, run_id).json()["start_token"]
    r = complete(client, run_id, 1, token, "FAILED", error="bad input", retryable=False)
    assert r.json()["state"] == "FAILED"
    once = new_run(client, retry={"max_attempts": 1})
    token = start(client, once).json()["start_token"]
    assert complete(client, once, 1, token, "FAILED").json()["state"] == "FAILED"


def test_cancel__pending_run__cancelled_then_not_runnable(client):
    run_id = new_run(client)
    r = client.post(f"/v1/runs/{run_id}/cancel", json={"reason": "not needed"})
    assert r.status_code == 200 and r.json()["state"] == "CANCELLED"
    assert code_of(client.post(f"/v1/runs/{run_id}/cancel")) == "NOT_RUNNABLE"
    assert code_of(start(client, run_id)) == "NOT_RUNNABLE"
    assert client.get(f"/v1/runs/{run_id}").json()["error"] == "not needed"
