"""The outbox's commit order (issue 26): a transaction that takes a lower
outbox id and commits last is still published, once.

Outbox ids come from a sequence, handed out when a row is inserted, not when
its transaction commits. A relay that read with a cursor ("everything after
the highest id I published") would skip a row whose transaction took its id
first and committed after later ones had been published. cronwheel's relay
keeps no cursor (cronwheel/store/sql/outbox.sql: each pass reads whatever is
in its partitions now, less what it holds or has in flight), and this fault
makes that order happen under the running load and proves it did:

  * a manual trigger of a job of its own (hourly: it fires nothing during
    the load) runs through the platform's
    own store code (cronwheel.store.jobs.Jobs.trigger), inside a transaction
    the harness keeps open: its run and its RunReady outbox row are written,
    the outbox id is taken (`currval` of the sequence in that session), and
    nothing is committed;
  * meanwhile the timer keeps firing: runs whose transactions began after
    the held row took its id (so their RunReady rows took higher ids) are
    committed, published by the relay and started by the worker, at least
    LATER_PUBLISHED of them, while the held row is still uncommitted;
  * only then is the held transaction committed. Its row must be published
    (deleted from the outbox after the broker's acknowledgement), its run's
    RunReady must be on the run topic exactly once, and the checker finds
    the run SUCCEEDED with its effect once (it is an answered trigger).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import psycopg

from cronwheel.core.clock import to_ms
from cronwheel.kafka import Topics
from cronwheel.store.jobs import Jobs
from tests.support.wait import wait_for

if TYPE_CHECKING:
    from tests.faults.harness import Load, Platform, PrivateStack, Report
    from tests.faults.scenarios import Plan

# Later rows the relay must have published past the open one before it commits.
LATER_PUBLISHED = 5
HOUR_MS = 3_600_000


def _started_past(conn: psycopg.Connection, held_at) -> int:
    """Runs written after the held row took its id, already started by the
    worker: their RunReady rows took higher ids (a run's `created_at` is its
    writer's reading of the database's clock, taken before its outbox insert;
    the margin covers that clock's error, under 250 ms), and were committed,
    published and read while the held one was open."""
    return conn.execute(
        "SELECT count(*) FROM runs_daily WHERE created_at > %s + interval '500 ms'"
        " AND started_at IS NOT NULL",
        [held_at],
    ).fetchone()[0]


def _held_trigger(platform: Platform, job_id: str) -> tuple[psycopg.Connection, str, int, object]:
    """A trigger of `job_id` written and left uncommitted: (its open
    connection, the run id, the outbox id its RunReady row took, the
    database's clock right after it took it)."""
    conn = psycopg.connect(platform.database_url)  # not autocommit: one open transaction
    try:
        # The timer's own bound (10 s idle in transaction) would end this session.
        conn.execute("SET idle_in_transaction_session_timeout = 0")
        tenant_id, now = conn.execute(
            "SELECT tenant_id, clock_timestamp() FROM jobs WHERE job_id = %s", [job_id]
        ).fetchone()
        jobs = Jobs(Topics(platform.topic_prefix))
        # Inside the open transaction, Jobs.trigger's own transaction is a savepoint.
        answer = jobs.trigger(conn, {"tenant_id": tenant_id}, job_id, to_ms(now))
        assert answer["created"], f"the held trigger made no run: {answer}"
        # currval: the id this session's INSERT took (the trigger appends one row).
        held_id, held_at = conn.execute(
            "SELECT currval(pg_get_serial_sequence('outbox', 'id')), clock_timestamp()"
        ).fetchone()
        (mine,) = conn.execute("SELECT count(*) FROM outbox WHERE id = %s", [held_id]).fetchone()
        assert mine == 1, "the held transaction's outbox row is not the sequence's last id"
        return conn, answer["run_id"], held_id, held_at
    except BaseException:
        conn.close()
        raise


def run_ready_count(stack: PrivateStack, topic: str, run_id: str) -> int:
    """RunReady records of `run_id` on run topic `topic`, read from the start."""
    from confluent_kafka import OFFSET_BEGINNING, TopicPartition

    consumer = stack.kafka_consumer(f"faults-outbox-order-{time.monotonic_ns()}")
    try:
        parts = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                for p in parts}  # fmt: skip
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
        left = {p for p, end in ends.items() if end > 0}
        seen = 0
        deadline = time.monotonic() + 30
        while left and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None or msg.error():
                continue
            if msg.key() is not None and msg.key().decode(errors="replace") == run_id:
                seen += 1
            if msg.offset() + 1 >= ends[msg.partition()]:
                left.discard(msg.partition())
        assert not left, f"run topic {topic} not read to its end: partitions {sorted(left)}"
        return seen
    finally:
        consumer.close()


def fault(stack: PrivateStack, platform: Platform, plan: Plan, report: Report, load: Load) -> None:
    """A trigger's transaction holds a lower outbox id open for down_s while
    later ones are published past it, then commits last."""
    # A job of its own, whose schedule fires nothing during the load: the
    # trigger holds its timer row locked, which would delay a load job's
    # instants and block the load's own triggers of it.
    with platform.connect() as db:
        (n,) = db.execute("SELECT count(*) FROM jobs").fetchone()
    job_id = load._create(n, HOUR_MS)["job_id"]
    held, run_id, held_id, held_at = _held_trigger(platform, job_id)
    t0 = time.monotonic()
    try:
        with platform.connect() as watch:
            # Landed: later rows were committed and published past the open one.
            wait_for(
                lambda: _started_past(watch, held_at) >= LATER_PUBLISHED,
                plan.down_s + 30,
                0.05,
                "runs fired after the held row to be published and started",
            )
            time.sleep(max(0.0, plan.down_s - (time.monotonic() - t0)))  # held this long
            passed = _started_past(watch, held_at)
            (newest,) = watch.execute("SELECT last_value FROM outbox_id_seq").fetchone()
            held.commit()  # the lower id commits last
            held_s = time.monotonic() - t0
            load.triggered.add(run_id)  # an answered trigger: the checker wants its one run
            t1 = time.monotonic()
            wait_for(
                lambda: (
                    not watch.execute("SELECT 1 FROM outbox WHERE id = %s", [held_id]).fetchone()
                ),
                60,
                0.02,
                "the late-committed row to be published",
            )
            published_s = time.monotonic() - t1
            (tenant_id,) = watch.execute(
                "SELECT tenant_id FROM jobs WHERE job_id = %s", [job_id]
            ).fetchone()
    finally:
        held.close()
    copies = run_ready_count(stack, Topics(platform.topic_prefix).runs(tenant_id), run_id)
    assert copies == 1, f"the late-committed run's RunReady is on its topic {copies} times"
    report.notes.append(
        f"outbox id {held_id} held open {held_s:.1f} s while ids up to {newest} were taken"
        f" and {passed} later runs published and started; committed last, published"
        f" {published_s:.2f} s later, once on the run topic"
    )
