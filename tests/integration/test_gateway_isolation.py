"""Tenant isolation: tenant A's key against every tenant route with tenant B's ids
answers 404 and shows nothing of B, and the database's row-level security (the
second line, docs/tenancy.md) holds even for a query that forgets the tenant."""

from __future__ import annotations

import json
import re

import httpx
import psycopg
import pytest

from cronwheel.kafka import Topics
from services.gateway.app import create_app
from services.gateway.service import GatewayService
from tests.support.running import running

pytestmark = pytest.mark.integration

OPERATOR_KEY = "cwop_isolation_operator"
JOB = {
    "name": "b-job",
    "schedule": {"every_ms": 60_000},
    "target": {"type": "queue", "queue": "secret-queue"},
    "payload": {"secret": "of-b"},
}


@pytest.fixture
def app(database_url, kafka_bootstrap, topic_prefix):
    app = create_app(database_url, Topics(topic_prefix), kafka_bootstrap, OPERATOR_KEY)
    yield app
    app.state.gateway.close()


@pytest.fixture
def client(app):
    with (
        running(GatewayService(app, "127.0.0.1", 0, "warning")) as svc,
        httpx.Client(base_url=svc.url, timeout=10) as c,
    ):
        yield c


def tenant(client, name: str) -> tuple[str, dict]:
    r = client.post(
        "/v1/tenants", json={"name": name}, headers={"Authorization": f"Bearer {OPERATOR_KEY}"}
    )
    return r.json()["tenant_id"], {"Authorization": f"Bearer {r.json()['api_key']}"}


@pytest.fixture
def world(client):
    """Tenant B with a job, a running run and a second key; tenant A with a job."""
    a_id, a = tenant(client, "tenant-a")
    b_id, b = tenant(client, "tenant-b")
    a_job = {**JOB, "name": "a-job", "payload": None, "target": {"type": "queue", "queue": "a-q"}}
    client.post("/v1/jobs", json=a_job, headers=a)
    b_job = client.post("/v1/jobs", json=JOB, headers=b).json()
    b_run = client.post(f"/v1/jobs/{b_job['job_id']}/trigger", headers=b).json()["run_id"]
    started = client.post(
        f"/v1/runs/{b_run}/start", json={"worker_id": "b-worker"}, headers=b
    ).json()
    b_key = client.post("/v1/keys", json={"label": "b-second"}, headers=b).json()["key_id"]
    wf = {"name": "b-wf", "nodes": [{"name": "a", "target": {"type": "queue", "queue": "w"}}]}
    b_wf = client.post("/v1/workflows", json=wf, headers=b).json()["workflow_id"]
    b_wfr = client.post(f"/v1/workflows/{b_wf}/trigger", headers=b).json()["workflow_run_id"]
    return {
        "wf": b_wf, "wfr": b_wfr,
        "a_id": a_id, "a": a, "b_id": b_id, "b": b, "job": b_job["job_id"], "run": b_run,
        "token": started["start_token"], "key": b_key, "job_view": b_job,
    }  # fmt: skip


def matrix(w: dict) -> list[tuple[str, str, dict | None]]:
    job, run, fence = w["job"], w["run"], {"attempt": 1, "start_token": w["token"]}
    return [
        ("GET", f"/v1/jobs/{job}", None),
        ("PATCH", f"/v1/jobs/{job}", {"name": "hijacked"}),
        ("DELETE", f"/v1/jobs/{job}", None),
        ("POST", f"/v1/jobs/{job}/pause", None),
        ("POST", f"/v1/jobs/{job}/resume", None),
        ("POST", f"/v1/jobs/{job}/trigger", None),
        ("POST", f"/v1/jobs/{job}/rotate-secret", {"overlap_ms": 0}),
        ("POST", f"/v1/jobs/{job}/backfill",
         {"from": "2026-01-01T00:00:00Z", "to": "2026-01-01T01:00:00Z"}),
        ("GET", f"/v1/runs/{run}", None),
        ("POST", f"/v1/runs/{run}/start", {"worker_id": "a-worker"}),
        ("POST", f"/v1/runs/{run}/heartbeat", fence),
        ("POST", f"/v1/runs/{run}/complete", {**fence, "outcome": "SUCCEEDED"}),
        ("POST", f"/v1/runs/{run}/cancel", None),
        ("DELETE", f"/v1/keys/{w['key']}", None),
        ("GET", f"/v1/workflows/{w['wf']}", None),
        ("DELETE", f"/v1/workflows/{w['wf']}", None),
        ("POST", f"/v1/workflows/{w['wf']}/pause", None),
        ("POST", f"/v1/workflows/{w['wf']}/resume", None),
        ("POST", f"/v1/workflows/{w['wf']}/trigger", None),
        ("GET", f"/v1/workflows/{w['wf']}/runs", None),
        ("GET", f"/v1/workflow-runs/{w['wfr']}", None),
        ("POST", f"/v1/workflow-runs/{w['wfr']}/cancel", None),
    ]  # fmt: skip


def batch_matrix(w: dict) -> list[tuple[str, dict]]:
    """Routes that name ids in their body, one item per id (the batch worker routes)."""
    fence = {"attempt": 1, "start_token": w["token"]}
    return [
        ("/v1/runs/start-batch", {"worker_id": "a-worker", "runs": [{"run_id": w["run"]}]}),
        ("/v1/runs/complete-batch",
         {"runs": [{"run_id": w["run"], **fence, "outcome": "SUCCEEDED"}]}),
    ]  # fmt: skip


def test_isolation_matrix__covers_every_tenant_route_with_an_id(client, world):
    spec = client.get("/openapi.json").json()["paths"]
    with_ids = {
        (method.upper(), path)
        for path, ops in spec.items()
        if path.startswith("/v1/") and "{" in path and not path.startswith("/v1/tenants")
        for method in ops
    }
    covered = set()
    for method, path, _ in matrix(world):
        for m, template in with_ids:
            if m == method and re.fullmatch(re.sub(r"\{[^}]+\}", "[^/]+", template), path):
                covered.add((m, template))
    assert with_ids - covered == set(), "add the new tenant route to the isolation matrix"
    # Routes whose body names ids (every request schema with a `run_id` inside).
    with_body_ids = {
        path
        for path, ops in spec.items()
        for op in ops.values()
        if "{" not in path and '"run_id"' in json.dumps(op.get("requestBody", {}))
    }
    assert with_body_ids == {path for path, _ in batch_matrix(world)}, "add it to batch_matrix"


def test_isolation__a_key_with_b_ids__404_and_nothing_of_b(client, world):
    for method, path, body in matrix(world):
        r = client.request(method, path, json=body, headers=world["a"])
        assert r.status_code == 404, (method, path, r.status_code, r.text)
        assert r.json()["code"] == "NOT_FOUND"
        for secret in (world["job"], world["run"], world["b_id"], "of-b", "secret-queue"):
            assert secret not in r.text, (method, path)


def test_isolation__batch_routes__every_item_of_b_is_404_and_nothing_of_b(client, world):
    for path, body in batch_matrix(world):
        r = client.post(path, json=body, headers=world["a"])
        assert r.status_code == 200, (path, r.text)
        items = r.json()["results"]
        assert [(i["status"], i["problem"]["code"]) for i in items] == [(404, "NOT_FOUND")]
        assert "body" not in items[0]
        for secret in (world["job"], world["b_id"], "of-b", "secret-queue", world["token"]):
            assert secret not in r.text, path


def test_isolation__b_unchanged_after_the_matrix(client, world):
    for method, path, body in matrix(world):
        client.request(method, path, json=body, headers=world["a"])
    for path, body in batch_matrix(world):
        client.post(path, json=body, headers=world["a"])
    b = world["b"]
    job = client.get(f"/v1/jobs/{world['job']}", headers=b).json()
    assert job["name"] == "b-job" and job["paused"] is False
    assert job["version"] == world["job_view"]["version"]
    run = client.get(f"/v1/runs/{world['run']}", headers=b).json()
    assert run["state"] == "RUNNING" and run["worker_id"] == "b-worker"
    # B's runs: the triggered job run and the workflow run's one node, no more.
    assert len(client.get("/v1/runs", headers=b).json()["items"]) == 2
    wfr = client.get(f"/v1/workflow-runs/{world['wfr']}", headers=b).json()
    assert wfr["state"] == "RUNNING"
    assert client.get(f"/v1/workflows/{world['wf']}", headers=b).status_code == 200
    keys = client.get("/v1/keys", headers=b).json()["items"]
    assert all(k["revoked_at"] is None for k in keys) and len(keys) == 2


def test_isolation__lists_never_show_b(client, world):
    a = world["a"]
    for path, params in [
        ("/v1/jobs", {}),
        ("/v1/runs", {}),
        ("/v1/runs", {"job_id": world["job"]}),
        ("/v1/runs", {"state": "RUNNING"}),
        ("/v1/keys", {}),
    ]:
        r = client.get(path, params=params, headers=a)
        assert r.status_code == 200
        for secret in (world["job"], world["run"], world["b_id"], world["key"], "of-b"):
            assert secret not in r.text, (path, params)
    assert [j["name"] for j in client.get("/v1/jobs", headers=a).json()["items"]] == ["a-job"]


# -- the second line: row-level security -----------------------------------------------


def _scoped(conn, tenant_id: str) -> None:
    conn.execute("SELECT set_config('cronwheel.tenant_id', %s, true)", [tenant_id])


def test_rls__scoped_transaction_without_tenant_filter__sees_only_its_tenant(app, world):
    tables = ["tenants", "api_keys", "jobs", "runs_daily", "run_attempts_daily", "timers"]
    with app.state.gateway.pool.connection() as conn, conn.transaction():
        _scoped(conn, world["a_id"])
        counts = {t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in tables}
        tenants = {r[0] for r in conn.execute("SELECT tenant_id FROM jobs")}
    # A: itself, one key, one job with its timer; no runs (B has one, with an attempt).
    assert counts == {"tenants": 1, "api_keys": 1, "jobs": 1, "runs_daily": 0,
                      "run_attempts_daily": 0, "timers": 1}  # fmt: skip
    assert tenants == {world["a_id"]}


def test_rls__scoped_writes_to_another_tenant__change_nothing_or_fail(app, world):
    with app.state.gateway.pool.connection() as conn:
        with conn.transaction():
            _scoped(conn, world["a_id"])
            changed = conn.execute(
                "UPDATE jobs SET paused = true WHERE job_id = %s", [world["job"]]
            ).rowcount
            deleted = conn.execute("DELETE FROM timers").rowcount
        assert changed == 0 and deleted == 1  # only A's own timer
        with pytest.raises(psycopg.errors.InsufficientPrivilege), conn.transaction():
            _scoped(conn, world["a_id"])
            conn.execute(
                "INSERT INTO api_keys (key_id, tenant_id, key_hash) VALUES ('k', %s, 'x')",
                [world["b_id"]],
            )


def test_rls__gateway_session_outside_a_declared_scope__sees_nothing(app, world):
    with app.state.gateway.pool.connection() as conn:
        assert conn.execute("SELECT count(*) FROM jobs").fetchone()[0] == 0
        assert conn.execute("SELECT count(*) FROM api_keys").fetchone()[0] == 0


def test_rls__service_sessions_without_the_setting__see_every_tenant(database_url, world):
    """The timer, relay and dispatcher never set a scope: nothing changes for them."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        assert conn.execute("SELECT count(DISTINCT tenant_id) FROM jobs").fetchone()[0] == 2
        assert conn.execute("SELECT count(*) FROM outbox").fetchone()[0] >= 1
        with conn.transaction():
            _scoped(conn, world["a_id"])
        # After a scoped transaction ends the setting is '' again: unscoped.
        assert conn.execute("SELECT count(DISTINCT tenant_id) FROM jobs").fetchone()[0] == 2
