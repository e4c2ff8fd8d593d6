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
from services.webhook import delivery
from services.webhook.database import Database
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
    db = Database(database_url, 1, threading.Event(), max_group=48)
    try:
        got = asyncio.run(_submit_all(db, [(service._start, (t,)) for t in targets]))
    finally:
        db.close()
    assert got[5] == "already_started"  # refused alone; the rest of its group went on
    started = [g for i, g in enumerate(got) if i != 5]
    assert all(isinstance(g, dict) for g in started), got
    assert len({g["start_token"] for g in started}) == len(started)
    assert db.grouped == 70 and db.groups == 2  # 70 calls, groups of at most max_group
    ours = conn.execute(
        "SELECT count(*) FROM runs_daily WHERE run_id = ANY(%s) AND state = 'RUNNING'"
        " AND worker_id = 'webhook:g1'",
        [[t.run_id for t in targets if t is not taken]],
    ).fetchone()[0]
    assert ours == 69


def test_warm__every_thread_opens_and_primes_its_connection__calls_then_use_them(database_url):
    """A fresh instance's first delivery does not open connections: warm()
    opened one per thread (groups' and the lookups'), each primed once."""
    primed: list[int] = []
    db = Database(database_url, 2, threading.Event())
    try:
        db.warm(lambda c: primed.append(c.info.backend_pid))
        wait_for(lambda: len(primed) == 3, timeout=10, what="three connections primed")
        assert len(set(primed)) == 3  # one each, on three threads
        used = asyncio.run(db.call(lambda c: c.info.backend_pid))
        assert used in primed and len(db._all) == 3  # no connection opened for it
    finally:
        db.close()


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


def test_batch__starts_then_completes_of_one_turn__one_lifecycle_call_per_group(
    database_url, topics, conn, tenant, receiver
):
    """submit_many: the StartRuns of a turn go as one start_many per group, the
    CompleteRuns as one complete_many; each caller still gets its own answer
    (a refusal for the run another worker holds, None for a stale fence)."""
    job, _secret = webhook_job(conn, topics, tenant, receiver.url("/hook"))
    targets = _targets(conn, topics, tenant, job, 60)
    taken = targets[7]
    Lifecycle(topics).start(conn, tenant["tenant_id"], taken.run_id, "someone-else", now_ms())
    service = WebhookService(database_url, "unused:9092", topics, instance="b1", allow=[])
    sizes: list[int] = []

    def start_many(c, items):
        sizes.append(len(items))
        return service._start_many(c, items)

    def complete_many(c, items):
        sizes.append(len(items))
        return service._complete_many(c, items)

    db = Database(database_url, 1, threading.Event(), max_group=48)
    ok = delivery.classify_status(200)
    try:
        got = asyncio.run(_submit_all_many(db, start_many, targets))
        assert got[7] == "already_started"
        mine = [(t, g) for t, g in zip(targets, got, strict=True) if t is not taken]
        assert all(isinstance(g, dict) for _t, g in mine)
        assert sizes == [48, 12]  # 60 calls in groups of at most max_group, one batch each
        items = [(t, g, ok, {"status": 200}) for t, g in mine]
        stale = (mine[0][0], {**mine[0][1], "start_token": "not-the-token"}, ok, None)
        sizes.clear()
        done = asyncio.run(_submit_all_many(db, complete_many, [stale, *items]))
    finally:
        db.close()
    assert sizes == [48, 12]
    assert done[0] is None  # refused (stale fence): logged, answered None
    assert all(d == {"state": "SUCCEEDED", "attempt": 1} for d in done[1:]), done
    assert set(states(conn, [t.run_id for t, _g in mine]).values()) == {"SUCCEEDED"}


def test_batch__a_batch_that_raises__each_call_goes_again_alone(
    database_url, topics, conn, tenant, receiver
):
    job, _secret = webhook_job(conn, topics, tenant, receiver.url("/hook"))
    targets = _targets(conn, topics, tenant, job, 5)
    service = WebhookService(database_url, "unused:9092", topics, instance="b2", allow=[])
    seen: list[int] = []

    def flaky_start_many(c, items):
        seen.append(len(items))
        answers = service._start_many(c, items)
        if len(items) > 1:
            c.execute("SELECT 1/0")  # after the batch wrote: the group must roll back
        return answers

    async def both():
        heartbeat_like = db.submit(lambda c: c.execute("SELECT 1").fetchone()[0])
        starts = [db.submit_many(flaky_start_many, t) for t in targets]
        return await asyncio.gather(heartbeat_like, *starts)

    db = Database(database_url, 1, threading.Event())
    try:
        got = asyncio.run(both())
    finally:
        db.close()
    assert seen == [5, 1, 1, 1, 1, 1]  # the group, then each alone
    assert got[0] == 1
    assert all(isinstance(g, dict) and g["attempt"] == 1 for g in got[1:]), got
    assert set(states(conn, [t.run_id for t in targets]).values()) == {"RUNNING"}


async def _submit_all_many(db: Database, fn, items) -> list:
    return await asyncio.gather(*(db.submit_many(fn, i) for i in items), return_exceptions=True)


def _committed_to_the_end(service: WebhookService, topic: str) -> bool:
    """The service's group has committed every partition of `topic` that holds
    records up to its end (a partition of a class no run had holds none and
    has nothing to commit)."""
    c = kafka.consumer(service.group_id, service.bootstrap, principal="webhook")
    try:
        n = len(c.list_topics(topic, timeout=10).topics[topic].partitions)
        parts = [TopicPartition(topic, p) for p in range(n)]
        committed = {tp.partition: tp.offset for tp in c.committed(parts, timeout=10)}
        ends = {tp.partition: c.get_watermark_offsets(tp, timeout=10)[1] for tp in parts}
    finally:
        c.close()
    return any(ends.values()) and all(committed[p] == end for p, end in ends.items() if end)


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
        assert service._offsets.tracker.in_flight() == 0
        assert service._db.groups < service._db.grouped  # some calls did share a transaction
    got = receiver.requests("/hook")
    assert sorted(g.headers["webhook-id"] for g in got) == sorted(ids)
    tokens = dict(
        conn.execute(
            "SELECT run_id, start_token FROM runs_daily WHERE run_id = ANY(%s)", [ids]
        ).fetchall()
    )
    for g in got:
        verify(g, secret)
        assert g.headers["cronwheel-fencing-token"] == tokens[g.headers["webhook-id"]]
