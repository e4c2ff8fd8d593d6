"""The worker protocol's batch routes: start-batch and complete-batch answer each
item as its single route would answer it alone (status, body or problem), in
one transaction; a malformed item refuses the whole batch with a 422 naming it."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import psycopg
import pytest

from cronwheel.kafka import Topics
from cronwheel.sdk.api import WorkerApi
from cronwheel.sdk.http import Response
from services.gateway.app import create_app
from tests.support.gateway import ManualClock, new_run, tenant_client

pytestmark = pytest.mark.integration

OPERATOR_KEY = "cwop_batch_operator"


@pytest.fixture
def clock():
    return ManualClock()


@pytest.fixture(params=[True, False], ids=["fastpath", "fastapi"])
def client(request, database_url, kafka_bootstrap, topic_prefix, clock):
    app = create_app(
        database_url,
        Topics(topic_prefix),
        kafka_bootstrap,
        OPERATOR_KEY,
        clock=clock,
        worker_fastpath=request.param,
    )
    with tenant_client(app, OPERATOR_KEY) as c:
        yield c


def start_batch(client, runs: list[dict], worker_id: str = "w1", **headers) -> httpx.Response:
    return client.post(
        "/v1/runs/start-batch", json={"worker_id": worker_id, "runs": runs}, headers=headers
    )


def complete_batch(client, runs: list[dict]) -> httpx.Response:
    return client.post("/v1/runs/complete-batch", json={"runs": runs})


def results(r: httpx.Response) -> list[dict]:
    assert r.status_code == 200, r.text
    return r.json()["results"]


def outcome(item: dict) -> tuple:
    """(status, code) of one batch answer."""
    return item["status"], item["problem"]["code"] if "problem" in item else None


def single(r: httpx.Response) -> dict:
    """A single route's answer in a batch item's shape."""
    if r.status_code == 200:
        return {"status": 200, "body": r.json()}
    return {"status": r.status_code, "problem": r.json()}


def other_tenant_run(client) -> str:
    key = client.post(
        "/v1/tenants", json={"name": "other"}, headers={"Authorization": f"Bearer {OPERATOR_KEY}"}
    ).json()["api_key"]
    mine = client.headers["Authorization"]
    client.headers["Authorization"] = f"Bearer {key}"
    try:
        return new_run(client)
    finally:
        client.headers["Authorization"] = mine


def test_start_batch__each_item_answered_as_the_single_route(client, database_url):
    fresh, taken, done, future, stale = (new_run(client) for _ in range(5))
    theirs = other_tenant_run(client)
    assert client.post(f"/v1/runs/{taken}/start", json={"worker_id": "w0"}).status_code == 200
    tok = client.post(f"/v1/runs/{done}/start", json={"worker_id": "w0"}).json()["start_token"]
    body = {"attempt": 1, "start_token": tok, "outcome": "SUCCEEDED"}
    assert client.post(f"/v1/runs/{done}/complete", json=body).status_code == 200
    with psycopg.connect(database_url) as conn:
        conn.execute(
            "UPDATE runs_daily SET scheduled_at = scheduled_at + interval '1 hour' WHERE run_id = %s",
            [future],
        )
    items = [
        {"run_id": fresh, "attempt": 1},
        {"run_id": taken},
        {"run_id": done},
        {"run_id": future},
        {"run_id": stale, "attempt": 2},
        {"run_id": theirs},
        {"run_id": "not-a-run"},
    ]
    got = results(start_batch(client, items))
    assert [g["run_id"] for g in got] == [i["run_id"] for i in items]
    assert [outcome(g) for g in got] == [
        (200, None),
        (409, "ALREADY_STARTED"),
        (409, "NOT_RUNNABLE"),
        (409, "NOT_RUNNABLE"),
        (409, "STALE_ATTEMPT"),
        (404, "NOT_FOUND"),
        (404, "NOT_FOUND"),
    ]
    started = got[0]["body"]
    assert started["attempt"] == 1 and started["payload"] == {"n": 1}
    assert {"start_token", "lease_expires_at", "lease_ms"} <= started.keys()
    # The refusals are the single route's documents, word for word.
    for item, g in zip(items[1:], got[1:], strict=True):
        extra = {"attempt": item["attempt"]} if "attempt" in item else {}
        alone = client.post(f"/v1/runs/{item['run_id']}/start", json={"worker_id": "w1", **extra})
        assert single(alone) == {k: v for k, v in g.items() if k != "run_id"}, item


def test_start_batch__same_run_twice__second_already_started(client, database_url):
    run_id = new_run(client)
    got = results(start_batch(client, [{"run_id": run_id}, {"run_id": run_id}]))
    assert [outcome(g) for g in got] == [(200, None), (409, "ALREADY_STARTED")]
    with psycopg.connect(database_url) as conn:
        n = conn.execute(
            "SELECT count(*) FROM run_attempts_daily WHERE run_id = %s", [run_id]
        ).fetchone()
    assert n == (1,)


def test_complete_batch__success_retry_stale_other_tenant_and_records(client, database_url):
    ok, retry, twice = new_run(client), new_run(client), new_run(client)
    theirs = other_tenant_run(client)
    got = results(start_batch(client, [{"run_id": r} for r in (ok, retry, twice)]))
    tokens = {g["run_id"]: g["body"]["start_token"] for g in got}
    with psycopg.connect(database_url) as conn:
        outbox_before = conn.execute("SELECT count(*) FROM outbox").fetchone()[0]

    def item(run_id, outcome="SUCCEEDED", **extra):
        token = tokens.get(run_id, "nope")
        return {"run_id": run_id, "attempt": 1, "start_token": token, "outcome": outcome, **extra}

    items = [
        item(ok, result={"rows": 3}),
        item(retry, "FAILED", error="boom", retryable=True),
        item(twice),
        item(twice, "FAILED", error="late"),  # a duplicate in the same batch
        {**item(ok), "start_token": "wrong"},
        item(theirs),
    ]
    got = results(complete_batch(client, items))
    assert [outcome(g) for g in got] == [
        (200, None),
        (200, None),
        (200, None),
        (409, "STALE_ATTEMPT"),
        (409, "STALE_ATTEMPT"),
        (404, "NOT_FOUND"),
    ]
    assert [g["body"]["state"] for g in got[:3]] == ["SUCCEEDED", "RETRY_WAIT", "SUCCEEDED"]
    assert client.get(f"/v1/runs/{ok}").json()["result"] == {"rows": 3}
    assert client.get(f"/v1/runs/{twice}").json()["state"] == "SUCCEEDED"
    run = client.get(f"/v1/runs/{retry}").json()
    assert run["state"] == "RETRY_WAIT" and run["attempts"][0]["error"] == "boom"
    # A completion that already landed, sent again alone: the same answer as in a batch.
    alone = client.post(f"/v1/runs/{twice}/complete", json=items[3])
    assert single(alone) == {k: v for k, v in got[3].items() if k != "run_id"}
    with psycopg.connect(database_url) as conn:
        rows = conn.execute(
            "SELECT topic, convert_from(key, 'UTF8') FROM outbox ORDER BY id OFFSET %s",
            [outbox_before],
        ).fetchall()
        timers = conn.execute(
            "SELECT owner_id, kind FROM timers WHERE owner_id = ANY(%s)", [[ok, retry, twice]]
        ).fetchall()
        theirs_state = conn.execute(
            "SELECT state FROM runs_daily WHERE run_id = %s", [theirs]
        ).fetchone()
    completed = sorted(key for topic, key in rows if topic.endswith("run-completed"))
    assert completed == sorted([ok, twice])  # terminal ones only, once each
    assert timers == [(retry, "retry")]
    assert theirs_state == ("PENDING",)


@pytest.mark.parametrize(
    "body, field",
    [
        ({"worker_id": "w"}, "runs"),
        ({"worker_id": "w", "runs": []}, "runs"),
        ({"worker_id": "w", "runs": {"run_id": "x"}}, "runs"),
        ({"worker_id": "w", "runs": [{"run_id": "x"}] * 101}, "runs"),
        ({"worker_id": "w", "runs": [{"run_id": "x"}, 3]}, "runs[1]"),
        ({"worker_id": "w", "runs": [{"run_id": "x"}, {"attempt": 1}]}, "runs[1].run_id"),
        ({"worker_id": "w", "runs": [{"run_id": "x"}] * 3 + [{"run_id": "y", "attempt": 0}]},
         "runs[3].attempt"),
        ({"worker_id": "w", "runs": [{"run_id": "x", "attempt": True}]}, "runs[0].attempt"),
        ({"worker_id": "", "runs": [{"run_id": "x"}]}, "worker_id"),
        ({"runs": [{"run_id": "x"}]}, "worker_id"),
    ],
)  # fmt: skip
def test_start_batch__malformed__422_naming_the_field_and_nothing_started(
    client, database_url, body, field
):
    run_id = new_run(client)
    for item in body.get("runs", []) if isinstance(body.get("runs"), list) else []:
        if isinstance(item, dict) and item.get("run_id") == "x":
            item["run_id"] = run_id  # a real run: the refusal must not start it
    r = client.post("/v1/runs/start-batch", json=body)
    assert r.status_code == 422, r.text
    assert r.json()["code"] == "INVALID_FIELD" and r.json()["field"] == field
    assert client.get(f"/v1/runs/{run_id}").json()["state"] == "PENDING"


def two_started(client) -> tuple[str, list[dict]]:
    """Two runs started in one batch: the first's id, and a SUCCEEDED completion
    item for each."""
    a, b = new_run(client), new_run(client)
    got = results(start_batch(client, [{"run_id": a}, {"run_id": b}]))
    items = [
        {"run_id": g["run_id"], "attempt": 1, "start_token": g["body"]["start_token"],
         "outcome": "SUCCEEDED"}
        for g in got
    ]  # fmt: skip
    return a, items


@pytest.mark.parametrize(
    "change, field",
    [
        ({"attempt": "1"}, "runs[1].attempt"),
        ({"attempt": None}, "runs[1].attempt"),
        ({"start_token": ""}, "runs[1].start_token"),
        ({"start_token": 5}, "runs[1].start_token"),
        ({"outcome": "MAYBE"}, "runs[1].outcome"),
        ({"retryable": "yes"}, "runs[1].retryable"),
        ({"error": 42}, "runs[1].error"),
        ({"run_id": None}, "runs[1].run_id"),
    ],
)
def test_complete_batch__malformed__422_naming_the_field_and_nothing_completed(
    client, change, field
):
    a, items = two_started(client)
    items[1] = {**items[1], **change}
    r = complete_batch(client, items)
    assert r.status_code == 422, r.text
    assert r.json()["field"] == field
    assert client.get(f"/v1/runs/{a}").json()["state"] == "RUNNING"


def test_complete_batch__result_too_large__413_naming_the_item_and_nothing_completed(client):
    a, items = two_started(client)
    items[1]["result"] = {"blob": "x" * (70 * 1024)}
    r = complete_batch(client, items)
    assert r.status_code == 413, r.text
    assert r.json()["code"] == "PAYLOAD_TOO_LARGE" and r.json()["field"] == "runs[1].result"
    assert client.get(f"/v1/runs/{a}").json()["state"] == "RUNNING"


def test_batch__operator_key_and_no_key__refused_as_a_whole(client):
    run_id = new_run(client)
    r = client.post(
        "/v1/runs/start-batch",
        json={"worker_id": "w", "runs": [{"run_id": run_id}]},
        headers={"Authorization": f"Bearer {OPERATOR_KEY}"},
    )
    assert r.status_code == 403
    r = client.post("/v1/runs/complete-batch", json={"runs": []}, headers={"Authorization": ""})
    assert r.status_code == 401
    assert client.get(f"/v1/runs/{run_id}").json()["state"] == "PENDING"


def test_batch__documented_in_openapi_and_counted_in_metrics(client):
    paths = client.get("/openapi.json").json()["paths"]
    for verb in ("start-batch", "complete-batch"):
        assert "post" in paths[f"/v1/runs/{verb}"]
    start_batch(client, [{"run_id": "nope"}])
    assert 'route="/v1/runs/start-batch"' in client.get("/metrics").text


# -- the SDK's side of it (cronwheel.sdk.api.WorkerApi) ---------------------------------


class NoBatchRoutes(WorkerApi):
    """The SDK against a gateway from before the batch routes: they answer 405;
    the rest goes to the real gateway."""

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.paths: list[str] = []

    def _send(self, path: str, body: dict) -> Response:
        self.paths.append(path)
        if path.endswith("-batch"):
            return Response(405, b'{"code": "METHOD_NOT_ALLOWED"}')
        return super()._send(path, body)


@contextmanager
def _api(client, kind: type[WorkerApi] = WorkerApi) -> Iterator[WorkerApi]:
    key = client.headers["Authorization"].split(" ", 1)[1]
    api = kind(str(client.base_url), key, threading.Event(), 4)
    try:
        yield api
    finally:
        api.close()


def test_sdk_api__batches__answers_per_item(client):
    a, b = new_run(client), new_run(client)
    with _api(client) as api:
        got = api.start_many("sdk", [(a, 1), (b, 2), (a, 1)])
        done = api.complete_many(
            [{"run_id": a, "attempt": 1, "start_token": got[0][1]["start_token"],
              "outcome": "SUCCEEDED"}]
        )  # fmt: skip
        assert api.batch_routes
    assert [s for s, _ in got] == [200, 409, 409]
    assert got[1][1]["code"] == "STALE_ATTEMPT" and got[2][1]["code"] == "ALREADY_STARTED"
    assert [(s, body["state"]) for s, body in done] == [(200, "SUCCEEDED")]


def test_sdk_api__gateway_without_batch_routes__single_routes_alike(client):
    a, b = new_run(client), new_run(client)
    with _api(client, NoBatchRoutes) as api:
        got = api.start_many("sdk", [(a, 1), (b, 2)])
        assert [s for s, _ in got] == [200, 409] and not api.batch_routes
        items = [{"run_id": a, "attempt": 1, "start_token": got[0][1]["start_token"],
                  "outcome": "FAILED", "error": "x", "retryable": False}]  # fmt: skip
        assert api.complete_many(items)[0][1]["state"] == "FAILED"
        paths = api.paths
    assert paths == [
        "/v1/runs/start-batch", f"/v1/runs/{a}/start", f"/v1/runs/{b}/start",
        f"/v1/runs/{a}/complete",  # no second try of a batch route
    ]  # fmt: skip


def test_sdk_api__batch_refused_as_a_whole__items_one_by_one(client):
    a, b = new_run(client), new_run(client)
    with _api(client) as api:
        got = api.start_many("sdk", [(a, 1), (b, 1)])
        items = [
            {"run_id": r, "attempt": 1, "start_token": body["start_token"], "outcome": "SUCCEEDED"}
            for r, (_s, body) in zip((a, b), got, strict=True)
        ]
        items[1]["result"] = {"blob": "x" * (70 * 1024)}  # over 64 KiB: only this item fails
        answers = api.complete_many(items)
        assert [s for s, _ in answers] == [200, 413]
        assert answers[1][1]["code"] == "PAYLOAD_TOO_LARGE" and api.batch_routes
    assert client.get(f"/v1/runs/{a}").json()["state"] == "SUCCEEDED"
    assert client.get(f"/v1/runs/{b}").json()["state"] == "RUNNING"
