"""What the webhook service does to deliver many runs at once: lifecycle calls
grouped into one transaction each (services/webhook/database.py), with every
caller still getting its own answer, and a burst of runs delivered once each,
signed, started before their offsets are committed. No timings here (speed
lives in bench/bench_webhook.py)."""

from __future__ import annotations

import asyncio
import threading

import psycopg
import pytest
from confluent_kafka import TopicPartition

from cronwheel import kafka
from cronwheel.core.clock import now_ms
from cronwheel.core.errors import ValidationError
from cronwheel.store import webhooks
from cronwheel.store.lifecycle import Lifecycle
from services.webhook.database import MAX_GROUP, Database
from services.webhook.service import WebhookService
from tests.integration import test_webhook_delivery as wd
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration

# The fixtures and helpers of the delivery tests (one receiver, one platform).
conn, receiver, tenant, topics = wd.conn, wd.receiver, wd.tenant, wd.topics
Reply, platform, states, trigger, verify = wd.Reply, wd.platform, wd.states, wd.trigger, wd.verify
webhook_job = wd.webhook_job


def _targets(conn, topics, tenant, job, n: int) -> list:
    ids = [trigger(conn, topics, tenant, job) for _ in range(n)]
    found = webhooks.delivery_targets(conn, ids, now_ms())
    return [found[i] for i in ids]


async def _submit_all(db: Database, calls) -> list:
    """Every call submitted in the same turn of the loop; answers or exceptions."""
    return await asyncio.gather(*(db.submit(fn, *args) for fn, args in calls),
                                return_exceptions=True)  # fmt: skip


def test_group__calls_of_one_turn_share_transactions__each_caller_gets_its_own_answer(
    database_url, topics, conn, tenant, receiver
):
    job, _secret = webhook_job(conn, topics, tenant, receiver.url("/hook"))
    targets = _targets(conn, topics, tenant, job, 70)
    taken = targets[5]
    Lifecycle(topics).start(conn, tenant["tenant_id"], taken.run_id, "someone-else", now_ms())
    service = WebhookService(database_url, "unused:9092", topics, instance="g1", allow=[])
    db = Database(database_url, 1, threading.Event())
    try:
        got = asyncio.run(_submit_all(db, [(service._start, (t,)) for t in targets]))
    finally:
        db.close()
    assert got[5] == "already_started"  # refused alone; the rest of its group went on
    started = [g for i, g in enumerate(got) if i != 5]
    assert all(isinstance(g, dict) for g in started), got
    assert len({g["start_token"] for g in started}) == len(started)
    assert db.grouped == 70 and db.groups == 2  # 70 calls, groups of at most MAX_GROUP
    assert MAX_GROUP < 64  # each call's savepoint is a subtransaction: stay under 64
    ours = conn.execute(
        "SELECT count(*) FROM runs WHERE run_id = ANY(%s) AND state = 'RUNNING'"
        " AND worker_id = 'webhook:g1'",
        [[t.run_id for t in targets if t is not taken]],
    ).fetchone()[0]
    assert ours == 69


def test_group__a_database_error_in_one_call__the_others_go_alone_and_land(
    database_url, topics, conn, tenant, receiver
):
    job, _secret = webhook_job(conn, topics, tenant, receiver.url("/hook"))
    targets = _targets(conn, topics, tenant, job, 4)
    service = WebhookService(database_url, "unused:9092", topics, instance="g2", allow=[])

    def broken(c: psycopg.Connection) -> None:
        c.execute("SELECT 1/0")  # outside a savepoint: it spoils the group's transaction

    def invalid(c: psycopg.Connection) -> None:
        raise ValidationError("worker_id", "refused before any statement")

    calls = [(service._start, (t,)) for t in targets[:2]] + [(broken, ()), (invalid, ())]
    calls += [(service._start, (t,)) for t in targets[2:]]
    db = Database(database_url, 1, threading.Event())
    try:
        got = asyncio.run(_submit_all(db, calls))
    finally:
        db.close()
    assert isinstance(got[2], psycopg.errors.DivisionByZero)
    assert isinstance(got[3], ValidationError)
    for answer in got[:2] + got[4:]:
        assert isinstance(answer, dict) and answer["attempt"] == 1
    assert set(states(conn, [t.run_id for t in targets]).values()) == {"RUNNING"}


def _committed_to_the_end(service: WebhookService, topic: str) -> bool:
    """The service's group has committed every partition of `topic` up to its end."""
    c = kafka.consumer(service.group_id, service.bootstrap)
    try:
        parts = [TopicPartition(topic, p) for p in range(2)]
        committed = {tp.partition: tp.offset for tp in c.committed(parts, timeout=10)}
        ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                for p in range(2)}  # fmt: skip
    finally:
        c.close()
    return all(committed[p] == ends[p] for p in ends)


def test_burst__every_run_delivered_once_signed__succeeded__offsets_committed(
    database_url, kafka_bootstrap, topics, conn, tenant, receiver
):
    """Runs that arrive together are started and completed in groups; each is
    still delivered once, with its own webhook-id and fencing token."""
    receiver.answer("/hook", Reply(200))
    job, secret = webhook_job(conn, topics, tenant, receiver.url("/hook"))
    n = 120
    with platform(database_url, kafka_bootstrap, topics, per_endpoint=32) as service:
        ids = [trigger(conn, topics, tenant, job) for _ in range(n)]
        wait_for(
            lambda: set(states(conn, ids).values()) == {"SUCCEEDED"}, 60,
            what="every run of the burst to succeed",
        )  # fmt: skip
        wait_for(
            lambda: _committed_to_the_end(service, topics.webhook(tenant["tenant_id"])), 20,
            what="the offsets of the burst to be committed",
        )  # fmt: skip
        assert service._offsets.in_flight() == 0
        assert service._db.groups < service._db.grouped  # some calls did share a transaction
    got = receiver.requests("/hook")
    assert sorted(g.headers["webhook-id"] for g in got) == sorted(ids)
    tokens = dict(
        conn.execute(
            "SELECT run_id, start_token FROM runs WHERE run_id = ANY(%s)", [ids]
        ).fetchall()
    )
    for g in got:
        verify(g, secret)
        assert g.headers["cronwheel-fencing-token"] == tokens[g.headers["webhook-id"]]
