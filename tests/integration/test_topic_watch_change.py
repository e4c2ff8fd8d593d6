"""A topic the watch's worker adds is told at once (cronwheel.topic_watch):
`on_change` is called on the worker's thread (the dispatcher nudges its
loop's wait for records there), and the loop's next poll() returns the list
even when the sources are not due to be read again (`check_every_s`). Before,
a new tenant's topic made by the worker waited for the loop's next check,
and the dispatcher assigned it ~200 ms after it was made. Against the real
database's tenants trigger (cw_tenants) and broker, as the dispatcher."""

from __future__ import annotations

import threading
import uuid

import psycopg
import pytest

from cronwheel import kafka
from cronwheel.core.clock import now_ms
from cronwheel.kafka import Topics
from cronwheel.store.jobs import Jobs, create_tenant
from cronwheel.topic_watch import TopicWatch, announce
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration

QUEUE_Q = {"type": "queue", "queue": "q"}


def test_topic_watch__worker_adds_a_tenants_topic__on_change_on_its_thread__poll_returns_it_at_once(
    database_url, kafka_bootstrap, topic_prefix
):
    topics = Topics(topic_prefix)
    tenant = f"t{uuid.uuid4().hex[:8]}"
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("INSERT INTO tenants (tenant_id, name) VALUES (%s, %s)", [tenant, tenant])
    release = threading.Event()
    made: list[str] = []
    changes: list[str] = []

    def ensure(names: list[str]) -> None:
        assert release.wait(30), "the test never let the creation finish"
        made.extend(names)

    watch = TopicWatch(
        database_url,
        kafka.admin(kafka_bootstrap, principal="dispatcher"),
        f"{topic_prefix}.runs.",
        tenant_topic=topics.runs,
        ensure=ensure,
        on_change=lambda: changes.append(threading.current_thread().name),
        check_every_s=3600,  # the sources are read at the first poll only
        scan_every_s=3600,
    )
    try:
        # Reads the tenants (ours among them) and hands their topics to the
        # worker, whose creation waits for `release`: nothing added yet.
        assert watch.poll() is None
        release.set()
        wait_for(lambda: changes, timeout=30, what="on_change")
        assert changes[0].startswith("topic-watch"), changes
        names = watch.poll()  # an hour before the sources are due
        assert names is not None and topics.runs(tenant) in names
        assert topics.runs(tenant) in made
        assert watch.poll() is None  # told once
    finally:
        watch.close()


def test_topic_watch__wake_on_announce__an_announced_new_topic_of_the_prefix_wakes_the_loop(
    database_url, kafka_bootstrap, topic_prefix
):
    """The executor's and webhook's loops wait up to 200 ms for records: an
    announced topic wakes them (on_change, the fetch nudge), on the wake
    thread, while nobody calls poll(); poll() then reads it (on its own
    connection, which the same notification reached). A topic of another
    prefix, or one already known, wakes nothing."""
    prefix = f"{topic_prefix}.managed."
    woken = threading.Event()
    threads: list[str] = []

    def on_change() -> None:
        threads.append(threading.current_thread().name)
        woken.set()

    watch = TopicWatch(
        database_url,
        kafka.admin(kafka_bootstrap, principal="executor"),
        prefix,
        on_change=on_change,
        scan_every_s=3600,
        wake_on_announce=True,
    )
    try:
        assert watch.poll() is None  # listening; the broker has none of ours
        assert watch.listening.wait(10)
        with psycopg.connect(database_url, autocommit=True) as conn:
            announce(conn, [f"{topic_prefix}.webhook.acme"])  # another kind's
            announce(conn, [f"{prefix}acme"])
            wait_for(woken.is_set, timeout=10, what="the wake")
            assert threads == ["topic-watch-listen"] and watch.woken_total == 1
            assert _polled(watch) == [f"{prefix}acme"]
            woken.clear()
            announce(conn, [f"{prefix}acme"])  # known now: no wake
            announce(conn, [f"{prefix}globex"])
            wait_for(woken.is_set, timeout=10, what="the second wake")
        assert watch.woken_total == 2
        assert _polled(watch) == [f"{prefix}acme", f"{prefix}globex"]
    finally:
        watch.close()


@pytest.mark.parametrize(
    "role, polled, on_thread",
    [
        ("executor", {"cw_topics"}, {"cw_topics"}),
        ("dispatcher", {"cw_topics"}, {"cw_tenants", "cw_destinations"}),
    ],
)
def test_topic_watch__listens_only_on_the_channels_it_acts_on__tenants_and_jobs_on_its_thread(
    database_url, kafka_bootstrap, topic_prefix, role, polled, on_thread
):
    """cw_destinations comes with every job created: a watch that creates no
    destination topics (the executor's, the webhook service's) is not sent
    it, nor cw_tenants where it makes no tenant's topic. Those two come to
    the watch's thread, where the dispatcher acts on them as they come, not
    at its loop's next pass; so do announced topics where they wake the loop
    (the executor's). Asked of each listening connection, as the database
    keeps it."""
    dispatcher = role == "dispatcher"
    watch = TopicWatch(
        database_url,
        kafka.admin(kafka_bootstrap, principal=role),
        f"{topic_prefix}.runs." if dispatcher else f"{topic_prefix}.managed.",
        tenant_topic=Topics(topic_prefix).runs if dispatcher else None,
        ensure=(lambda names: None) if dispatcher else None,
        on_destinations=(lambda batch: None) if dispatcher else None,
        on_change=None if dispatcher else (lambda: None),
        scan_every_s=3600,
        wake_on_announce=not dispatcher,
    )
    try:
        watch.poll()
        assert watch.listening.wait(10)
        channels = "SELECT pg_listening_channels()"
        assert {r[0] for r in watch._listen.execute(channels)} == polled
        assert watch.thread_conn is not None
        assert {r[0] for r in watch.thread_conn.execute(channels)} == on_thread
    finally:
        watch.close()


def test_topic_watch__a_job_made_while_the_loop_waits__its_destination_handed_over_unpolled(
    database_url, kafka_bootstrap, topic_prefix
):
    """The dispatcher's loop may wait for records long after a job is made
    (dozing, nothing due): the job's destination reaches `on_destinations`
    without another poll(), and a new tenant's topic reaches `ensure`."""
    topics = Topics(topic_prefix)
    handed: list[tuple[str, str, str]] = []
    ensured: list[str] = []
    watch = TopicWatch(
        database_url,
        kafka.admin(kafka_bootstrap, principal="dispatcher"),
        f"{topic_prefix}.runs.",
        tenant_topic=topics.runs,
        ensure=ensured.extend,
        on_destinations=handed.extend,
        scan_every_s=3600,
    )
    try:
        watch.poll()  # the loop's first pass, and its last here
        assert watch.listening.wait(10)
        with psycopg.connect(database_url, autocommit=True) as conn:
            made = create_tenant(conn, "acme")
            tenant = made["tenant_id"]
            with conn.transaction():
                body = {"name": "j", "schedule": {"cron": "0 * * * *"}, "target": QUEUE_Q}
                Jobs(topics).create(conn, made, body, now_ms())
        wait_for(lambda: (tenant, "queue", "q") in handed, timeout=10, what="the job's destination")
        wait_for(lambda: topics.runs(tenant) in ensured, timeout=10, what="the tenant's topic")
    finally:
        watch.close()


def _polled(watch: TopicWatch) -> list[str]:
    got: list[list[str] | None] = [None]
    wait_for(lambda: got.__setitem__(0, watch.poll()) or got[0], timeout=10, what="poll()")
    return got[0]
