"""The dispatcher against the real broker and database: routing by target,
idempotency by (run_id, attempt), dead letters, and new tenant topics."""

from __future__ import annotations

import threading
import uuid

import psycopg
import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition
from prometheus_client import REGISTRY

from cronwheel import kafka
from cronwheel.core import events
from cronwheel.core.runs import PRIORITY_RANK
from cronwheel.kafka import Topics, class_of_partition
from cronwheel.store.jobs import Jobs, create_tenant
from services.dispatcher.service import Dispatcher
from tests.support.kafka import drain, read_all
from tests.support.running import running
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration

QUEUE = {"type": "queue", "queue": "billing"}


CREATED_MS = 1_700_000_000_003


def ready(
    tenant: str,
    run_id: str,
    *,
    target: dict = QUEUE,
    attempt: int = 1,
    priority: str = "normal",
    created_ms: int = CREATED_MS,
) -> bytes:
    return events.run_ready(
        run_id=run_id,
        tenant_id=tenant,
        partition_id=7,
        attempt=attempt,
        scheduled_ms=1_700_000_000_000,
        created_ms=created_ms,
        priority=priority,
        target=target,
        payload='{"n":1}',
    )


def produce(bootstrap: str, topic: str, records: list[tuple[bytes | None, bytes]], **kw) -> None:
    # The broker creates no topic on a produce: a run topic exists before its
    # first record (the dispatcher makes it when the tenant appears).
    kafka.ensure_topics([topic], bootstrap=bootstrap, principal="dispatcher")
    p = kafka.producer(bootstrap, principal="relay")  # run topics are the relay's to write
    errors = []
    for key, value in records:
        p.produce(
            topic, value=value, key=key, on_delivery=lambda e, _m: e and errors.append(e), **kw
        )
    assert p.flush(30) == 0 and errors == []


NO_LEADER_YET = {
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.UNKNOWN_TOPIC_OR_PART,
}


class Broker:
    """What the tests read back: record counts and a consumer group's progress."""

    def __init__(self, bootstrap: str, group: str):
        self.c = kafka.consumer(group, bootstrap, principal="dispatcher")  # its group's offsets

    def partitions(self, topic: str) -> list[TopicPartition]:
        meta = self.c.list_topics(topic, timeout=10).topics[topic]
        return [TopicPartition(topic, p) for p in meta.partitions] if not meta.error else []

    def count(self, topic: str) -> int:
        total = 0
        for tp in self.partitions(topic):
            low, high = self.c.get_watermark_offsets(tp, timeout=10)
            total += high - low
        return total

    def caught_up(self, topic: str) -> bool:
        """The group committed up to the end of every non-empty partition of `topic`.
        Not yet, while a fresh topic's partition has no leader the broker will
        answer for (NOT_LEADER_FOR_PARTITION): the caller polls again."""
        parts = self.partitions(topic)
        if not parts:
            return False
        for tp in self.c.committed(parts, timeout=10):
            try:
                _low, high = self.c.get_watermark_offsets(tp, timeout=10)
            except KafkaException as e:
                if e.args[0].code() in NO_LEADER_YET:
                    return False
                raise
            if high > 0 and tp.offset != high:
                return False
        return True

    def close(self) -> None:
        self.c.close()


@pytest.fixture
def topics(topic_prefix) -> Topics:
    return Topics(topic_prefix)


@pytest.fixture
def broker(kafka_bootstrap, topics):
    b = Broker(kafka_bootstrap, f"{topics.prefix}.dispatcher")
    yield b
    b.close()


def test_run_ready__routed_by_target__same_bytes_and_key_reach_queue_webhook_managed(
    database_url, kafka_bootstrap, topics
):
    sent = {
        "r-queue": ready("acme", "r-queue"),
        "r-webhook": ready("acme", "r-webhook", target={"type": "webhook", "url": "https://x"}),
        "r-managed": ready("acme", "r-managed", target={"type": "managed", "command": ["true"]}),
    }
    produce(kafka_bootstrap, topics.runs("acme"), [(k.encode(), v) for k, v in sent.items()])
    with running(Dispatcher(database_url, kafka_bootstrap, topics)) as dispatcher:
        wait_for(lambda: dispatcher.forwarded_total >= 3, timeout=60, what="three forwarded")
    dests = [topics.queue("acme", "billing"), topics.webhook("acme"), topics.managed("acme")]
    by_run = {m.key().decode(): (m.topic(), m) for m in read_all(kafka_bootstrap, dests)}
    assert {k: t for k, (t, _m) in by_run.items()} == {
        "r-queue": topics.queue("acme", "billing"),
        "r-webhook": topics.webhook("acme"),
        "r-managed": topics.managed("acme"),
    }
    for run_id, (_topic, msg) in by_run.items():
        assert msg.value() == sent[run_id]
        assert ("record", b"RunReady") in msg.headers()
    with psycopg.connect(database_url) as conn:
        keys = conn.execute(
            "SELECT message_key FROM processed WHERE consumer = 'dispatcher'"
        ).fetchall()
    assert sorted(k for (k,) in keys) == [
        f"r-managed:1:{CREATED_MS}",
        f"r-queue:1:{CREATED_MS}",
        f"r-webhook:1:{CREATED_MS}",
    ]


def test_duplicate__same_record_forwarded_once__next_attempt_and_new_announcement_forwarded(
    database_url, kafka_bootstrap, topics, broker
):
    """Skipped: the same announcement read again. Forwarded: a retry, and a new
    announcement of the same attempt (a re-announcement, or a firing again
    after PostgreSQL lost the first in a crash, whose first record may have
    reached a worker before the run existed again: dispatch.message_key)."""
    source, dest = topics.runs("acme"), topics.queue("acme", "billing")
    first, retry = ready("acme", "r1"), ready("acme", "r1", attempt=2)
    produce(kafka_bootstrap, source, [(b"r1", first), (b"r1", first), (b"r1", retry)])
    with running(Dispatcher(database_url, kafka_bootstrap, topics)):
        wait_for(lambda: broker.caught_up(source), timeout=30, what="dispatcher caught up")
        produce(kafka_bootstrap, source, [(b"r1", first)])  # e.g. the relay republished
        wait_for(lambda: broker.count(source) == 4 and broker.caught_up(source), timeout=30)
        assert broker.count(dest) == 2
        again = ready("acme", "r1", created_ms=CREATED_MS + 10_000)  # fired again
        produce(kafka_bootstrap, source, [(b"r1", again)])
        wait_for(lambda: broker.count(source) == 5 and broker.caught_up(source), timeout=30)
    assert broker.count(dest) == 3
    got = [
        (d["attempt"], d["created_at"])
        for _t, _k, _n, d, _m in drain(kafka_bootstrap, dest, want=3)
    ]
    assert got == [(1, CREATED_MS), (2, CREATED_MS), (1, CREATED_MS + 10_000)]

    # A dispatcher that rereads the whole topic (new group) forwards nothing again.
    group = f"{topics.prefix}.dispatcher-again"  # a group of the dispatcher's ACLs
    again = Broker(kafka_bootstrap, group)
    try:
        with running(Dispatcher(database_url, kafka_bootstrap, topics, group_id=group)):
            wait_for(lambda: again.caught_up(source), timeout=30, what="second group caught up")
    finally:
        again.close()
    assert broker.count(dest) == 3


def test_poison__garbage_wrong_record_unknown_target__dead_lettered__records_behind_forwarded(
    database_url, kafka_bootstrap, topics
):
    def dead(reason: str) -> float:
        labels = {"consumer": "dispatcher", "reason": reason}
        return REGISTRY.get_sample_value("cronwheel_dead_letters_total", labels) or 0.0

    reasons = ["undecodable", "wrong_record", "unknown_target", "wrong_tenant"]
    before = {r: dead(r) for r in reasons}
    completed = events.run_completed(
        run_id="r0", tenant_id="acme", partition_id=7, attempt=1, state="SUCCEEDED", finished_ms=1
    )
    poison = [
        (b"garbage", b"not avro at all"),
        (b"r0", completed),
        (b"r2", ready("acme", "r2", target={"type": "carrier-pigeon"})),
        (b"r3", ready("globex", "r3")),  # another tenant's run on acme's topic
    ]
    good = ready("acme", "r-after")
    # One partition: the good record sits behind the poison ones.
    produce(kafka_bootstrap, topics.runs("acme"), [*poison, (b"r-after", good)], partition=0)
    with running(Dispatcher(database_url, kafka_bootstrap, topics)):
        forwarded = drain(kafka_bootstrap, topics.queue("acme", "billing"), want=1)
        letters = drain(kafka_bootstrap, topics.dead_letter, want=4)
    assert [m.value() for *_x, m in forwarded] == [good]
    letters.sort(key=lambda r: r[3]["source_offset"])
    assert [(name, d["source_offset"]) for _t, _k, name, d, _m in letters] == [
        ("DeadLetter", 0),
        ("DeadLetter", 1),
        ("DeadLetter", 2),
        ("DeadLetter", 3),
    ]
    for (key, value), (_t, dl_key, _n, d, msg) in zip(poison, letters, strict=True):
        assert (d["key"], d["value"], dl_key) == (key, value, key)
        assert d["source_topic"] == topics.runs("acme") and d["source_partition"] == 0
        assert d["consumer"] == "dispatcher"
        assert ("record", b"DeadLetter") in msg.headers()
    assert [d["reason"] for *_x, d, _m in letters] == [
        "not single-object encoded",
        "expected RunReady, got RunCompleted",
        "unknown target_type 'carrier-pigeon'",
        f"tenant_id 'globex' does not own {topics.runs('acme')}",
    ]
    assert {r: dead(r) - before[r] for r in reasons} == dict.fromkeys(reasons, 1.0)


def test_new_tenant__row_committed__run_topic_created_and_read_without_waiting_for_a_scan(
    database_url, kafka_bootstrap, topics
):
    """The tenants trigger announces the tenant; the dispatcher creates its run
    topic and subscribes by name. The broker scan is off (an hour), so only the
    notification can explain the forward."""
    tenant = f"new{uuid.uuid4().hex[:6]}"
    admin = kafka.admin(kafka_bootstrap, principal="observer")
    with running(Dispatcher(database_url, kafka_bootstrap, topics, topic_scan_s=3600)) as d:
        wait_for(lambda: d.watch.names is not None and d._consumer is not None, what="started")
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute("INSERT INTO tenants (tenant_id, name) VALUES (%s, %s)", [tenant, tenant])
        wait_for(
            lambda: topics.runs(tenant) in admin.list_topics(timeout=10).topics,
            timeout=30,
            what="the dispatcher created the new tenant's run topic",
        )
        wait_for(lambda: topics.runs(tenant) in d.watch.names, timeout=10, what="subscribed")
        meta = admin.list_topics(topics.runs(tenant), timeout=10).topics[topics.runs(tenant)]
        assert len(meta.partitions) == kafka.RUN_PARTITIONS
        produce(kafka_bootstrap, topics.runs(tenant), [(b"r-1", ready(tenant, "r-1"))])
        got = drain(kafka_bootstrap, topics.queue(tenant, "billing"), want=1, timeout=30)
    assert [d["run_id"] for _t, _k, _n, d, _m in got] == ["r-1"]


def _tenant_with_a_job(database_url: str, topics: Topics, target: dict) -> dict:
    """A new tenant with one nightly job of `target`, as the API makes them."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        tenant = create_tenant(conn, f"t{uuid.uuid4().hex[:6]}")
        body = {
            "name": "nightly",
            "schedule": {"cron": "0 3 * * *", "timezone": "UTC"},
            "target": target,
        }
        with conn.transaction():
            Jobs(topics).create(conn, tenant, body, 1_700_000_000_000)
    return tenant


def test_job_created__its_queue_topic_made_before_any_run__announced_destination(
    database_url, kafka_bootstrap, topics
):
    """The jobs trigger names the job's destination; the dispatcher creates the
    topic then, so the first run's forward does not wait for a CreateTopics
    (and a worker that subscribes to the job's topic finds it)."""
    admin = kafka.admin(kafka_bootstrap, principal="observer")
    with running(Dispatcher(database_url, kafka_bootstrap, topics, topic_scan_s=3600)) as d:
        wait_for(lambda: d._consumer is not None, what="started")
        tenant = _tenant_with_a_job(database_url, topics, {"type": "queue", "queue": "reports"})
        queue = topics.queue(tenant["tenant_id"], "reports")
        wait_for(
            lambda: queue in admin.list_topics(timeout=10).topics,
            timeout=30,
            what="the job's queue topic, before any run",
        )
        assert d.forwarded_total == 0
        meta = admin.list_topics(queue, timeout=10).topics[queue]
        assert len(meta.partitions) == kafka.QUEUE_PARTITIONS  # an idle tenant costs little


def test_managed_job_created__its_topic_learned_by_the_producer_before_any_run(
    database_url, kafka_bootstrap, topics
):
    """A webhook or managed forward is placed in its class's partition, which
    needs the topic's partition count: asked of the broker when the job is
    made (on the watch's thread), not by the first run's forward in the
    dispatcher's loop."""
    with running(Dispatcher(database_url, kafka_bootstrap, topics, topic_scan_s=3600)) as d:
        wait_for(lambda: d._consumer is not None, what="started")
        tenant = _tenant_with_a_job(database_url, topics, {"type": "managed", "command": ["true"]})
        managed = topics.managed(tenant["tenant_id"])
        wait_for(
            lambda: d._placement.known(managed) is not None,
            timeout=30,
            what="the managed topic's partition count, before any run",
        )
        assert d._placement.known(managed) == topics.partitions(managed)
        assert d.forwarded_total == 0


def test_jobs_created_while_no_dispatcher_ran__their_topics_made_at_its_start(
    database_url, kafka_bootstrap, topics
):
    """No one listened when these jobs were created: the dispatcher reads every
    job's destination when it starts listening, so their topics exist before
    their first runs rather than being made in those runs' path."""
    admin = kafka.admin(kafka_bootstrap, principal="observer")
    with psycopg.connect(database_url, autocommit=True) as conn:
        tenant = create_tenant(conn, f"t{uuid.uuid4().hex[:6]}")
        with conn.transaction():
            for queue in ("alpha", "beta"):
                body = {
                    "name": f"nightly-{queue}",
                    "schedule": {"cron": "0 3 * * *", "timezone": "UTC"},
                    "target": {"type": "queue", "queue": queue},
                }
                Jobs(topics).create(conn, tenant, body, 1_700_000_000_000)
    queues = {topics.queue(tenant["tenant_id"], q) for q in ("alpha", "beta")}
    assert not queues & set(admin.list_topics(timeout=10).topics)
    with running(Dispatcher(database_url, kafka_bootstrap, topics, topic_scan_s=3600)) as d:
        wait_for(
            lambda: queues <= set(admin.list_topics(timeout=10).topics),
            timeout=30,
            what="the queue topics of jobs created before the dispatcher started",
        )
        assert d.forwarded_total == 0


def test_run_topic_of_no_known_tenant__created_after_start__found_by_the_broker_scan(
    database_url, kafka_bootstrap, topics
):
    produce(kafka_bootstrap, topics.runs("acme"), [(b"r-a", ready("acme", "r-a"))])
    with running(Dispatcher(database_url, kafka_bootstrap, topics, topic_scan_s=1)):
        assert drain(kafka_bootstrap, topics.queue("acme", "billing"), want=1)
        late = f"late{uuid.uuid4().hex[:6]}"
        produce(kafka_bootstrap, topics.runs(late), [(b"r-b", ready(late, "r-b"))])
        got = drain(kafka_bootstrap, topics.queue(late, "billing"), want=1, timeout=45)
    assert [d["run_id"] for _t, _k, _n, d, _m in got] == ["r-b"]


def test_priority__within_a_batch__higher_classes_forwarded_first(
    database_url, kafka_bootstrap, topics
):
    classes = ["low", "normal", "surprise", "critical", "high"]  # unknown counts as normal
    # One key for all, so the forwards share a destination partition and keep their order.
    records = [(b"k", ready("acme", f"r-{c}", priority=c)) for c in classes]
    produce(kafka_bootstrap, topics.runs("acme"), records, partition=0)
    batch = [m for *_x, m in drain(kafka_bootstrap, topics.runs("acme"), want=len(classes))]
    dispatcher = Dispatcher(database_url, kafka_bootstrap, topics)
    try:
        assert dispatcher.dispatch(batch, threading.Event())
    finally:
        dispatcher.close()
    got = drain(kafka_bootstrap, topics.queue("acme", "billing"), want=len(classes))
    assert [d["priority"] for *_x, d, _m in got] == [
        "critical",
        "high",
        "normal",
        "surprise",
        "low",
    ]


def test_processed__rows_past_retention__pruned_by_the_running_dispatcher__recent_kept(
    database_url, kafka_bootstrap, topics
):
    """`processed` would grow forever; rows older than the redelivery window go,
    in bites (here 3 bites of 5000 for 12k old rows), consumer by consumer."""
    day = 86_400_000
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO processed (consumer, message_key, processed_at)"
            " SELECT 'dispatcher', 'old-' || i, now() - interval '8 days' - i * interval '1 s'"
            "   FROM generate_series(1, 12000) i"
        )
        conn.execute(
            "INSERT INTO processed (consumer, message_key, processed_at) VALUES"
            " ('dispatcher', 'recent', now() - interval '6 days'),"
            " ('workflow', 'old-other-consumer', now() - interval '8 days')"
        )
    dispatcher = Dispatcher(database_url, kafka_bootstrap, topics, processed_retention_ms=7 * day)
    with running(dispatcher), psycopg.connect(database_url, autocommit=True) as conn:
        wait_for(
            lambda: conn.execute("SELECT count(*) FROM processed").fetchone()[0] == 2,
            timeout=30,
            what="old dispatcher rows pruned",
        )
        rows = conn.execute("SELECT consumer, message_key FROM processed ORDER BY 1").fetchall()
    assert rows == [("dispatcher", "recent"), ("workflow", "old-other-consumer")]
    # Counted bite by bite, just after each commits.
    wait_for(lambda: dispatcher.pruner.pruned_total == 12000, timeout=10, what="the count")


def test_pipelined_batches__record_again_while_its_forward_unacknowledged__forwarded_once__settled_in_order(
    database_url, kafka_bootstrap, topics, broker
):
    """The loop produces a batch and consumes the next before the first is
    acknowledged (_send, then _settle later). A record that comes again
    meanwhile (the relay republished it) is on its way, not yet in `processed`:
    it must not go twice, and offsets move only once both batches are recorded."""
    source, dest = topics.runs("acme"), topics.queue("acme", "billing")
    produce(kafka_bootstrap, source, [(f"r{i}".encode(), ready("acme", f"r{i}")) for i in range(3)],
            partition=0)  # fmt: skip
    msgs = [m for *_x, m in drain(kafka_bootstrap, source, want=3)]
    dispatcher = Dispatcher(database_url, kafka_bootstrap, topics)
    stop = threading.Event()
    try:
        assert dispatcher._send(msgs[:2], stop)
        assert dispatcher._send(msgs[1:], stop)  # r1 again, r2 new; r1's first forward unsettled
        assert dispatcher.offsets.done == {}  # nothing committable before the acks
        assert dispatcher._settle(stop, until=0)
        assert (dispatcher.forwarded_total, dispatcher.duplicates_total) == (3, 1)
        assert dispatcher.offsets.done == {(source, 0): msgs[2].offset() + 1}
    finally:
        dispatcher.close()
    wait_for(lambda: broker.count(dest) >= 3, timeout=30, what="forwards on the queue topic")
    assert broker.count(dest) == 3
    got = sorted(d["run_id"] for *_x, d, _m in drain(kafka_bootstrap, dest, want=3))
    assert got == ["r0", "r1", "r2"]


def test_webhook_and_managed_forwards__placed_in_their_class_partitions(
    database_url, kafka_bootstrap, topics
):
    """The webhook service and the executor admit by class; a record's class is
    its partition's (kafka.partition_for), as on run topics."""
    hook, managed = {"type": "webhook", "url": "https://x"}, {"type": "managed", "command": ["t"]}
    sent = {
        f"r-{kind}-{c}": ready("acme", f"r-{kind}-{c}", target=target, priority=c)
        for kind, target in (("hook", hook), ("managed", managed))
        for c in ("critical", "high", "normal", "low")
    }
    produce(kafka_bootstrap, topics.runs("acme"), [(k.encode(), v) for k, v in sent.items()])
    with running(Dispatcher(database_url, kafka_bootstrap, topics)):
        got = drain(kafka_bootstrap, f"^{topics.prefix}\\.(webhook|managed)\\..*", want=len(sent))
    n = len(kafka.admin(kafka_bootstrap, principal="observer").list_topics(topics.webhook("acme")).topics[
        topics.webhook("acme")].partitions)  # fmt: skip
    assert n >= 4
    classes = {key.decode(): class_of_partition(msg.partition(), n) for _t, key, _n, _d, msg in got}
    assert classes == {r: PRIORITY_RANK[r.rsplit("-", 1)[1]] for r in sent}
