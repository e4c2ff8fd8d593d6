"""A relay or dispatcher whose producer holds records and reports no delivery
while the broker answers a new client, as librdkafka left both after a
broker restart (cronwheel/fetch_watch.py, DeliveryWatch), ends its run; a
new one with a new producer takes over (run_restarting, as `cronwheel serve`
runs them), and every record reaches its topic once.

The stuck producer is one given a wrong password: it holds what it is given,
connects to nothing and reports nothing (for librdkafka's five-minute message
timeout), while the service's other clients and new ones talk to the broker:
from outside, what the stuck producers looked like."""

from __future__ import annotations

import logging
from collections import Counter

import psycopg
import pytest

from cronwheel import kafka
from cronwheel.core.clock import now_ms
from cronwheel.kafka import Topics
from cronwheel.store.jobs import Jobs, create_tenant
from cronwheel.topics_met import RenewingProducer
from services.dispatcher.service import Dispatcher
from services.dispatcher.settings import DispatcherSettings
from services.relay.service import Relay
from tests.integration.test_dispatcher import produce, ready
from tests.support.kafka import read_all
from tests.support.running import Restarting, clients_restarted, running
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration


def wedged(bootstrap: str, principal: str) -> RenewingProducer:
    """A producer that cannot talk to the broker, in place of a stuck one."""
    return RenewingProducer(
        lambda: kafka.producer(
            bootstrap, principal=principal, **{"sasl.password": "not-the-password"}
        )
    )


def needs_authentication(bootstrap: str) -> None:
    if "sasl.username" not in kafka.security("relay", bootstrap):
        pytest.skip("the broker takes clients without authentication (KAFKA_BOOTSTRAP names one)")


def stuck_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "Kafka clients are stuck" in r.getMessage()]


@pytest.mark.parametrize("in_flight", [DispatcherSettings.in_flight, 1])
def test_dispatcher_producer_reports_nothing__new_clients__each_run_forwarded_once(
    database_url, kafka_bootstrap, topic_prefix, caplog, in_flight
):
    """With one batch in flight allowed, the first batch's wait for its
    acknowledgements (Dispatcher._settle) is where the stuck producer is
    found, not between turns."""
    needs_authentication(kafka_bootstrap)
    caplog.set_level(logging.WARNING, logger="cronwheel.dispatcher")
    topics = Topics(topic_prefix)
    produce(kafka_bootstrap, topics.runs("acme"), [(b"r0", ready("acme", "r0"))], partition=0)
    produce(kafka_bootstrap, topics.runs("acme"), [(b"r1", ready("acme", "r1"))], partition=0)
    before = clients_restarted("dispatcher")
    made: list[Dispatcher] = []

    def make() -> Dispatcher:
        d = Dispatcher(
            database_url, kafka_bootstrap, topics,
            doze_after_ms=0, fetch_watch_s=1.0, in_flight=in_flight,
        )  # fmt: skip
        if not made:
            d.producer = wedged(kafka_bootstrap, "dispatcher")
        made.append(d)
        return d

    with running(Restarting(make)):
        wait_for(lambda: sum(d.forwarded_total for d in made) >= 2, 60, what="both forwarded")
    assert len(made) == 2 and clients_restarted("dispatcher") - before == 1
    [why] = stuck_lines(caplog)
    assert "held by the producer with no delivery report" in why
    queue = topics.queue("acme", "billing")
    assert Counter(m.key().decode() for m in read_all(kafka_bootstrap, [queue])) == {
        "r0": 1,
        "r1": 1,
    }


def test_relay_producer_reports_nothing__new_relay__each_run_published_once(
    database_url, kafka_bootstrap, topic_prefix, caplog
):
    needs_authentication(kafka_bootstrap)
    caplog.set_level(logging.WARNING, logger="cronwheel.relay")
    topics = Topics(topic_prefix)
    with psycopg.connect(database_url, autocommit=True) as conn:
        tenant = create_tenant(conn, "acme")
        job = Jobs(topics).create(
            conn,
            tenant,
            {
                "name": "queued",
                "schedule": {"every_ms": 86_400_000},
                "target": {"type": "queue", "queue": "billing"},
            },
            now_ms(),
        )
        runs = [
            Jobs(topics).trigger(conn, tenant, job["job_id"], now_ms() + i)["run_id"]
            for i in range(3)
        ]
    before = clients_restarted("relay")
    made: list[Relay] = []

    def make() -> Relay:
        r = Relay(database_url, kafka_bootstrap, idle_ms=50, delivery_watch_s=1.0)
        if not made:
            r.producer = wedged(kafka_bootstrap, "relay")
        made.append(r)
        return r

    with running(Restarting(make)):
        wait_for(lambda: sum(r.published_total for r in made) >= 3, 60, what="all published")
    assert len(made) == 2 and clients_restarted("relay") - before == 1
    [why] = stuck_lines(caplog)
    assert "held by the producer with no delivery report" in why
    topic = topics.runs(tenant["tenant_id"])
    published = Counter(m.key().decode() for m in read_all(kafka_bootstrap, [topic]))
    assert published == {run_id: 1 for run_id in runs}
