"""Per-tenant webhook delivery slots against the real stack: tenant A's endpoints
hang and A has more runs than its slots; tenant B's runs are delivered while A
holds exactly its slots; once A's endpoints answer, every A run is delivered
exactly once. Timer, relay, dispatcher and the webhook service in-process (as
test_webhook_delivery.py), real local HTTP receivers."""

from __future__ import annotations

import threading
from collections import Counter

import pytest
from prometheus_client import REGISTRY

from cronwheel import kafka
from cronwheel.store.jobs import create_tenant
from tests.integration import test_webhook_delivery as delivery
from tests.integration.test_webhook_delivery import (
    Receiver,
    Reply,
    platform,
    states,
    trigger,
    verify,
    webhook_job,
)
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration

SLOTS = 3
conn, topics = delivery.conn, delivery.topics  # the same fixtures


def new_tenant(conn, topics, kafka_bootstrap, name: str) -> dict:
    t = create_tenant(conn, name)
    kafka.ensure_topics(  # up front, so the service is reading them when runs come
        [topics.runs(t["tenant_id"]), topics.webhook(t["tenant_id"])],
        partitions=2,
        bootstrap=kafka_bootstrap,
        principal="dispatcher",
    )
    return t


def tenant_waiting() -> float | None:
    return REGISTRY.get_sample_value("cronwheel_webhook_tenant_waiting_runs")


def test_tenant_slots__hanging_tenant_holds_its_cap__other_tenant_delivered__then_each_once(
    database_url, kafka_bootstrap, topics, conn
):
    a = new_tenant(conn, topics, kafka_bootstrap, "hangs")
    b = new_tenant(conn, topics, kafka_bootstrap, "prompt")
    # A's two endpoints hold every request open until released; B's answer at once.
    hold = threading.Event()
    a_hooks, b_hook = [Receiver(), Receiver()], Receiver()
    a_jobs = []
    for r in a_hooks:
        r.answer("/hang", Reply(200, hold=hold))
        a_jobs.append(webhook_job(conn, topics, a, r.url("/hang"), timeout_ms=60_000))
    b_job, b_secret = webhook_job(conn, topics, b, b_hook.url("/fast"))

    def a_held() -> int:  # requests A's endpoints hold open now (none answered yet)
        return sum(len(r.requests("/hang")) for r in a_hooks)

    try:
        # Per endpoint 16 and in all 512: only the tenant's slots can stop A at 3.
        with platform(database_url, kafka_bootstrap, topics, tenant_slots=SLOTS) as service:
            a_runs = [trigger(conn, topics, a, job) for job, _s in a_jobs for _ in range(4)]
            wait_for(lambda: a_held() == SLOTS, 20, what="A's endpoints to hold its slots")
            wait_for(
                lambda: service.tenants.waiting() == tenant_waiting() == len(a_runs) - SLOTS,
                20,
                what="A's other runs to wait for A's slots",
            )
            b_runs = [trigger(conn, topics, b, b_job) for _ in range(5)]
            wait_for(
                lambda: set(states(conn, b_runs).values()) == {"SUCCEEDED"},
                20,
                what="B's runs, while A's endpoints hang",
            )
            # B went through while A held exactly its cap, and no more.
            assert a_held() == SLOTS
            assert service.tenants.in_use(a["tenant_id"]) == SLOTS
            assert Counter(states(conn, a_runs).values()) == {
                "RUNNING": SLOTS,
                "PENDING": len(a_runs) - SLOTS,
            }, "A's waiting runs must stay PENDING (no lease, no attempt)"
            hold.set()
            wait_for(
                lambda: set(states(conn, a_runs).values()) == {"SUCCEEDED"},
                30,
                what="A's runs, once its endpoints answer",
            )
            wait_for(lambda: tenant_waiting() == 0, 10, what="the gauge to come back to 0")
    finally:
        hold.set()
        for r in [*a_hooks, b_hook]:
            r.close()
    delivered = Counter(g.headers["webhook-id"] for r in a_hooks for g in r.requests())
    assert delivered == dict.fromkeys(a_runs, 1), "each A run delivered exactly once"
    got_b = b_hook.requests("/fast")
    assert Counter(g.headers["webhook-id"] for g in got_b) == dict.fromkeys(b_runs, 1)
    for g in got_b:
        verify(g, b_secret)
    for (_job, secret), r in zip(a_jobs, a_hooks, strict=True):
        for g in r.requests():
            verify(g, secret)
    attempts = conn.execute(
        "SELECT max(attempt) FROM runs_daily WHERE run_id = ANY(%s)", [a_runs + b_runs]
    ).fetchone()[0]
    assert attempts == 1
