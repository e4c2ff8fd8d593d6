"""POST /v1/jobs/batch over real HTTP and a real database: each job answered as
its own POST /v1/jobs would be, one bad job refusing only itself."""

from __future__ import annotations

import copy

import psycopg
import pytest

from cronwheel.core.ssrf import allowed_networks
from cronwheel.kafka import Topics
from services.gateway.app import create_app
from tests.integration.test_gateway_api import QUEUE_JOB, assert_problem, new_tenant
from tests.support.gateway import served

pytestmark = pytest.mark.integration


@pytest.fixture
def client(database_url, kafka_bootstrap, topic_prefix):
    """Loopback webhook destinations allowed (no request is sent in these tests),
    so a webhook job's destination check passes without a resolver."""
    app = create_app(
        database_url,
        Topics(topic_prefix),
        kafka_bootstrap,
        "cwop_test_operator_key",
        webhook_allow=allowed_networks("127.0.0.0/8"),
    )
    with served(app) as c:
        yield c


# What differs between two creations of the same body.
_PER_CREATION = ("job_id", "created_at", "updated_at", "last_instant")


def _differences(a: dict, b: dict, ignore: tuple[str, ...] = ()) -> dict:
    """The fields (other than the per-creation ones and `ignore`) whose values differ."""
    skip = (*_PER_CREATION, *ignore)
    keys = (set(a) | set(b)) - set(skip)
    return {k: (a.get(k), b.get(k)) for k in sorted(keys) if a.get(k) != b.get(k)}


def test_batch__valid_and_bad_jobs__each_answered_as_its_single_call__bad_ones_write_nothing(
    client, database_url
):
    auth = new_tenant(client)
    webhook = {
        **QUEUE_JOB,
        "name": "hook",
        "target": {"type": "webhook", "url": "http://127.0.0.1:9/hook"},
    }
    bad_cron = {**QUEUE_JOB, "schedule": {"cron": "61 * * * *", "timezone": "UTC"}}
    bad_prio = {**QUEUE_JOB, "priority": "critical"}  # not entitled by default
    private = {**webhook, "target": {"type": "webhook", "url": "http://10.1.2.3/x"}}
    jobs = [QUEUE_JOB, bad_cron, {"name": 5}, 7, bad_prio, private, webhook]
    r = client.post("/v1/jobs/batch", json={"jobs": jobs}, headers=auth)
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert [x["status"] for x in results] == [201, 422, 422, 422, 403, 422, 201]

    singles = [client.post("/v1/jobs", json=copy.deepcopy(j), headers=auth) for j in jobs]
    for i, (batched, single) in enumerate(zip(results, singles, strict=True)):
        assert batched["status"] == single.status_code, (i, single.text)
        if single.status_code == 201:
            secrets = ("signing_secret", "signing_secret_ids")
            assert _differences(batched["job"], single.json(), secrets) == {}, i
        else:
            assert batched["problem"] == single.json(), i
    assert results[0]["job"]["topic"] and results[0]["job"]["next_fire_at"]
    assert results[6]["job"]["signing_secret"]["secret"].startswith("whsec_")
    assert len(results[6]["job"]["signing_secret_ids"]) == 1
    assert results[1]["problem"]["field"].startswith("schedule")
    assert results[4]["problem"]["field"] == "priority"

    with psycopg.connect(database_url) as conn:
        jobs_written = conn.execute("SELECT count(*) FROM jobs").fetchone()[0]
        timers = conn.execute("SELECT count(*) FROM timers WHERE kind = 'job'").fetchone()[0]
    assert (jobs_written, timers) == (4, 4)  # two from the batch, two from the singles
    listed = client.get("/v1/jobs", headers=auth, params={"limit": 50}).json()["items"]
    assert {j["job_id"] for j in listed} >= {
        results[0]["job"]["job_id"],
        results[6]["job"]["job_id"],
    }


def test_batch__thousand_jobs__all_created_with_timers(client, database_url):
    auth = new_tenant(client)
    jobs = [{**QUEUE_JOB, "name": f"j{i}"} for i in range(1000)]
    r = client.post("/v1/jobs/batch", json={"jobs": jobs}, headers=auth, timeout=60)
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert [x["status"] for x in results] == [201] * 1000
    assert [x["job"]["name"] for x in results] == [f"j{i}" for i in range(1000)]
    with psycopg.connect(database_url) as conn:
        n = conn.execute(
            "SELECT count(*) FROM jobs j JOIN timers t ON t.partition_id = j.partition_id"
            " AND t.timer_id = 'job:' || j.job_id"
        ).fetchone()[0]
    assert n == 1000


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"jobs": []}, "jobs"),
        ({"jobs": [QUEUE_JOB] * 1001}, "jobs"),
        ({"jobs": {"name": "x"}}, "jobs"),
        ({}, "jobs"),
        ({"jobs": [QUEUE_JOB], "extra": 1}, "extra"),
    ],
)
def test_batch__bad_envelope__422_naming_the_field__nothing_written(
    client, database_url, body, field
):
    auth = new_tenant(client)
    assert_problem(
        client.post("/v1/jobs/batch", json=body, headers=auth), 422, "INVALID_FIELD", field
    )
    with psycopg.connect(database_url) as conn:
        assert conn.execute("SELECT count(*) FROM jobs").fetchone()[0] == 0


def test_batch__idempotency_key__replayed_not_created_twice(client, database_url):
    auth = {**new_tenant(client), "Idempotency-Key": "batch-1"}
    jobs = [{**QUEUE_JOB, "name": f"j{i}"} for i in range(3)]
    first = client.post("/v1/jobs/batch", json={"jobs": jobs}, headers=auth)
    again = client.post("/v1/jobs/batch", json={"jobs": jobs}, headers=auth)
    assert first.status_code == again.status_code == 200
    assert again.headers.get("Idempotent-Replayed") == "true"
    assert again.json() == first.json()
    with psycopg.connect(database_url) as conn:
        assert conn.execute("SELECT count(*) FROM jobs").fetchone()[0] == 3


def test_batch__operator_key__403(client):
    r = client.post(
        "/v1/jobs/batch",
        json={"jobs": [QUEUE_JOB]},
        headers={"Authorization": "Bearer cwop_test_operator_key"},
    )
    assert r.status_code in (401, 403), r.text
