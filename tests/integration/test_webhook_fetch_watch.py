"""A webhook service whose consumer holds partitions and does not read them,
as librdkafka left a dispatcher's after a broker restart
(cronwheel/fetch_watch.py), ends its run; a new one with new Kafka clients
takes over (run_restarting, as `cronwheel serve webhook` runs it), and every
run is delivered once. The consumer is made stuck by pausing its partitions
behind the service's back (as test_fetch_watch.py does to a dispatcher)."""

from __future__ import annotations

import logging
from collections import Counter

import pytest
from confluent_kafka import TopicPartition

from services.dispatcher.service import Dispatcher
from services.relay.service import Relay
from services.timer.service import TimerService
from services.webhook.service import Settings, WebhookService
from tests.integration import test_webhook_delivery as delivery
from tests.integration.test_webhook_delivery import LOOPBACK, state, trigger, webhook_job
from tests.support.running import Restarting, clients_restarted, running
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration

conn, topics, tenant, receiver = delivery.conn, delivery.topics, delivery.tenant, delivery.receiver


def test_webhook_partitions_not_read_though_records_wait__new_clients__each_run_once(
    database_url, kafka_bootstrap, topics, conn, tenant, receiver, caplog
):
    caplog.set_level(logging.WARNING, logger="cronwheel.webhook")
    job, _secret = webhook_job(conn, topics, tenant, receiver.url("/hook"))
    made: list[WebhookService] = []

    def make() -> WebhookService:
        made.append(
            WebhookService(
                database_url, kafka_bootstrap, topics, instance="t1", allow=LOOPBACK,
                settings=Settings(fetch_watch_ms=1000),
            )
        )  # fmt: skip
        return made[-1]

    before = clients_restarted("webhook")
    with (
        running(Relay(database_url, kafka_bootstrap, idle_ms=50)),
        running(Dispatcher(database_url, kafka_bootstrap, topics)),
        running(TimerService(database_url, topics, lease_ttl_ms=5000, idle_ms=200, ahead_ms=0)),
        running(Restarting(make)),
    ):
        first = trigger(conn, topics, tenant, job)
        wait_for(lambda: state(conn, first) == "SUCCEEDED", 30, what="the first delivery")
        service = made[0]
        webhook_topic = topics.webhook(tenant["tenant_id"])
        behind_its_back = [TopicPartition(webhook_topic, p) for p in (0, 1)]
        # On the service's own Kafka thread, where it makes every consumer call.
        service._kafka_thread.submit(service._consumer.pause, behind_its_back).result(10)
        later = [trigger(conn, topics, tenant, job) for _ in range(3)]
        wait_for(lambda: len(made) >= 2, timeout=30, what="new clients")
        wait_for(
            lambda: all(state(conn, r) == "SUCCEEDED" for r in later),
            timeout=60,
            what="the later runs delivered by the new clients",
        )
    assert len(made) == 2 and clients_restarted("webhook") - before == 1
    why = [r.getMessage() for r in caplog.records if "Kafka clients are stuck" in r.getMessage()]
    assert len(why) == 1 and f"{webhook_topic}[" in why[0], why
    delivered = Counter(got.headers["webhook-id"] for got in receiver.requests("/hook"))
    assert delivered == {run_id: 1 for run_id in [first, *later]}
