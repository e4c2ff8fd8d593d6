"""Dozing (cronwheel.dozing) against the real broker: a quiet run-topic
partition leaves the dispatcher's fetches, a wake brings it back before its
record is read, and a record no wake announced is still forwarded (the sweep)."""

from __future__ import annotations

import logging
import time
import uuid
from collections import Counter

import psycopg
import pytest
from confluent_kafka import OFFSET_END, TopicPartition

from cronwheel import kafka
from cronwheel.consumer import produce as produce_waiting
from cronwheel.core.clock import to_ms
from cronwheel.dozing import Dozing, Waker, wake_topic_of
from cronwheel.kafka import Topics
from cronwheel.store import outbox
from services.dispatcher.service import Dispatcher
from services.relay.service import Relay
from tests.integration.test_dispatcher import produce, ready
from tests.support.kafka import drain, read_all
from tests.support.running import running
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
def topics(topic_prefix) -> Topics:
    return Topics(topic_prefix)


def _tenant(database_url: str) -> str:
    tenant = f"t{uuid.uuid4().hex[:8]}"
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("INSERT INTO tenants (tenant_id, name) VALUES (%s, %s)", [tenant, tenant])
    return tenant


def _dozing_dispatcher(
    database_url, kafka_bootstrap, topics, *, sweep_ms: int, **kwargs
) -> Dispatcher:
    return Dispatcher(
        database_url, kafka_bootstrap, topics, topic_scan_s=3600,
        doze_after_ms=1_000, doze_sweep_ms=sweep_ms, **kwargs,
    )  # fmt: skip


def _in_consumer(d: Dispatcher) -> set[tuple[str, int]]:
    """The partitions in the dispatcher's consumer's assignment (librdkafka's,
    not the leases')."""
    return {(tp.topic, tp.partition) for tp in d._consumer.assignment()}


def _forward_then_doze(d: Dispatcher, kafka_bootstrap, topics, tenant: str) -> None:
    """The tenant's partition has read a record, then dozes."""
    run_topic = topics.runs(tenant)
    wait_for(lambda: (run_topic, 0) in d.assignment.assigned, timeout=30, what="assigned")
    produce(kafka_bootstrap, run_topic, [(b"r-0", ready(tenant, "r-0"))])
    drain(kafka_bootstrap, topics.queue(tenant, "billing"), want=1, timeout=30)
    wait_for(lambda: (run_topic, 0) in d.dozing.dozing, timeout=30, what="the partition dozes")


def _expect_both_forwarded(d: Dispatcher, kafka_bootstrap, topics, tenant: str) -> None:
    got = drain(kafka_bootstrap, topics.queue(tenant, "billing"), want=2, timeout=30)
    forwarded = sorted(datum["run_id"] for _t, _k, _n, datum, _m in got)
    assert forwarded == ["r-0", "r-1"], f"forwarded {forwarded}; {_state(d, topics.runs(tenant))}"


def _state(d: Dispatcher, run_topic: str) -> str:
    """What the dispatcher believed of the run topic's partition, for a failure's
    message (read from the test's thread: sets and counters, and librdkafka's
    thread-safe assignment and position)."""
    key = (run_topic, 0)
    wake = TopicPartition(d.topics.wake, 0)
    return (
        f"dozing={key in d.dozing.dozing} unread={key in d.dozing.unread}"
        f" leased={key in d.assignment.assigned} in_consumer={key in _in_consumer(d)}"
        f" resumes_at={d._dozed_at.get(key)}"
        f" wake_position={d._consumer.position([wake]) if d._consumer else None}"
        f" forwarded_total={d.forwarded_total} missed_total={d.dozing.missed_total}"
    )


def test_dozing_partition__woken_like_the_relay_does__record_forwarded_no_sweep_needed(
    database_url, kafka_bootstrap, topics
):
    tenant = _tenant(database_url)
    run_topic = topics.runs(tenant)
    # The sweep far off: only the wake can bring the partition back in time.
    with running(_dozing_dispatcher(database_url, kafka_bootstrap, topics, sweep_ms=600_000)) as d:
        _forward_then_doze(d, kafka_bootstrap, topics, tenant)
        producer = kafka.producer(kafka_bootstrap, principal="relay")
        waker = Waker(producer, every_ms=3_000, produce=produce_waiting)
        waker.read(run_topic)  # the relay reads a row for the topic
        assert producer.flush(30) == 0
        produce(kafka_bootstrap, run_topic, [(b"r-1", ready(tenant, "r-1"))])
        _expect_both_forwarded(d, kafka_bootstrap, topics, tenant)
        assert waker.sent_total == 1 and d.dozing.missed_total == 0
        # Assigned again where it was consumed to: r-0 was not read twice.
        assert d.duplicates_total == 0 and d.forwarded_total == 2


def test_dozing_partition__woken_for_a_row_due_later__resumed_just_before_it_not_at_once(
    database_url, kafka_bootstrap, topics
):
    """A wake saying its row comes in 3 s (a run fired ahead) leaves the
    partition paused until `resume_ahead_ms` before then: a record already on
    the broker (a relay whose clock ran ahead) is read only then, without the
    sweep."""
    tenant = _tenant(database_url)
    run_topic = topics.runs(tenant)
    dispatcher = _dozing_dispatcher(
        database_url, kafka_bootstrap, topics, sweep_ms=600_000, resume_ahead_ms=500
    )
    with running(dispatcher) as d:
        _forward_then_doze(d, kafka_bootstrap, topics, tenant)
        produce(kafka_bootstrap, run_topic, [(b"r-1", ready(tenant, "r-1"))])
        producer = kafka.producer(kafka_bootstrap, principal="relay")
        waker = Waker(producer, every_ms=3_000, produce=produce_waiting)
        woken_at = time.monotonic()
        waker.read(run_topic, in_ms=3_000)
        assert producer.flush(30) == 0
        wait_for(lambda: d.dozing.next_due_s() is not None, timeout=10, what="the wake read")
        assert (run_topic, 0) in d.dozing.dozing and d.forwarded_total == 1, _state(d, run_topic)
        wait_for(lambda: d.forwarded_total == 2, timeout=30, what="r-1 forwarded")
        held = time.monotonic() - woken_at
        assert held >= 2.5, f"resumed {held:.2f} s after the wake, not 2.5 s"
        _expect_both_forwarded(d, kafka_bootstrap, topics, tenant)
        assert d.dozing.missed_total == 0 and d.duplicates_total == 0


def test_dozing_partition__paused_in_the_assignment__not_fetched__resumed_when_woken(
    database_url, kafka_bootstrap, topics
):
    """A dozing partition is paused, not unassigned (cronwheel.dozing: assigning
    it again would wake librdkafka's fetcher once per partition), its lease
    still this instance's; a record no wake announced is not fetched through
    two fetches of the wake topic that came after it, and is once woken."""
    tenant = _tenant(database_url)
    run_topic = topics.runs(tenant)
    with running(_dozing_dispatcher(database_url, kafka_bootstrap, topics, sweep_ms=600_000)) as d:
        _forward_then_doze(d, kafka_bootstrap, topics, tenant)
        assert (run_topic, 0) in _in_consumer(d) and (run_topic, 0) in d.assignment.assigned
        produce(kafka_bootstrap, run_topic, [(b"r-1", ready(tenant, "r-1"))])
        producer = kafka.producer(kafka_bootstrap, principal="dispatcher")
        asker = kafka.asker(
            kafka_bootstrap, principal="dispatcher", group=f"{topics.prefix}.dispatcher.ask"
        )
        wake = TopicPartition(topics.wake, 0)
        for _ in range(2):
            # A nudge ends the wake topic's outstanding fetch; the dispatcher
            # reads it only through a fetch that named every fetchable
            # partition after r-1 was on the broker.
            produce_waiting(producer, topic=topics.wake, key=b"", value=b"")
            assert producer.flush(30) == 0
            end = kafka.end_offsets(asker, [(topics.wake, 0)])[(topics.wake, 0)]
            wait_for(
                lambda end=end: d._consumer.position([wake])[0].offset >= end,
                timeout=30, what="the nudge read",
            )  # fmt: skip
        assert d.forwarded_total == 1, f"a dozing partition was fetched: {_state(d, run_topic)}"
        Waker(producer, every_ms=3_000, produce=produce_waiting).read(run_topic)
        assert producer.flush(30) == 0
        _expect_both_forwarded(d, kafka_bootstrap, topics, tenant)
        assert d.dozing.missed_total == 0 and d.duplicates_total == 0


def test_dozing_partition__woken_and_nothing_comes__the_broker_asked_and_it_dozes_again(
    database_url, kafka_bootstrap, topics
):
    """A wake with nothing after it (as for a run due at once whose record was
    read before its wake): once the wake's hold is over the dispatcher asks the
    broker for the partition's end offset through its offsets client, finds
    nothing to read, and the partition dozes again. (Until 1ad7fb3 it never
    asked, and such a partition stayed in every fetch until its next
    record.)"""
    tenant = _tenant(database_url)
    run_topic = topics.runs(tenant)
    with running(_dozing_dispatcher(database_url, kafka_bootstrap, topics, sweep_ms=600_000)) as d:
        d.dozing.unread_holds_s = 3.0  # not 10 s: the broker's answer is what is tested
        asked: list[list] = []
        ask = d.dozing._ends_past
        d.dozing._ends_past = lambda ends, keys, position: (
            asked.append(keys) or ask(ends, keys, position)
        )
        _forward_then_doze(d, kafka_bootstrap, topics, tenant)
        producer = kafka.producer(kafka_bootstrap, principal="relay")
        Waker(producer, every_ms=3_000, produce=produce_waiting).read(run_topic)
        assert producer.flush(30) == 0
        wait_for(lambda: (run_topic, 0) in _in_consumer(d), timeout=30, what="assigned again")
        wait_for(lambda: (run_topic, 0) in d.dozing.dozing, timeout=30, what="it dozes again")
        assert [(run_topic, 0)] in asked, _state(d, run_topic)
        assert d.forwarded_total == 1 and d.dozing.missed_total == 0


def test_relay_publishes_a_row_late__it_wakes_the_topic_again__forwarded_without_the_sweep(
    database_url, kafka_bootstrap, topics
):
    """The relay reads a row ahead of its instant (its wake sent then) but
    publishes it only after the dispatcher has let the partition doze again:
    here its releasing is held back (the lock its releaser and loop share,
    held by the test, as a lease renewal or a class barrier's flush would
    hold it). Publishing it that late, the relay wakes the topic again
    first, so the record is forwarded without waiting for the sweep (600 s
    here; before, it waited for it)."""
    tenant = _tenant(database_url)
    run_topic = topics.runs(tenant)
    with running(_dozing_dispatcher(database_url, kafka_bootstrap, topics, sweep_ms=600_000)) as d:
        d.dozing.unread_holds_s = 3.0  # the broker asked after 3 s, not 10
        _forward_then_doze(d, kafka_bootstrap, topics, tenant)
        with psycopg.connect(database_url, autocommit=True) as conn:
            now = to_ms(conn.execute("SELECT clock_timestamp()").fetchone()[0])
            row = outbox.OutboxRow(
                0, run_topic, b"r-1", ready(tenant, "r-1"), not_before_ms=now + 3_000
            )
            outbox.append(conn, [row])
        relay = Relay(database_url, kafka_bootstrap)
        with running(relay):
            wait_for(lambda: relay._held_ids, 30, what="the row read and held")
            with relay._lock:  # the releaser is held back from here
                # Dozing is paused, never out of the consumer: woken shows as out
                # of `dozing` (a second at least, doze_after_ms); only after it is
                # "in `dozing`" the second doze, not the first with the wake on its way.
                wait_for(
                    lambda: (run_topic, 0) not in d.dozing.dozing, 30, what="woken by the read"
                )
                wait_for(lambda: (run_topic, 0) in d.dozing.dozing, 30, what="dozing again")
                assert relay._held_ids, "the row was published before the partition dozed"
            wait_for(lambda: d.forwarded_total == 2, 30, what="the late record forwarded")
        assert relay.waker.late_total == 1 and relay.waker.sent_total == 2
        assert d.dozing.missed_total == 0


def _deleted_unread(database_url, kafka_bootstrap, topics, *, records: int) -> tuple[str, str]:
    """A new tenant whose run topic got `records` records, all deleted before
    any was read, as retention would (the admin's delete-records): its log
    starts where it ends, at `records`. The tenant and its run topic."""
    tenant = _tenant(database_url)
    run_topic = topics.runs(tenant)
    kafka.ensure_topics([run_topic], partitions=kafka.RUN_PARTITIONS, principal="dispatcher")
    produce(
        kafka_bootstrap,
        run_topic,
        [(f"gone-{i}".encode(), ready(tenant, f"gone-{i}")) for i in range(records)],
    )
    admin = kafka.admin(kafka_bootstrap, principal="admin")
    for future in admin.delete_records([TopicPartition(run_topic, 0, records)]).values():
        assert future.result(timeout=30).low_watermark == records
    return tenant, run_topic


def test_records_deleted_unread__dozes_at_its_logs_start__the_sweep_wakes_it_for_a_new_one_only(
    database_url, kafka_bootstrap, topics
):
    """Nothing committed and every record deleted before it was read (a
    dispatcher away longer than the topic's retention; here the admin's
    delete-records): assigned at 0, reset to the log's start (2), it dozes
    there. Kept as 0, each sweep found the end past it and woke it, a missed
    wake counted every time. A record that comes without a wake is still
    found by the sweep and forwarded once."""
    tenant, run_topic = _deleted_unread(database_url, kafka_bootstrap, topics, records=2)
    with running(_dozing_dispatcher(database_url, kafka_bootstrap, topics, sweep_ms=1_000)) as d:
        wait_for(lambda: (run_topic, 0) in d.dozing.dozing, timeout=30, what="the partition dozes")
        assert d._dozed_at[(run_topic, 0)] == 2, _state(d, run_topic)
        produce(kafka_bootstrap, run_topic, [(b"r-2", ready(tenant, "r-2"))])  # no wake
        got = drain(kafka_bootstrap, topics.queue(tenant, "billing"), want=1, timeout=30)
        assert [datum["run_id"] for _t, _k, _n, datum, _m in got] == ["r-2"]
        assert d.dozing.missed_total == 1 and d.forwarded_total == 1, _state(d, run_topic)


def _committed_behind_the_logs_start(database_url, kafka_bootstrap, topics) -> str:
    """A tenant whose group committed offset 2 of its run topic, whose five
    records were then deleted unread: the log starts at 5, past the commit.
    Its run topic."""
    _tenant_id, run_topic = _deleted_unread(database_url, kafka_bootstrap, topics, records=5)
    committer = kafka.consumer(
        f"{topics.prefix}.dispatcher", kafka_bootstrap, principal="dispatcher"
    )
    try:
        committer.commit(offsets=[TopicPartition(run_topic, 0, 2)], asynchronous=False)
    finally:
        committer.close()
    return run_topic


def test_committed_behind_the_logs_start__nothing_left__dozes_at_the_start(
    database_url, kafka_bootstrap, topics
):
    """Assigned at its commit (2), reset by librdkafka to the log's start (5),
    nothing to read: the partition is caught up there and dozes. Kept at 2,
    it never looked caught up, never dozed, and the fetch watch (1 s here)
    replaced the clients as stuck behind records that are not there."""
    run_topic = _committed_behind_the_logs_start(database_url, kafka_bootstrap, topics)
    d = _dozing_dispatcher(database_url, kafka_bootstrap, topics, sweep_ms=1_000, fetch_watch_s=1)
    with running(d):
        wait_for(lambda: (run_topic, 0) in d.dozing.dozing, timeout=30, what="the partition dozes")
        assert d._dozed_at[(run_topic, 0)] == 5, _state(d, run_topic)
        assert d.fetch_watch.stuck_total == 0


def test_committed_behind_the_logs_start__no_dozing__the_fetch_watch_finds_nothing_stuck(
    database_url, kafka_bootstrap, topics
):
    """Without dozing the partition stays fetched, and the fetch watch judges
    it: at the log's start (5), where the broker's end is, it is not stuck.
    At its commit (2) it was, at every second look."""
    run_topic = _committed_behind_the_logs_start(database_url, kafka_bootstrap, topics)
    d = Dispatcher(
        database_url, kafka_bootstrap, topics, topic_scan_s=3600, doze_after_ms=0, fetch_watch_s=1
    )
    with running(d):
        wait_for(
            lambda: d._next.get((run_topic, 0)) == 5,  # as the watch's looks judge it
            timeout=30,
            what="the position at the log's start",
        )
        looked = d.fetch_watch.looks
        wait_for(lambda: d.fetch_watch.looks >= looked + 3, timeout=30, what="three more looks")
        assert d.fetch_watch.stuck_total == 0


def test_leases_move_while_partitions_doze__handed_over__every_run_forwarded_once(
    database_url, kafka_bootstrap, topics
):
    """An instance gives up leases whose partitions doze (paused), and takes
    them back when the other stops: neither hand-over loses or doubles a run,
    and a partition given up paused is fetched when it comes back (librdkafka
    keeps a pause across unassign and assign; cronwheel.assignment resumes)."""
    tenants = [_tenant(database_url) for _ in range(12)]
    kafka.ensure_topics(
        [topics.runs(t) for t in tenants], partitions=kafka.RUN_PARTITIONS, principal="dispatcher"
    )
    sent: list[str] = []

    def wave(n: int) -> None:
        for t in tenants:
            sent.append(f"{t}-w{n}")
            produce(kafka_bootstrap, topics.runs(t), [(sent[-1].encode(), ready(t, sent[-1]))])

    a = _dozing_dispatcher(
        database_url, kafka_bootstrap, topics, sweep_ms=1_000, lease_ttl_ms=3_000
    )
    b = _dozing_dispatcher(
        database_url, kafka_bootstrap, topics, sweep_ms=1_000, lease_ttl_ms=3_000
    )
    with running(a):
        wave(1)
        wait_for(lambda: a.forwarded_total >= len(sent), timeout=60, what="wave 1 forwarded")
        everyone = {(topics.runs(t), 0) for t in tenants}
        wait_for(lambda: everyone <= a.dozing.dozing, timeout=30, what="every partition dozes")
        assert everyone <= _in_consumer(a)
        with running(b):
            wait_for(
                lambda: a.assignment.owned and b.assignment.owned
                and len(a.assignment.owned | b.assignment.owned) == 1024
                and not a.assignment.assigned & b.assignment.assigned
                and a.assignment.assigned | b.assignment.assigned == everyone,
                timeout=30, what="tenants split between the instances",
            )  # fmt: skip
            assert b.assignment.assigned, "no tenant moved: the hand-over was not exercised"
            wave(2)  # no wake: a's dozing partitions come back by the sweep
            wait_for(
                lambda: a.forwarded_total + b.forwarded_total >= len(sent),
                timeout=60, what="wave 2 forwarded",
            )  # fmt: skip
            moved = {(topics.runs(t), 0) for t in tenants} & b.assignment.assigned
        wait_for(lambda: a.assignment.assigned == everyone, timeout=30, what="all back to a")
        # Woken as the relay would before their rows, so each is read awake:
        # one that came back still paused would wait for the sweep instead.
        producer = kafka.producer(kafka_bootstrap, principal="relay")
        waker = Waker(producer, every_ms=60_000, produce=produce_waiting)
        for t in tenants:
            waker.read(topics.runs(t))
        assert producer.flush(30) == 0
        wait_for(lambda: not everyone & a.dozing.dozing, timeout=30, what="every partition woken")
        before, missed = a.forwarded_total, a.dozing.missed_total
        wave(3)  # on the partitions b had too, which a gave up paused
        wait_for(
            lambda: a.forwarded_total - before >= len(tenants),
            timeout=60, what=f"wave 3 forwarded by a ({len(moved)} partitions came back)",
        )  # fmt: skip
        assert a.dozing.missed_total == missed, "a partition that came back was left to the sweep"
    seen = Counter(
        m.key().decode()
        for m in read_all(kafka_bootstrap, [topics.queue(t, "billing") for t in tenants])
    )
    assert set(seen) == set(sent), f"missing: {sorted(set(sent) - set(seen))[:5]}"
    assert all(n == 1 for n in seen.values()), {r: n for r, n in seen.items() if n > 1}


def test_dozing_partition__record_without_a_wake__found_by_the_sweep(
    database_url, kafka_bootstrap, topics
):
    tenant = _tenant(database_url)
    run_topic = topics.runs(tenant)
    with running(_dozing_dispatcher(database_url, kafka_bootstrap, topics, sweep_ms=1_000)) as d:
        _forward_then_doze(d, kafka_bootstrap, topics, tenant)
        assert (run_topic, 0) in d.dozing.dozing  # the record below lands on a dozing partition
        produce(kafka_bootstrap, run_topic, [(b"r-1", ready(tenant, "r-1"))])
        _expect_both_forwarded(d, kafka_bootstrap, topics, tenant)
        assert d.dozing.missed_total >= 1


def test_start__the_wake_topic_read_from_its_end_as_it_was_at_the_start(kafka_bootstrap, topics):
    """A wake written after start() is read even if librdkafka first fetches
    the partition later (it would resolve OFFSET_END only then): the first
    record read is the one written after start, not one before it."""
    kafka.ensure_topics(
        [topics.wake], partitions=1, bootstrap=kafka_bootstrap, principal="dispatcher"
    )
    producer = kafka.producer(kafka_bootstrap, principal="relay")
    for key in (b"before-1", b"before-2"):
        producer.produce(topics.wake, key=key, value=b"")
    assert producer.flush(30) == 0
    consumer = kafka.consumer(
        f"{topics.prefix}.dispatcher", kafka_bootstrap, principal="dispatcher"
    )
    try:
        Dozing(topics.wake, after_ms=1_000, sweep_ms=600_000).start(consumer)
        # Assigned at the end as it is now, not at OFFSET_END (-1), to be resolved later.
        assert [(tp.topic, tp.offset) for tp in consumer.assignment()] == [(topics.wake, 2)]
        producer.produce(topics.wake, key=b"after", value=b"")
        assert producer.flush(30) == 0
        first = None
        deadline = time.monotonic() + 30
        while first is None and time.monotonic() < deadline:
            m = consumer.poll(0.2)
            first = m if m is not None and not m.error() else None
        assert first is not None, "nothing read from the wake topic in 30 s"
        assert (first.key(), first.offset()) == (b"after", 2)
    finally:
        consumer.close()


def test_start__the_end_unknown__read_from_where_librdkafka_finds_it_and_said(
    kafka_bootstrap, topics, caplog
):
    consumer = kafka.consumer(
        f"{topics.prefix}.dispatcher", kafka_bootstrap, principal="dispatcher"
    )
    missing = f"{topics.prefix}.nosuch.wake"  # no such topic: the broker cannot say its end
    try:
        with caplog.at_level(logging.WARNING, "cronwheel.fetch_nudge"):  # assign_from_end's
            Dozing(missing, after_ms=1_000, sweep_ms=600_000).start(consumer, timeout_s=2)
        assert [(tp.topic, tp.offset) for tp in consumer.assignment()] == [(missing, OFFSET_END)]
        assert any(f"{missing}'s end unknown" in m for m in caplog.messages)
    finally:
        consumer.close()


def test_wake_topic_of__run_topics_only():
    assert wake_topic_of("cw.runs.ten_a") == "cw.wake"
    assert wake_topic_of("t1a2.runs.ten_a") == "t1a2.wake"
    for other in ("cw.q.ten_a.q", "cw.run-completed", "cw.runs.", "runs.ten_a", "cw.runs.a.b"):
        assert wake_topic_of(other) is None
