"""The workflow service as a real process (`cronwheel serve workflow`), killed
with SIGKILL again and again while a 30-node chain-and-fan workflow runs: right
after it applied a completion, before its offsets were committed. The records
come again after each restart and are found already processed, so every node
still runs exactly once and the workflow run ends SUCCEEDED."""

from __future__ import annotations

import random
import threading
import time

import psycopg
import pytest

from cronwheel.core.clock import now_ms
from cronwheel.kafka import Topics
from cronwheel.store.lifecycle import Lifecycle
from services.relay.service import Relay
from tests.integration.test_workflows import Flow, node
from tests.support.procs import launcher
from tests.support.running import running
from tests.support.wait import wait_for

pytestmark = pytest.mark.e2e

KILLS = 10
# Commits every 5 s rather than after every batch: a kill right after a
# transaction lands before its offset was committed. The interval counts from
# the service's start, so with 400 ms a start that took longer than that to
# join the group and apply a first batch committed at once, and the kill came
# after the commit (CI, a loaded machine: 4 of 10 restarts saw records again).
SERVICE_ENV = {
    "CRONWHEEL_WORKFLOW_INSTANCE_ID": "workflow-0",
    "CRONWHEEL_WORKFLOW_COMMIT_INTERVAL_MS": "5000",
}


def chain_and_fan() -> list[dict]:
    """root -> 4 -> join1 -> 4 -> join2 -> a chain of 19: 30 nodes, 24 levels."""
    fan1 = [node(f"f1_{i}", "root") for i in range(4)]
    fan2 = [node(f"f2_{i}", "join1") for i in range(4)]
    chain = [node("c0", "join2")] + [node(f"c{i}", f"c{i - 1}") for i in range(1, 19)]
    return [
        node("root"),
        *fan1,
        node("join1", *(n["name"] for n in fan1)),
        *fan2,
        node("join2", *(n["name"] for n in fan2)),
        *chain,
    ]


class Worker:
    """Completes every PENDING node run of one workflow run as it appears, each
    after `work_s` of work, so that the workflow outlasts the kills."""

    def __init__(self, dsn: str, topics: Topics, tenant_id: str, wfr: str, work_s: float = 0.1):
        self.dsn, self.lc, self.tenant_id, self.wfr = dsn, Lifecycle(topics), tenant_id, wfr
        self.work_s = work_s
        self.completed = 0

    def run(self, stop: threading.Event) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not stop.is_set():
                pending = conn.execute(
                    "SELECT run_id FROM runs_daily WHERE workflow_run_id = %s AND state = 'PENDING'",
                    [self.wfr],
                ).fetchall()
                for (run_id,) in pending:
                    got = self.lc.start(conn, self.tenant_id, run_id, "w", now_ms())
                    if stop.wait(self.work_s):  # the handler's work, not a wait for a condition
                        return
                    self.lc.complete(
                        conn, self.tenant_id, run_id, got["attempt"], got["start_token"],
                        "SUCCEEDED", now_ms(),
                    )  # fmt: skip
                    self.completed += 1
                stop.wait(0.02)


def test_workflow_service__killed_after_applying_before_committing__one_run_per_node(
    database_url, kafka_bootstrap, topic_prefix
):
    rng = random.Random()
    topics = Topics(topic_prefix)
    with psycopg.connect(database_url, autocommit=True) as conn:
        flow = Flow(conn, topics)
        graph = chain_and_fan()
        wfr = flow.trigger(flow.create(graph)["workflow_id"])
        worker = Worker(database_url, topics, flow.tenant["tenant_id"], wfr)

        def applied() -> int:
            return conn.execute(
                "SELECT count(*) FROM processed WHERE consumer = 'workflow'"
            ).fetchone()[0]

        with (
            running(Relay(database_url, kafka_bootstrap)),
            running(worker),
            launcher(database_url, kafka_bootstrap, topic_prefix) as launch,
        ):
            for _ in range(KILLS):
                before = applied()
                svc = launch.start("workflow", **SERVICE_ENV)
                wait_for(lambda b=before: applied() > b, 30, 0.005, "a completion applied")
                time.sleep(rng.uniform(0, 0.1))  # the fault lands at a random point after it
                svc.kill()
            assert flow.state(wfr) == "RUNNING"  # the kills came before the end
            last = launch.start("workflow", **SERVICE_ENV)
            wait_for(lambda: flow.state(wfr) == "SUCCEEDED", 60, 0.05, "the workflow run")
            assert last.stop() == 0
            logs = [s.log() for s in launch.started]
        runs = flow.runs_by_node(wfr)
        assert sorted(runs) == sorted(n["name"] for n in graph)
        assert all(len(v) == 1 for v in runs.values()), "a node ran twice"
        assert worker.completed == len(graph)
        assert applied() == len(graph)
        # Each node's run was created after every parent's run had finished.
        rows = conn.execute(
            "SELECT node, created_at, finished_at FROM runs_daily WHERE workflow_run_id = %s", [wfr]
        ).fetchall()
        created = {n: c for n, c, _ in rows}
        finished = {n: f for n, _, f in rows}
        for n in graph:
            for parent in n["depends_on"]:
                assert created[n["name"]] >= finished[parent]
    # The kills did land between a transaction and its offset commit: records
    # came again after a restart and were skipped as already processed.
    marker = "already processed: skipped"
    restarts_with_redelivery = sum(1 for log in logs[1:] if marker in log)
    assert restarts_with_redelivery >= KILLS // 2, logs
    print(
        f"{KILLS} kills -9; {restarts_with_redelivery} of {KILLS} restarts were handed records"
        f" again ({sum(log.count(marker) for log in logs)} in all), each skipped as processed"
    )
