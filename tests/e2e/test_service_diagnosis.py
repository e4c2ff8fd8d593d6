"""Asking a running service what it is doing (cronwheel.runtime): SIGUSR1
writes every thread's stack to its log, SIGUSR2 makes a consuming service log
its Kafka state at its loop's next pass. Neither stops it."""

from __future__ import annotations

import json
import signal

import pytest

from cronwheel import kafka
from cronwheel.kafka import Topics
from tests.integration.test_dispatcher import ready
from tests.support.procs import launcher
from tests.support.wait import wait_for

pytestmark = pytest.mark.e2e

STATE = "state, as asked (SIGUSR2): "


def states(log: str) -> list[dict]:
    return [json.loads(line.split(STATE, 1)[1]) for line in log.splitlines() if STATE in line]


def test_dispatcher__sigusr1_stacks__sigusr2_its_kafka_state__and_it_goes_on(
    database_url, kafka_bootstrap, topic_prefix
):
    topics = Topics(topic_prefix)
    topic = topics.runs("diag")
    kafka.ensure_topics([topic], kafka.RUN_PARTITIONS, kafka_bootstrap, principal="dispatcher")
    producer = kafka.producer(kafka_bootstrap, principal="relay")
    for i in range(3):
        producer.produce(topic, key=f"r{i}".encode(), value=ready("diag", f"diag-r{i}"))
    assert producer.flush(30) == 0

    with launcher(database_url, kafka_bootstrap, topic_prefix) as launch:
        dispatcher = launch.start("dispatcher")
        wait_for(lambda: "dispatcher starting" in dispatcher.log(), timeout=60, what="start")

        def state_with_the_run_topic_read() -> dict | None:
            # Asked again until it has fetched every partition it holds, read
            # them to their end (nothing behind) and had what it forwarded
            # acknowledged (a loaded machine answers that after the read).
            dispatcher.proc.send_signal(signal.SIGUSR2)
            for s in reversed(states(dispatcher.log())):
                mine = [k for k in s["partitions"] if k.startswith(f"{topic}[")]
                read = len(mine) == kafka.RUN_PARTITIONS and not s["unfetched"]
                if read and not s["behind"] and not s["batches_on_their_way"]:
                    return s
            return None

        state = wait_for(state_with_the_run_topic_read, timeout=60, interval=1, what="its state")
        assert state["coordinator"] == "answers"
        assert state["leases"] == 1024 and state["tenant_topics"] == 1
        read = [v for k, v in state["partitions"].items() if k.startswith(f"{topic}[")]
        assert sum(v["high"] for v in read) == 3  # the three records, read to the end
        assert all(v["position"] == v["high"] or v["high"] == 0 for v in read), read
        assert state["batches_on_their_way"] == [] and state["held"] == {}

        before = len(dispatcher.log())
        dispatcher.proc.send_signal(signal.SIGUSR1)
        # faulthandler writes one thread's stack after another, and the log may
        # be read between two of them: waited for until the loop's is there.
        stacks = wait_for(
            lambda: (
                'cronwheel/consumer.py", line' in dispatcher.log()[before:]
                and dispatcher.log()[before:]
            ),
            timeout=15,
            what="the loop's stack (cronwheel/consumer.py: where it waits)",
        )
        assert "most recent call first" in stacks
        assert dispatcher.alive(), dispatcher.log()[-2000:]
