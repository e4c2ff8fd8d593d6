"""The /v1 API over real HTTP (uvicorn in a thread) and a real database: tenants
and keys, jobs, runs, preview, operations endpoints and the error shape."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from cronwheel.cli import main as cli_main
from cronwheel.kafka import Topics
from services.gateway.app import create_app
from services.gateway.service import GatewayService
from tests.support.gateway import served
from tests.support.running import running

pytestmark = pytest.mark.integration

OPERATOR = {"Authorization": "Bearer cwop_test_operator_key"}
QUEUE_JOB = {
    "name": "nightly",
    "schedule": {"cron": "30 2 * * *", "timezone": "Europe/Berlin"},
    "target": {"type": "queue", "queue": "billing"},
    "payload": {"hello": "world"},
}


@pytest.fixture
def client(database_url, kafka_bootstrap, topic_prefix):
    app = create_app(database_url, Topics(topic_prefix), kafka_bootstrap, "cwop_test_operator_key")
    with served(app) as c:
        yield c


def new_tenant(client: httpx.Client, name: str = "acme") -> dict:
    r = client.post("/v1/tenants", json={"name": name}, headers=OPERATOR)
    assert r.status_code == 201, r.text
    return {"Authorization": f"Bearer {r.json()['api_key']}"}


def assert_problem(r: httpx.Response, status: int, code: str, field: str | None = None) -> dict:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    doc = r.json()
    assert {"type", "title", "status", "detail", "code"} <= doc.keys()
    assert doc["status"] == status and doc["code"] == code
    if field is not None:
        assert doc.get("field") == field, doc
    return doc


# -- tenants and keys ---------------------------------------------------------


def test_create_tenant__operator_key__returns_key_once_and_cell(client):
    r = client.post(
        "/v1/tenants", json={"name": "acme", "priority_classes": ["critical"]}, headers=OPERATOR
    )
    assert r.status_code == 201
    body = r.json()
    assert body["tenant_id"].startswith("ten_") and body["cell"] == "local"
    assert body["api_key"].startswith("cw_") and len(body["api_key"]) >= 43
    listed = client.get(f"/v1/tenants/{body['tenant_id']}/keys", headers=OPERATOR).json()
    assert "api_key" not in json.dumps(listed) and len(listed["items"]) == 1


def test_create_tenant__tenant_key__forbidden(client):
    key = new_tenant(client)
    assert_problem(client.post("/v1/tenants", json={"name": "evil"}, headers=key), 403, "FORBIDDEN")
    assert_problem(client.get("/v1/tenants", headers=key), 403, "FORBIDDEN")


def test_create_tenant__no_key_or_unknown_key__unauthenticated(client):
    r = client.post("/v1/tenants", json={"name": "x"})
    assert_problem(r, 401, "UNAUTHENTICATED")
    assert r.headers["www-authenticate"] == "Bearer"
    bogus = {"Authorization": "Bearer cw_not_a_key"}
    assert_problem(
        client.post("/v1/tenants", json={"name": "x"}, headers=bogus), 401, "UNAUTHENTICATED"
    )
    assert_problem(client.get("/v1/jobs", headers=bogus), 401, "UNAUTHENTICATED")


def test_create_tenant__same_name_twice__conflict(client):
    new_tenant(client, "acme")
    r = client.post("/v1/tenants", json={"name": "acme"}, headers=OPERATOR)
    assert_problem(r, 409, "TENANT_EXISTS")


def test_operator_key__on_tenant_routes__forbidden(client):
    assert_problem(client.get("/v1/jobs", headers=OPERATOR), 403, "FORBIDDEN")


def test_keys__rotate__new_key_works_and_revoked_key_stops_at_once(client):
    old = new_tenant(client)
    issued = client.post("/v1/keys", json={"label": "ci-2026"}, headers=old)
    assert issued.status_code == 201
    new = {"Authorization": f"Bearer {issued.json()['api_key']}"}
    assert client.get("/v1/jobs", headers=new).status_code == 200
    keys = client.get("/v1/keys", headers=new).json()["items"]
    assert len(keys) == 2 and {k["label"] for k in keys} == {None, "ci-2026"}
    old_id = next(k["key_id"] for k in keys if k["label"] is None)
    assert client.delete(f"/v1/keys/{old_id}", headers=new).status_code == 204
    assert_problem(client.get("/v1/jobs", headers=old), 401, "UNAUTHENTICATED")
    assert client.get("/v1/jobs", headers=new).status_code == 200
    revoked = {k["key_id"]: k for k in client.get("/v1/keys", headers=new).json()["items"]}
    assert revoked[old_id]["revoked_at"] is not None


def test_operator__issues_and_revokes_a_tenant_key(client):
    r = client.post("/v1/tenants", json={"name": "acme"}, headers=OPERATOR).json()
    tid = r["tenant_id"]
    issued = client.post(f"/v1/tenants/{tid}/keys", headers=OPERATOR)
    assert issued.status_code == 201
    key = {"Authorization": f"Bearer {issued.json()['api_key']}"}
    assert client.get("/v1/jobs", headers=key).status_code == 200
    kid = issued.json()["key_id"]
    assert client.delete(f"/v1/tenants/{tid}/keys/{kid}", headers=OPERATOR).status_code == 204
    assert_problem(client.get("/v1/jobs", headers=key), 401, "UNAUTHENTICATED")
    assert [
        t["tenant_id"] for t in client.get("/v1/tenants", headers=OPERATOR).json()["items"]
    ] == [tid]


# -- jobs ------------------------------------------------------------------------


def test_create_job__queue_target__201_with_next_fire_and_topic(client, topic_prefix):
    key = new_tenant(client)
    r = client.post("/v1/jobs", json=QUEUE_JOB, headers=key)
    assert r.status_code == 201, r.text
    job = r.json()
    assert job["next_fire_at"].endswith("Z") and job["payload"] == {"hello": "world"}
    assert job["topic"] == Topics(topic_prefix).queue(job["tenant_id"], "billing")
    assert client.get(f"/v1/jobs/{job['job_id']}", headers=key).json() == job


def test_jobs__patch_pause_resume_delete(client):
    key = new_tenant(client)
    job = client.post("/v1/jobs", json=QUEUE_JOB, headers=key).json()
    path = f"/v1/jobs/{job['job_id']}"
    patched = client.patch(path, json={"name": "renamed", "priority": "high"}, headers=key)
    assert patched.status_code == 200 and patched.json()["name"] == "renamed"
    assert patched.json()["version"] == job["version"] + 1
    paused = client.post(f"{path}/pause", headers=key).json()
    assert paused["paused"] is True and paused["next_fire_at"] is None
    resumed = client.post(f"{path}/resume", headers=key).json()
    assert resumed["paused"] is False and resumed["next_fire_at"] is not None
    assert client.delete(path, headers=key).status_code == 204
    assert_problem(client.get(path, headers=key), 404, "NOT_FOUND")
    assert client.get("/v1/jobs", headers=key).json()["items"] == []


def test_list_jobs__cursor_pages_through_every_job_once(client):
    key = new_tenant(client)
    made = [
        client.post("/v1/jobs", json={**QUEUE_JOB, "name": f"j{i}"}, headers=key).json()["job_id"]
        for i in range(5)
    ]
    seen, cursor = [], None
    while True:
        params = {"limit": 2, **({"cursor": cursor} if cursor else {})}
        page = client.get("/v1/jobs", params=params, headers=key).json()
        seen += [j["job_id"] for j in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == made


def test_trigger_and_backfill__create_runs_listed_with_filters(client):
    key = new_tenant(client)
    five = {**QUEUE_JOB, "schedule": {"cron": "*/5 * * * *", "timezone": "UTC"}}
    job = client.post("/v1/jobs", json=five, headers=key).json()
    other = client.post("/v1/jobs", json=five, headers=key).json()
    trig = client.post(f"/v1/jobs/{job['job_id']}/trigger", headers=key)
    assert trig.status_code == 201 and trig.json()["created"] is True
    client.post(f"/v1/jobs/{other['job_id']}/trigger", headers=key)
    window = {"from": "2026-01-01T00:00:00Z", "to": "2026-01-01T00:10:00.000Z"}
    bf = client.post(f"/v1/jobs/{job['job_id']}/backfill", json=window, headers=key)
    assert bf.json() == {"instants": 3, "created": 3, "already_existed": 0}
    again = client.post(f"/v1/jobs/{job['job_id']}/backfill", json=window, headers=key)
    assert again.json() == {"instants": 3, "created": 0, "already_existed": 3}
    runs = client.get("/v1/runs", params={"job_id": job["job_id"]}, headers=key).json()["items"]
    assert len(runs) == 4 and trig.json()["run_id"] in {r["run_id"] for r in runs}
    assert sorted(r["scheduled_at"] for r in runs)[:3] == [
        "2026-01-01T00:00:00.000Z", "2026-01-01T00:05:00.000Z", "2026-01-01T00:10:00.000Z"
    ]  # fmt: skip
    assert len(client.get("/v1/runs", headers=key).json()["items"]) == 5
    pending = client.get("/v1/runs", params={"state": "PENDING"}, headers=key).json()["items"]
    assert len(pending) == 5
    assert client.get("/v1/runs", params={"state": "SUCCEEDED"}, headers=key).json()["items"] == []


def test_list_runs__cursor__newest_first_without_gaps(client):
    key = new_tenant(client)
    job = client.post("/v1/jobs", json=QUEUE_JOB, headers=key).json()
    made = []
    for _ in range(5):
        r = client.post(f"/v1/jobs/{job['job_id']}/trigger", headers=key).json()
        if r["created"]:
            made.append(r["run_id"])
    seen, cursor = [], None
    while True:
        params = {"limit": 2, **({"cursor": cursor} if cursor else {})}
        page = client.get("/v1/runs", params=params, headers=key).json()
        seen += [r["run_id"] for r in page["items"]]
        if not (cursor := page["next_cursor"]):
            break
    assert sorted(seen) == sorted(made) and len(seen) == len(set(seen))
    created = [client.get(f"/v1/runs/{r}", headers=key).json()["created_at"] for r in seen]
    assert created == sorted(created, reverse=True)


# -- preview -------------------------------------------------------------------------


def test_preview__same_json_as_the_cli(client, capsys):
    key = new_tenant(client)
    args = {"cron": "30 2 * * *", "timezone": "America/New_York", "count": 3,
            "from": "2026-03-07T00:00:00Z", "gap": "shift", "repeat": "first"}  # fmt: skip
    r = client.get("/v1/schedules/preview", params=args, headers=key)
    assert r.status_code == 200
    assert cli_main(["preview", "30 2 * * *", "--tz", "America/New_York", "--count", "3",
                     "--from", "2026-03-07T00:00:00Z", "--json"]) == 0  # fmt: skip
    assert r.json() == json.loads(capsys.readouterr().out)
    assert [f["dst"] for f in r.json()["fires"]] == [None, "gap", None]


# -- operations and the error shape ------------------------------------------------


def test_healthz_readyz_metrics_openapi__unauthenticated(client):
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200
    assert ready.json()["checks"] == {"postgres": "ok", "kafka": "ok"}
    client.get("/v1/jobs")
    metrics = client.get("/metrics")
    assert metrics.status_code == 200 and "text/plain" in metrics.headers["content-type"]
    assert (
        'cronwheel_http_requests_total{cell="local",method="GET",route="/v1/jobs",status="401"}'
        in metrics.text
    )
    assert "cronwheel_firing_lateness_seconds_bucket" in metrics.text
    spec = client.get("/openapi.json").json()
    for path in ("/v1/tenants", "/v1/jobs/{job_id}/backfill", "/v1/runs/{run_id}/complete",
                 "/v1/schedules/preview"):  # fmt: skip
        assert path in spec["paths"]


def test_readyz__kafka_unreachable__503(database_url, topic_prefix):
    app = create_app(database_url, Topics(topic_prefix), "127.0.0.1:1", "op")
    try:
        with (
            running(GatewayService(app, "127.0.0.1", 0, "warning")) as svc,
            httpx.Client(base_url=svc.url, timeout=10) as c,
        ):
            r = c.get("/readyz")
        assert r.status_code == 503
        assert r.json()["checks"]["postgres"] == "ok"
        assert r.json()["checks"]["kafka"].startswith("error")
    finally:
        app.state.gateway.close()


def test_unknown_route_and_wrong_method__problem_json(client):
    assert_problem(client.get("/v1/nope"), 404, "NOT_FOUND")
    r = client.put("/v1/jobs", headers=OPERATOR)
    assert_problem(r, 405, "METHOD_NOT_ALLOWED")
    assert r.headers["allow"] == "GET, POST"


def test_gateway_service__responses_are_not_held_back_by_delayed_acks(client):
    """Headers and body go out as two writes; without TCP_NODELAY on the accepted
    socket the body waited ~40 ms for the client's delayed ACK on every request."""
    times = []
    for _ in range(21):
        started = time.perf_counter()
        client.get("/healthz")
        times.append(time.perf_counter() - started)
    assert sorted(times)[10] < 0.035
