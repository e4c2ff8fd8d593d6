"""An executor whose consumer holds partitions and does not read them, as
librdkafka left a dispatcher's after a broker restart
(cronwheel/fetch_watch.py), ends its run once its commands are done; a new
one with new Kafka clients takes over (run_restarting, as `cronwheel serve
executor` runs it), and every run is executed once. The consumer is made
stuck by pausing its partitions behind the executor's back (as
test_fetch_watch.py does to a dispatcher)."""

from __future__ import annotations

import logging
import shutil

import pytest
from confluent_kafka import TopicPartition

from cronwheel import kafka
from services.executor.sandbox import Policy
from services.executor.service import Executor
from tests.integration.test_executor import serving
from tests.support.running import Restarting, clients_restarted
from tests.support.wait import wait_for

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap: make system-deps"),
]


def test_executor_partitions_not_read_though_records_wait__new_clients__each_run_once(
    servers, db_template, new_topic_prefix, caplog
):
    caplog.set_level(logging.WARNING, logger="cronwheel.executor")
    made: list[Executor] = []

    def restarting(url, bootstrap, topics) -> Restarting:
        def make() -> Executor:
            made.append(
                Executor(
                    url, bootstrap, topics, policy=Policy(), concurrency=2, per_tenant=2,
                    shutdown_grace_ms=500, fetch_watch_s=1.0,
                )
            )  # fmt: skip
            return made[-1]

        return Restarting(make)

    before = clients_restarted("executor")
    with serving(servers, db_template, new_topic_prefix, make=restarting) as platform:
        tenant = platform.tenant()
        first = platform.trigger(tenant, ["/bin/true"])
        assert platform.finished(tenant, first)["state"] == "SUCCEEDED"
        managed = platform.topics.managed(tenant["tenant_id"])
        admin = kafka.admin(servers.kafka_bootstrap, principal="dispatcher")
        count = len(admin.list_topics(managed, timeout=10).topics[managed].partitions)
        made[0]._consumer.pause([TopicPartition(managed, p) for p in range(count)])
        later = [platform.trigger(tenant, ["/bin/true"]) for _ in range(3)]
        wait_for(lambda: len(made) >= 2, timeout=30, what="new clients")
        for run_id in later:
            assert platform.finished(tenant, run_id, timeout=60)["state"] == "SUCCEEDED"
    assert len(made) == 2 and clients_restarted("executor") - before == 1
    assert sum(e.started_total for e in made) == 4  # each run's command once
    why = [r.getMessage() for r in caplog.records if "Kafka clients are stuck" in r.getMessage()]
    assert len(why) == 1 and f"{managed}[" in why[0], why
