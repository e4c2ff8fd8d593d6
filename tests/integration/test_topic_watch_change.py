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
from cronwheel.kafka import Topics
from cronwheel.topic_watch import TopicWatch
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration


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
