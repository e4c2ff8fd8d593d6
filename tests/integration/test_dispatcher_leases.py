"""Dispatcher instances share the tenants by partition lease and assign run
topics by hand (cronwheel.assignment): no consumer group rebalances, tenants
split between instances, handed over when one stops, every run forwarded
once. Against the real broker and database."""

from __future__ import annotations

from collections import Counter

import pytest

from cronwheel import kafka
from cronwheel.core.ids import partition_of
from cronwheel.kafka import Topics
from services.dispatcher.service import Dispatcher
from tests.integration.test_dispatcher import produce, ready
from tests.support.kafka import read_all
from tests.support.running import running
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration

TENANTS = 12


@pytest.fixture
def topics(topic_prefix) -> Topics:
    return Topics(topic_prefix)


def group_state(bootstrap: str, group: str):
    admin = kafka.admin(bootstrap, principal="dispatcher")  # describes its own group
    return admin.describe_consumer_groups([group])[group].result(10)


def test_two_instances__tenants_split_by_lease__handed_over_on_stop__every_run_forwarded_once(
    database_url, kafka_bootstrap, topics
):
    tenants = [f"acme{i}" for i in range(TENANTS)]
    kafka.ensure_topics(
        [topics.runs(t) for t in tenants], partitions=kafka.RUN_PARTITIONS, principal="dispatcher"
    )
    queues = [topics.queue(t, "billing") for t in tenants]
    sent: list[str] = []

    def wave(n: int) -> None:
        for t in tenants:
            records = []
            for i in range(5):
                run_id = f"{t}-w{n}-{i}"
                sent.append(run_id)
                records.append((run_id.encode(), ready(t, run_id)))
            produce(kafka_bootstrap, topics.runs(t), records)

    def forwarded(*dispatchers: Dispatcher) -> bool:
        return sum(d.forwarded_total for d in dispatchers) >= len(sent)

    def all_on_queues(wave_: int, *dispatchers: Dispatcher) -> None:
        """Every run sent so far on its queue, once: checked after each wave,
        so that a loss is pinned to the wave (and the hand-over before it)
        where it happened, with where each missing run sits in its run topic."""
        on_queues = read_all(kafka_bootstrap, queues)
        seen = Counter(m.key().decode() for m in on_queues)
        missing = set(sent) - set(seen)
        doubled = {r: n for r, n in seen.items() if n > 1}
        if missing or doubled:
            first = sorted(missing | set(doubled))[0].split("-")[0]
            order = [
                (m.offset(), m.key().decode())
                for m in on_queues
                if m.topic() == topics.queue(first, "billing")
            ]
            runs = read_all(kafka_bootstrap, [topics.runs(t) for t in tenants])
            at = {m.key().decode(): (m.partition(), m.offset()) for m in runs}
            totals = [
                (d.forwarded_total, d.duplicates_total, d.unplaced_acks_total) for d in dispatchers
            ]
            raise AssertionError(
                f"after wave {wave_}: {len(missing)} runs never forwarded "
                f"{[(r, at.get(r)) for r in sorted(missing)[:5]]}, "
                f"{len(doubled)} forwarded twice {sorted(doubled)[:5]}; "
                f"(forwarded, skipped as duplicates, acknowledged without an offset) per instance: {totals}; "
                f"{first}'s queue: {sorted(order)}"
            )

    a = Dispatcher(database_url, kafka_bootstrap, topics, lease_ttl_ms=3_000)
    b = Dispatcher(database_url, kafka_bootstrap, topics, lease_ttl_ms=3_000)
    with running(a):
        wave(1)
        wait_for(lambda: forwarded(a), timeout=60, what="wave 1 forwarded by the one instance")
        all_on_queues(1, a)
        # No member in the group: the run topics were assigned, not subscribed.
        described = group_state(kafka_bootstrap, a.group_id)
        assert described.members == [], described

        with running(b):
            # The joiner takes about half the partitions, and with them its
            # tenants' topics; the first hands those over.
            def split() -> bool:
                return (
                    bool(a.assignment.owned and b.assignment.owned)
                    and not a.assignment.owned & b.assignment.owned
                    and len(a.assignment.owned | b.assignment.owned) == 1024
                )

            wait_for(split, timeout=30, what="leases split between the instances")

            def topics_split() -> bool:
                ta = {t for t, _p in a.assignment.assigned}
                tb = {t for t, _p in b.assignment.assigned}
                return not ta & tb and ta | tb == {topics.runs(t) for t in tenants}

            wait_for(topics_split, timeout=30, what="run topics split between the instances")
            for name in {t for t, _p in b.assignment.assigned}:
                assert partition_of(name.rsplit(".", 1)[1]) in b.assignment.owned
            before = a.forwarded_total, b.forwarded_total
            wave(2)
            wait_for(lambda: forwarded(a, b), timeout=60, what="wave 2 forwarded")
            assert a.forwarded_total > before[0] and b.forwarded_total > before[1]
            all_on_queues(2, a, b)
        # b stopped cleanly and released its leases: a takes its tenants back.
        wait_for(
            lambda: (
                len(a.assignment.owned) == 1024
                and len(a.assignment.assigned) == TENANTS * kafka.RUN_PARTITIONS
            ),
            timeout=30,
            what="the remaining instance took every tenant back",
        )
        wave(3)
        wait_for(lambda: forwarded(a, b), timeout=60, what="wave 3 forwarded")

    all_on_queues(3, a, b)
    assert a.forwarded_total + b.forwarded_total == len(sent)
