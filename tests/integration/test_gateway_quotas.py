"""Object quotas per tenant (jobs, workflows, keys): the defaults, the operator's
raise, the 409 QUOTA_EXCEEDED, a batch counted job by job, and the last slot
taken once under concurrency; `GET /v1/keys` paginated."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import psycopg
import pytest

from cronwheel.kafka import Topics
from cronwheel.store import quotas
from cronwheel.store.quotas import ObjectLimits
from services.gateway.app import create_app
from tests.support import gateway
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration

OPERATOR_KEY = "cwop_quotas_operator"
OP = {"Authorization": f"Bearer {OPERATOR_KEY}"}
JOB = {
    "name": "j",
    "schedule": {"cron": "0 0 1 1 *", "timezone": "UTC"},
    "target": {"type": "queue", "queue": "q"},
}
BAD_JOB = {**JOB, "schedule": {"cron": "not a cron", "timezone": "UTC"}}
WORKFLOW = {"name": "w", "nodes": [{"name": "a", "target": {"type": "queue", "queue": "q"}}]}
LIMITS = ObjectLimits(jobs=5, workflows=1, keys=3)


@contextmanager
def served(database_url, kafka_bootstrap, topic_prefix, **kwargs) -> Iterator[httpx.Client]:
    app = create_app(
        database_url, Topics(topic_prefix), kafka_bootstrap, OPERATOR_KEY, pool_max=12, **kwargs
    )
    app.state.object_limits = LIMITS
    with gateway.served(app) as client:
        yield client


@pytest.fixture(params=[True, False], ids=["fastpath", "fastapi"])
def client(request, database_url, kafka_bootstrap, topic_prefix):
    with served(database_url, kafka_bootstrap, topic_prefix, jobs_fastpath=request.param) as client:
        yield client


def tenant(client: httpx.Client, name: str = "acme") -> tuple[str, dict]:
    r = client.post("/v1/tenants", json={"name": name}, headers=OP)
    assert r.status_code == 201, r.text
    return r.json()["tenant_id"], {"Authorization": f"Bearer {r.json()['api_key']}"}


def live_jobs(database_url: str, tenant_id: str) -> int:
    with psycopg.connect(database_url) as conn:
        return conn.execute(
            "SELECT count(*) FROM jobs WHERE tenant_id = %s AND deleted_at IS NULL", [tenant_id]
        ).fetchone()[0]


def assert_exceeded(r: httpx.Response, kind: str, limit: int, count: int) -> None:
    assert r.status_code == 409, r.text
    doc = r.json()
    assert r.headers["content-type"].startswith("application/problem+json")
    assert doc["code"] == "QUOTA_EXCEEDED"
    assert f"quota {kind} exceeded: limit {limit}, count {count}" in doc["detail"]


def test_jobs__past_the_default__409_naming_quota_limit_and_count(client, database_url):
    tid, h = tenant(client)
    for _ in range(5):
        assert client.post("/v1/jobs", json=JOB, headers=h).status_code == 201
    assert_exceeded(client.post("/v1/jobs", json=JOB, headers=h), "jobs", 5, 5)
    assert live_jobs(database_url, tid) == 5
    # A bad job at the limit is still refused for what is wrong with it.
    r = client.post("/v1/jobs", json=BAD_JOB, headers=h)
    assert r.status_code == 422 and r.json()["field"] == "schedule.cron"
    # Deleting one frees its slot.
    first = client.get("/v1/jobs", headers=h).json()["items"][0]["job_id"]
    assert client.delete(f"/v1/jobs/{first}", headers=h).status_code == 204
    assert client.post("/v1/jobs", json=JOB, headers=h).status_code == 201
    assert_exceeded(client.post("/v1/jobs", json=JOB, headers=h), "jobs", 5, 5)
    # Another tenant has its own count.
    _other, h2 = tenant(client, "other")
    assert client.post("/v1/jobs", json=JOB, headers=h2).status_code == 201


def test_batch__counts_every_job__those_past_the_quota_refused_in_their_slot(client, database_url):
    tid, h = tenant(client)
    for _ in range(2):
        assert client.post("/v1/jobs", json=JOB, headers=h).status_code == 201
    batch = [JOB, BAD_JOB, JOB, JOB, JOB, JOB]
    r = client.post("/v1/jobs/batch", json={"jobs": batch}, headers=h)
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert [x["status"] for x in results] == [201, 422, 201, 201, 409, 409]
    assert results[1]["problem"]["field"] == "schedule.cron"
    for x in results[4:]:
        assert x["problem"]["code"] == "QUOTA_EXCEEDED"
        assert "quota jobs exceeded: limit 5, count 5" in x["problem"]["detail"]
    assert live_jobs(database_url, tid) == 5
    # Under the quota a batch is not touched by it.
    _t2, h2 = tenant(client, "roomy")
    r = client.post("/v1/jobs/batch", json={"jobs": [JOB] * 5}, headers=h2)
    assert [x["status"] for x in r.json()["results"]] == [201] * 5


def test_jobs__concurrent_creations__the_free_slots_taken_once(client, database_url):
    tid, h = tenant(client)
    for _ in range(3):
        assert client.post("/v1/jobs", json=JOB, headers=h).status_code == 201
    statuses: list[int] = []
    start = threading.Barrier(12)

    def create() -> None:
        start.wait()
        statuses.append(client.post("/v1/jobs", json=JOB, headers=h).status_code)

    threads = [threading.Thread(target=create) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(statuses) == [201, 201] + [409] * 10
    assert live_jobs(database_url, tid) == 5


def test_jobs__a_creation_waits_for_the_one_holding_the_last_slot(
    database_url, kafka_bootstrap, topic_prefix
):
    """Two creations at the last slot, interleaved on purpose: the other
    transaction (here, by hand) counts and writes the 5th job and holds its
    lock; the request meanwhile waits for it, and counts after it committed."""
    from cronwheel.store.jobs import Jobs

    with served(database_url, kafka_bootstrap, topic_prefix) as client:
        tid, h = tenant(client)
        for _ in range(4):
            assert client.post("/v1/jobs", json=JOB, headers=h).status_code == 201
        answers: list[httpx.Response] = []
        with psycopg.connect(database_url) as other:
            with other.transaction():
                room = quotas.reserve(other, tid, "jobs", 1, LIMITS)
                assert (room.limit, room.count) == (5, 4)
                tenant_row = {"tenant_id": tid, "priority_classes": ["high", "normal", "low"]}
                Jobs(Topics("unused")).create(other, tenant_row, JOB, 1_800_000_000_000)
                request = threading.Thread(
                    target=lambda: answers.append(client.post("/v1/jobs", json=JOB, headers=h))
                )
                request.start()
                wait_for(lambda: _waiting_on_advisory_lock(database_url), 30, 0.02, "a waiter")
                assert not answers  # still waiting for this transaction
            request.join(30)
        assert_exceeded(answers[0], "jobs", 5, 5)
        assert live_jobs(database_url, tid) == 5


def _waiting_on_advisory_lock(database_url: str) -> bool:
    with psycopg.connect(database_url) as conn:
        return bool(
            conn.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
                " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
            ).fetchone()[0]
        )


def test_workflows_and_keys__their_own_quotas(client):
    tid, h = tenant(client)
    assert client.post("/v1/workflows", json=WORKFLOW, headers=h).status_code == 201
    assert_exceeded(client.post("/v1/workflows", json=WORKFLOW, headers=h), "workflows", 1, 1)
    # Keys: the first came with the tenant; the operator's issue counts too.
    assert client.post("/v1/keys", json={"label": "two"}, headers=h).status_code == 201
    assert client.post(f"/v1/tenants/{tid}/keys", headers=OP).status_code == 201
    assert_exceeded(client.post("/v1/keys", headers=h), "keys", 3, 3)
    assert_exceeded(client.post(f"/v1/tenants/{tid}/keys", headers=OP), "keys", 3, 3)
    # A revoked key no longer counts.
    two = [k for k in client.get("/v1/keys", headers=h).json()["items"] if k["label"] == "two"]
    assert client.delete(f"/v1/keys/{two[0]['key_id']}", headers=h).status_code == 204
    assert client.post("/v1/keys", headers=h).status_code == 201


def test_operator__raises_and_resets_a_tenants_quota__rate_quotas_unchanged(client):
    tid, h = tenant(client)
    path = f"/v1/tenants/{tid}/quotas/objects"
    assert client.get(path, headers=OP).json() == {
        "jobs": {"limit": 5, "count": 0, "default": True},
        "workflows": {"limit": 1, "count": 0, "default": True},
        "keys": {"limit": 3, "count": 1, "default": True},
    }
    r = client.put(path, json={"workflows": 2}, headers=OP)
    assert r.status_code == 200, r.text
    assert r.json()["workflows"] == {"limit": 2, "count": 0, "default": False}
    for _ in range(2):
        assert client.post("/v1/workflows", json=WORKFLOW, headers=h).status_code == 201
    assert_exceeded(client.post("/v1/workflows", json=WORKFLOW, headers=h), "workflows", 2, 2)
    # The rate quotas answer as before and leave the object quotas be.
    rates = f"/v1/tenants/{tid}/quotas"
    assert client.get(rates, headers=OP).json() == {"fire": None, "dispatch": None}
    assert client.put(rates, json={"fire": {"rate_per_s": 5}}, headers=OP).status_code == 200
    assert client.get(path, headers=OP).json()["workflows"]["limit"] == 2
    # Lowering below the count is allowed: it only stops new ones; null resets.
    r = client.put(path, json={"workflows": 0, "jobs": None}, headers=OP)
    assert r.json()["workflows"] == {"limit": 0, "count": 2, "default": False}
    assert r.json()["jobs"]["default"] is True
    r = client.put(path, json={"workflows": None}, headers=OP)
    assert r.json()["workflows"] == {"limit": 1, "count": 2, "default": True}
    # The tenant may neither read nor raise its own.
    assert client.get(path, headers=h).status_code == 403
    assert client.put(path, json={"jobs": 10**6}, headers=h).status_code == 403
    assert client.get("/v1/tenants/ten_nope/quotas/objects", headers=OP).status_code == 404


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"jobs": -1}, "jobs"),
        ({"jobs": 1.5}, "jobs"),
        ({"jobs": True}, "jobs"),
        ({"keys": 10**10}, "keys"),
        ({"runs": 5}, "runs"),
    ],
)
def test_operator__bad_quota__422_naming_the_field(database_url, kafka_bootstrap, topic_prefix,
                                                  body, field):  # fmt: skip
    with served(database_url, kafka_bootstrap, topic_prefix) as client:
        tid, _h = tenant(client)
        path = f"/v1/tenants/{tid}/quotas/objects"
        r = client.put(path, json=body, headers=OP)
        assert r.status_code == 422 and r.json()["field"] == field, r.text
        assert all(q["default"] for q in client.get(path, headers=OP).json().values())


def test_keys__paginated_oldest_first_nothing_repeated(database_url, kafka_bootstrap, topic_prefix):
    with served(database_url, kafka_bootstrap, topic_prefix) as client:
        tid, h = tenant(client)
        client.put(f"/v1/tenants/{tid}/quotas/objects", json={"keys": 10}, headers=OP)
        issued = [client.post("/v1/keys", json={"label": f"k{i}"}, headers=h) for i in range(6)]
        assert all(r.status_code == 201 for r in issued)
        for base, headers in (("/v1/keys", h), (f"/v1/tenants/{tid}/keys", OP)):
            seen, cursor = [], None
            while True:
                params = {"limit": 3} | ({"cursor": cursor} if cursor else {})
                page = client.get(base, params=params, headers=headers).json()
                assert len(page["items"]) <= 3
                seen += [k["label"] for k in page["items"]]
                cursor = page["next_cursor"]
                if cursor is None:
                    break
            assert seen == [None] + [f"k{i}" for i in range(6)]  # the first key has no label
            whole = client.get(base, headers=headers).json()
            assert whole["next_cursor"] is None and len(whole["items"]) == 7
            for params, field in (({"cursor": "nope"}, "cursor"), ({"limit": 0}, "limit")):
                r = client.get(base, params=params, headers=headers)
                assert r.status_code == 422 and r.json()["field"] == field, r.text
