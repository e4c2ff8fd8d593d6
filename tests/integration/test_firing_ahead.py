"""Firing ahead (docs/architecture.md): a job's run is created up to the lead
before its instant, and the relay holds its record until the instant.

What must hold: only job timers are claimed early (a lease, timeout or retry
acted on early would change a run early); the record is never readable before
its instant; held rows stay in the outbox until acknowledged; the wheel forgets
job timers a claim ahead already took, so it does not wake once per timer."""

from __future__ import annotations

import heapq
import threading
import time

import psycopg
import pytest

from cronwheel import kafka, metrics
from cronwheel.core.clock import iso, now_ms, to_dt, to_ms
from cronwheel.core.runs import NORMAL_RANK, PRIORITY_RANK
from cronwheel.kafka import Topics
from cronwheel.store import outbox
from cronwheel.store.firing import Firing, wake_lead
from cronwheel.store.jobs import Jobs, create_tenant
from cronwheel.store.leases import Leases
from services.relay.service import Relay
from services.timer.service import TimerService, TimingWheel
from tests.support.db import lock_waits
from tests.support.kafka import drain, run_topic_and_record
from tests.support.running import running
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
def conn(database_url):
    with psycopg.connect(database_url, autocommit=True) as c:
        yield c


def _once(conn, topics: Topics, tenant: dict, name: str, at: int, now: int) -> dict:
    body = {"name": name, "schedule": {"at": iso(at)}, "target": {"type": "queue", "queue": "q"}}
    return Jobs(topics).create(conn, tenant, body, now)


def test_claim_ahead__job_within_the_lead_fired_now__retry_timer_and_far_job_wait(
    conn, topic_prefix
):
    topics = Topics(topic_prefix)
    tenant = create_tenant(conn, "acme")
    t0 = now_ms()
    near, far = t0 + 300, t0 + 5_000
    _once(conn, topics, tenant, "near", near, t0)
    _once(conn, topics, tenant, "far", far, t0)
    # A retry timer due as soon as the near job: not a job's, so not claimed early.
    conn.execute(
        "INSERT INTO timers (partition_id, timer_id, kind, owner_id, due_at, attempt, tenant_id)"
        " VALUES (7, 'retry:run_x', 'retry', 'run_x', %s, 2, %s)",
        [to_dt(near), tenant["tenant_id"]],
    )
    leases = Leases("timer", ttl_ms=60_000)
    leases.tick(conn, t0)

    assert Firing(topics).fire_due(conn, leases, t0).runs_created == 0  # no lead: nothing due

    report = Firing(topics, ahead_ms=1_000).fire_due(conn, leases, t0)
    assert report.runs_created == 1
    runs = conn.execute("SELECT scheduled_at, created_at FROM runs_daily").fetchall()
    assert [(to_ms(s), to_ms(c)) for s, c in runs] == [(near, t0)]
    held = conn.execute("SELECT not_before FROM outbox").fetchall()
    assert [to_ms(r[0]) for r in held] == [near]
    left = conn.execute("SELECT kind, due_at FROM timers ORDER BY due_at").fetchall()
    assert [(k, to_ms(d)) for k, d in left] == [("retry", near), ("job", far)]


def test_relay__held_row__published_at_its_time_not_before__others_at_once(
    database_url, kafka_bootstrap, topic_prefix, conn
):
    topic, value = run_topic_and_record(conn, Topics(topic_prefix), kafka_bootstrap)
    # The record timestamps (the relay's produce() calls) carry the proof, so a
    # slow consumer join on a cold broker cannot fail the test.
    not_before = now_ms() + 5_000
    with conn.transaction():
        outbox.append(
            conn,
            [
                outbox.RankedRow(3, topic, b"held", value, not_before_ms=not_before),
                outbox.RankedRow(3, topic, b"now", value),
            ],
        )
    relay = Relay(database_url, kafka_bootstrap)
    with running(relay):
        records = drain(kafka_bootstrap, topic, want=2, timeout=30)
        wait_for(
            lambda: conn.execute("SELECT count(*) FROM outbox").fetchone()[0] == 0,
            what="outbox drained",
        )
    stamps = {key: msg.timestamp()[1] for _t, key, _n, _d, msg in records}
    assert set(stamps) == {b"held", b"now"}
    assert stamps[b"now"] < not_before <= stamps[b"held"]


def test_relay__host_clock_ahead__held_row_published_at_the_databases_time(
    database_url, kafka_bootstrap, topic_prefix, conn
):
    """A row's not_before is the database's time: a relay whose host clock
    runs 3 s ahead holds it by the database's clock (its leases' DbClock), not
    its own, which would publish it 3 s early (issue 26, a skewed relay)."""
    topic, value = run_topic_and_record(conn, Topics(topic_prefix), kafka_bootstrap)
    not_before = _db_ms(conn) + 5_000
    with conn.transaction():
        outbox.append(conn, [outbox.RankedRow(3, topic, b"held", value, not_before_ms=not_before)])
    relay = Relay(database_url, kafka_bootstrap)
    relay.leases.clock.local = lambda: now_ms() + 3_000
    with running(relay):
        records = drain(kafka_bootstrap, topic, want=1, timeout=30)
    # The record's timestamp is librdkafka's, read from this host's true clock
    # (the database's: same host).
    assert [key for _t, key, _n, _d, _m in records] == [b"held"]
    assert records[0][4].timestamp()[1] >= not_before


def test_relay__held_row_due_while_the_loop_waits_on_the_database__produced_at_its_time(
    database_url, kafka_bootstrap, topic_prefix, conn
):
    """Held rows are released by a thread of their own: a row whose time
    comes while the relay's loop waits on the database (here: on a lock on
    the outbox, held until the record was read) is produced at its time, not
    when the loop gets its answer."""
    topic, value = run_topic_and_record(conn, Topics(topic_prefix), kafka_bootstrap)
    # Read (held) up to 5 s before its time: the relay's start, the lock and
    # the loop's coming to it all fit before the row's time (read 1 s before
    # it, as by default, they once did not in CI).
    not_before = _db_ms(conn) + 6_000
    with conn.transaction():
        outbox.append(conn, [outbox.RankedRow(3, topic, b"held", value, not_before_ms=not_before)])
    relay = Relay(database_url, kafka_bootstrap, hold_ms=5_000)
    with running(relay), psycopg.connect(database_url) as locker:
        wait_for(lambda: relay._held_ids, 30, what="the row read and held")
        locker.execute("LOCK TABLE outbox IN ACCESS EXCLUSIVE MODE")
        # The loop reads again within its idle wait and waits on the lock:
        # the fault has landed before the row's time.
        wait_for(lambda: _waiting_on_a_lock(conn), 30, what="the relay's loop waiting on the lock")
        assert _db_ms(conn) < not_before
        records = drain(kafka_bootstrap, topic, want=1, timeout=30)
        assert _waiting_on_a_lock(conn), "the loop was still waiting when the record was read"
        unlocked_at = _db_ms(conn)
        locker.rollback()
    assert [key for _t, key, _n, _d, _m in records] == [b"held"]
    assert not_before <= records[0][4].timestamp()[1] < unlocked_at


def test_relay__the_releasing_thread_fails__the_relay_ends_with_its_error(
    database_url, kafka_bootstrap, topic_prefix, conn
):
    """An error in the releasing thread ends the relay's run with that error
    (its supervisor restarts it and logs why), not a relay that holds rows
    and never publishes them. The row comes due while the loop waits on a
    locked outbox, so only the releaser can be the one that failed."""
    topic, value = run_topic_and_record(conn, Topics(topic_prefix), kafka_bootstrap)
    not_before = _db_ms(conn) + 3_000
    with conn.transaction():
        outbox.append(conn, [outbox.RankedRow(3, topic, b"held", value, not_before_ms=not_before)])
    relay = Relay(database_url, kafka_bootstrap)
    failed_on: list[str] = []

    def refuse(rows):
        failed_on.append(threading.current_thread().name)
        raise RuntimeError(f"cannot produce row {rows[0][0]}")

    relay._produce = refuse
    with pytest.raises(RuntimeError, match="cannot produce row"), running(relay):
        wait_for(lambda: relay._held_ids, 30, what="the row read and held")
        with psycopg.connect(database_url) as locker:
            locker.execute("LOCK TABLE outbox IN ACCESS EXCLUSIVE MODE")
            wait_for(lambda: _waiting_on_a_lock(conn), 30, what="the loop waiting on the lock")
            wait_for(lambda: failed_on, 30, what="the row's release to fail")
            locker.rollback()
        wait_for(lambda: relay._releaser is None, 30, what="the relay's run to end")
    assert failed_on == ["relay-release"]
    assert conn.execute("SELECT count(*) FROM outbox").fetchone()[0] == 1  # kept for the next


def test_relay__leases_not_renewed_lately__releaser_holds_its_rows_until_they_are(
    database_url, kafka_bootstrap
):
    """A relay whose leases were not renewed within the releaser's share of
    their TTL (cut off from the database) publishes none of its held rows:
    another relay may own their partitions by now. Renewed, it goes on."""
    relay = Relay(database_url, kafka_bootstrap)
    relay.leases.owned = {1: 1}
    relay._held.append((relay.clock() - 1, 2, 0, 10, 1, {}))
    relay._held_ids.add(10)
    produced: list[int] = []
    looks: list[int] = []
    until_held = relay._until_held
    relay._produce = lambda rows: produced.extend(row_id for row_id, _record in rows)

    def watch_until_held():
        looks.append(1)
        return until_held()

    relay._until_held = watch_until_held
    relay._start_releasing()
    try:
        wait_for(lambda: len(looks) >= 3, 30, what="the releaser to look three times")
        assert produced == []
        relay._release_until = time.monotonic() + 60  # as a tick sets it
        wait_for(lambda: produced, 30, what="the row released")
        assert produced == [10]
    finally:
        relay._stop_releasing()
        relay.close()


def _waiting_on_a_lock(conn: psycopg.Connection) -> bool:
    """A session of this database other than the test's waits for a lock on a
    statement that reads or deletes outbox rows (the relay's loop)."""
    return any("outbox" in q.lower() for q in lock_waits(conn))


def _db_ms(conn: psycopg.Connection) -> int:
    return to_ms(conn.execute("SELECT clock_timestamp()").fetchone()[0])


def test_timer_and_relay_ahead__run_created_before_its_instant__record_not_before_it(
    database_url, kafka_bootstrap, topic_prefix, conn
):
    topics = Topics(topic_prefix)
    tenant = create_tenant(conn, "acme")
    instant = now_ms() + 5_000  # room for a cold start before the lead
    _once(conn, topics, tenant, "once", instant, now_ms())
    timer = TimerService(database_url, topics, lease_ttl_ms=10_000, ahead_ms=1_000)
    relay = Relay(database_url, kafka_bootstrap)
    with running(relay), running(timer):
        records = drain(kafka_bootstrap, topics.runs(tenant["tenant_id"]), want=1, timeout=30)
    assert len(records) == 1
    stamp = records[0][4].timestamp()[1]
    created, scheduled = conn.execute("SELECT created_at, scheduled_at FROM runs_daily").fetchone()
    assert to_ms(scheduled) == instant
    assert to_ms(created) < instant  # fired ahead
    assert stamp >= instant  # but published at its instant


def test_wheel__claim_ahead_took_a_job_timer__forgotten__other_kinds_kept():
    lead = wake_lead(1_000)
    wheel = TimingWheel(lead)
    wheel.add_job(10_000)
    wheel.add_job(10_400)
    wheel.add(9_600)  # a lease timer, say
    assert wheel.next_wake() == 10_000 - lead
    # A pass at 9_250 claimed job timers due by 10_250: the first job is done.
    wheel.drop_through(9_250, 10_250)
    assert wheel.next_wake() == 9_600
    wheel.drop_through(9_600, 10_600)  # the lease timer's pass also took the second job
    assert wheel.next_wake() is None


def test_relay__lease_moved_away__held_rows_of_that_partition_dropped(
    database_url, kafka_bootstrap
):
    relay = Relay(database_url, kafka_bootstrap)
    relay.leases.owned = {1: 1, 2: 1}
    later = now_ms() + 60_000
    for row_id, partition in ((10, 1), (11, 2), (12, 2)):
        relay._held.append((later, 2, row_id, row_id, partition, {}))
        relay._held_ids.add(row_id)
    relay.leases.owned = {1: 1}
    relay._forget_unowned()
    assert relay._held_ids == {10} and [item[3] for item in relay._held] == [10]


def _produced_and_acked(relay: Relay) -> tuple[list[tuple[int, int]], list[int]]:
    """Watch a relay: (row, rows acknowledged by then) at each produce(), and
    the order of acknowledgements."""
    produced: list[tuple[int, int]] = []
    acked: list[int] = []
    produce, delivered = relay._produce, relay._delivered

    def watch_produce(rows):
        produced.extend((row_id, len(acked)) for row_id, _record in rows)
        produce(rows)

    def watch_delivered(row_id, err, msg):
        acked.append(row_id)
        delivered(row_id, err, msg)

    relay._produce, relay._delivered = watch_produce, watch_delivered
    return produced, acked


@pytest.mark.parametrize("with_critical", [True, False])
def test_relay__critical_and_normal_due_together__critical_acknowledged_before_normal_produced(
    database_url, kafka_bootstrap, topic_prefix, conn, with_critical
):
    """At a storm's instant the critical records go to the broker on their own:
    in one produce request with the herd's they wait for all of it to be
    appended. Normal rows alone pay no such wait."""
    topic, value = run_topic_and_record(conn, Topics(topic_prefix), kafka_bootstrap)
    ranks = ([0] * 3 if with_critical else []) + [2] * 3
    with conn.transaction():
        outbox.append(
            conn,
            [
                outbox.RankedRow(3, topic, f"k{i}".encode(), value, priority=r)
                for i, r in enumerate(ranks)
            ],
        )
    ids = [
        r[0] for r in conn.execute("SELECT id FROM outbox WHERE topic = %s ORDER BY id", [topic])
    ]
    critical = set(ids[: ranks.count(0)])
    relay = Relay(database_url, kafka_bootstrap)
    produced, acked = _produced_and_acked(relay)
    barriers = metrics.CLASS_BARRIERS._value.get()
    try:
        relay.leases.tick(conn)
        # Connected (SASL handshake, the topic's metadata) before the pass: the
        # barrier waits at most a second for the critical acks, and a first
        # connection on a loaded machine must not be what it measures.
        assert relay.producer.list_topics(topic, timeout=30).topics[topic].partitions
        assert relay.relay_once(conn) == len(ids)
        relay.producer.flush(30)
    finally:
        relay.close()
    assert sorted(acked) == ids
    first_normal = next(i for i, (row, _n) in enumerate(produced) if row not in critical)
    assert all(row in critical for row, _n in produced[:first_normal])
    if with_critical:
        assert produced[first_normal][1] == len(critical)  # every critical row acknowledged
        assert set(acked[: len(critical)]) == critical
        assert metrics.CLASS_BARRIERS._value.get() == barriers + 1
    else:
        assert metrics.CLASS_BARRIERS._value.get() == barriers


def test_relay__rows_of_two_classes_and_topics_due_together__a_batch_per_class__grouped_by_topic(
    database_url, kafka_bootstrap, topic_prefix, conn
):
    """Rows due at one instant, interleaved over two tenants' topics and two
    classes: every normal record is given to the producer before any low
    one (a batch per class), and within a class a topic's records are given
    together, in the heap's order (so a partition's records of a herd leave
    in about one request). All are acknowledged."""
    topics = Topics(topic_prefix)
    a, value = run_topic_and_record(conn, topics, kafka_bootstrap)
    b = topics.runs("another")  # the relay writes a topic, whoever's it is
    kafka.ensure_topics([b], bootstrap=kafka_bootstrap, principal="dispatcher")
    relay = Relay(database_url, kafka_bootstrap)
    relay._placement.prime()
    given: list[tuple[str, bytes]] = []
    produce_all = relay.producer.produce_all

    def watch(records):
        given.extend((r["topic"], r["key"]) for r in records)
        produce_all(records)

    relay.producer.produce_all = watch  # the real producer still gives them
    now = relay.clock()
    low = PRIORITY_RANK["low"]
    for i in range(8):
        rank = low if (i // 2) % 2 else NORMAL_RANK
        row = (100 + i, (a, b)[i % 2], b"k%d" % i, value, None, rank, None, 0)
        heapq.heappush(relay._held, (now - 1, rank, i, row[0], 0, relay._record(row)))
        relay._held_ids.add(row[0])
    try:
        with relay._lock:
            assert relay._release_due_locked() == 8
        assert relay.producer.flush(30) == 0
    finally:
        relay.close()
    assert given == [
        (a, b"k0"), (a, b"k4"), (b, b"k1"), (b, b"k5"),  # normal
        (a, b"k2"), (a, b"k6"), (b, b"k3"), (b, b"k7"),  # low
    ]  # fmt: skip
    assert sorted(relay._acked) == list(range(100, 108)) and not relay._refused
