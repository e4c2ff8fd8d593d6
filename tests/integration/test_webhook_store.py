"""The webhook store against the real database: signing secrets (creation,
rotation, overlap, tenant scope) and what a delivery reads."""

from __future__ import annotations

import base64

import psycopg
import pytest

from cronwheel.core.errors import Conflict, NotFound
from cronwheel.kafka import Topics
from cronwheel.store import webhooks
from cronwheel.store.jobs import Jobs, create_tenant
from cronwheel.store.lifecycle import Lifecycle

pytestmark = pytest.mark.integration

NOW = 1_800_000_000_000
HOUR = 3_600_000


@pytest.fixture
def conn(database_url):
    with psycopg.connect(database_url, autocommit=True) as c:
        yield c


@pytest.fixture
def topics() -> Topics:
    return Topics("store-test")


@pytest.fixture
def tenant(conn) -> dict:
    return create_tenant(conn, "acme")


@pytest.fixture
def job(conn, topics, tenant) -> dict:
    body = {
        "name": "hook",
        "schedule": {"every_ms": 86_400_000},
        "target": {"type": "webhook", "url": "https://hooks.example.com/x", "method": "PUT"},
        "payload": {"n": 1},
        "retry": {"max_attempts": 3, "initial_backoff_ms": 1000, "max_backoff_ms": 1000},
    }
    job = Jobs(topics).create(conn, tenant, body, NOW)
    # Jobs.create issues the first secret; these tests exercise issuing it.
    conn.execute("DELETE FROM webhook_secrets WHERE owner_id = %s", [job["job_id"]])
    return job


def test_create_secret__whsec_of_32_random_bytes__shown_once_then_only_its_id(conn, tenant, job):
    made = webhooks.create_secret(conn, tenant["tenant_id"], job["job_id"], NOW)
    assert made["secret"].startswith("whsec_")
    assert len(base64.b64decode(made["secret"][len("whsec_") :])) == 32
    assert webhooks.secret_ids(conn, job["job_id"], NOW) == [
        {"secret_id": made["secret_id"], "created_at": made["created_at"], "expires_at": None}
    ]
    assert webhooks.active_secrets(conn, job["job_id"], NOW) == [made["secret"]]
    with pytest.raises(Conflict) as exc:
        webhooks.create_secret(conn, tenant["tenant_id"], job["job_id"], NOW)
    assert exc.value.code == "SECRET_EXISTS"
    assert webhooks.ensure_secret(conn, tenant["tenant_id"], job["job_id"], NOW) is None


def test_create_secret__unknown_job_or_another_tenants_job__not_found(conn, tenant, job):
    other = create_tenant(conn, "other")
    with pytest.raises(NotFound):
        webhooks.create_secret(conn, other["tenant_id"], job["job_id"], NOW)
    with pytest.raises(NotFound):
        webhooks.create_secret(conn, tenant["tenant_id"], "job_missing", NOW)


def test_rotate__old_secret_signs_until_the_overlap_ends__new_one_first(conn, tenant, job):
    old = webhooks.create_secret(conn, tenant["tenant_id"], job["job_id"], NOW)
    new = webhooks.rotate_secret(conn, tenant["tenant_id"], job["job_id"], NOW + 1, HOUR)
    assert new["secret"] != old["secret"]
    assert new["previous"] == [
        {"secret_id": old["secret_id"], "signs_until": "2027-01-15T09:00:00.001Z"}
    ]
    owner = job["job_id"]
    assert webhooks.active_secrets(conn, owner, NOW + 2) == [new["secret"], old["secret"]]
    assert webhooks.active_secrets(conn, owner, NOW + 1 + HOUR) == [new["secret"]]
    ids = webhooks.secret_ids(conn, owner, NOW + 2)
    assert [i["secret_id"] for i in ids] == [new["secret_id"], old["secret_id"]]
    assert all("secret" not in i for i in ids)


def test_rotate__without_overlap__every_older_secret_stops_at_once(conn, tenant, job):
    webhooks.create_secret(conn, tenant["tenant_id"], job["job_id"], NOW)
    webhooks.rotate_secret(conn, tenant["tenant_id"], job["job_id"], NOW + 1)  # a day's overlap
    leaked = webhooks.rotate_secret(conn, tenant["tenant_id"], job["job_id"], NOW + 2, 0)
    assert len(leaked["previous"]) == 2
    assert webhooks.active_secrets(conn, job["job_id"], NOW + 2) == [leaked["secret"]]


def test_secrets__tenant_scoped_session__sees_only_its_own(conn, tenant, job):
    webhooks.create_secret(conn, tenant["tenant_id"], job["job_id"], NOW)
    other = create_tenant(conn, "other")
    with conn.transaction():
        conn.execute("SET LOCAL ROLE cronwheel_gateway")  # the role the scope binds (0018)
        conn.execute("SELECT set_config('cronwheel.tenant_id', %s, true)", [other["tenant_id"]])
        assert webhooks.active_secrets(conn, job["job_id"], NOW) == []
    with conn.transaction():
        conn.execute("SET LOCAL ROLE cronwheel_gateway")
        conn.execute("SELECT set_config('cronwheel.tenant_id', %s, true)", [tenant["tenant_id"]])
        assert len(webhooks.active_secrets(conn, job["job_id"], NOW)) == 1


def test_delivery_targets__run_spec_target_and_secrets__unknown_ids_left_out(
    conn, topics, tenant, job
):
    made = webhooks.create_secret(conn, tenant["tenant_id"], job["job_id"], NOW)
    run_id = Jobs(topics).trigger(conn, tenant, job["job_id"], NOW)["run_id"]
    got = webhooks.delivery_targets(conn, [run_id, "not-a-run", "0" * 32], NOW)
    assert list(got) == [run_id]
    t = got[run_id]
    assert (t.state, t.attempt, t.tenant_id, t.job_id) == (
        "PENDING",
        1,
        tenant["tenant_id"],
        job["job_id"],
    )
    assert t.target == {
        "type": "webhook",
        "url": "https://hooks.example.com/x",
        "method": "PUT",
        "headers": {},
    }
    assert t.payload == '{"n":1}'
    assert t.secrets == (made["secret"],)
    assert t.lease_ms == 30_000 and t.scheduled_ms == NOW


def test_defer_retry__moves_the_armed_retry_later_never_earlier(conn, topics, tenant, job):
    run_id = Jobs(topics).trigger(conn, tenant, job["job_id"], NOW)["run_id"]
    lc = Lifecycle(topics)
    started = lc.start(conn, tenant["tenant_id"], run_id, "webhook:t", NOW)
    with conn.transaction():
        done = lc.complete(
            conn, tenant["tenant_id"], run_id, 1, started["start_token"], "FAILED", NOW,
            error="HTTP 503",
        )  # fmt: skip
        assert done["state"] == "RETRY_WAIT"
        assert webhooks.defer_retry(conn, run_id, 1, NOW + 60_000) == NOW + 60_000
    assert webhooks.defer_retry(conn, run_id, 1, NOW + 10) == NOW + 60_000
    assert webhooks.defer_retry(conn, run_id, 2, NOW + 90_000) is None
