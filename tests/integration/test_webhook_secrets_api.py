"""Webhook signing secrets through the API: shown once at creation and on
rotation, only their ids afterwards; rotation keeps the old one signing."""

from __future__ import annotations

import pytest

from cronwheel.core.clock import now_ms
from cronwheel.kafka import Topics
from cronwheel.store import webhooks
from cronwheel.store.jobs import Jobs, create_tenant

pytestmark = pytest.mark.integration

WEBHOOK = {
    "name": "hook",
    "schedule": {"every_ms": 60_000},
    "target": {"type": "webhook", "url": "https://example.com/hook"},
}


@pytest.fixture
def setup(database_url, topic_prefix):
    import psycopg

    with psycopg.connect(database_url, autocommit=True) as conn:
        yield conn, Jobs(Topics(topic_prefix)), create_tenant(conn, "acme")


def test_create_webhook_job__secret_shown_once__then_only_its_id(setup):
    conn, jobs, tenant = setup
    job = jobs.create(conn, tenant, WEBHOOK, now_ms())
    secret = job["signing_secret"]
    assert secret["secret"].startswith("whsec_")
    again = jobs.get(conn, tenant["tenant_id"], job["job_id"])
    assert "signing_secret" not in again
    assert [s["secret_id"] for s in again["signing_secret_ids"]] == [secret["secret_id"]]
    assert webhooks.active_secrets(conn, job["job_id"], now_ms()) == [secret["secret"]]


def test_rotate__both_secrets_sign_during_the_overlap__old_one_stops_after(setup):
    conn, jobs, tenant = setup
    job = jobs.create(conn, tenant, WEBHOOK, now_ms())
    old = job["signing_secret"]["secret"]
    now = now_ms()
    new = jobs.rotate_secret(conn, tenant, job["job_id"], now, overlap_ms=60_000)
    assert webhooks.active_secrets(conn, job["job_id"], now + 1) == [new["secret"], old]
    assert webhooks.active_secrets(conn, job["job_id"], now + 61_000) == [new["secret"]]


def test_rotate__queue_job__refused(setup):
    conn, jobs, tenant = setup
    job = jobs.create(
        conn, tenant, {**WEBHOOK, "target": {"type": "queue", "queue": "q"}}, now_ms()
    )
    with pytest.raises(Exception, match="webhook"):
        jobs.rotate_secret(conn, tenant, job["job_id"], now_ms(), 0)
