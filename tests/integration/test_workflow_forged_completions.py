"""Issue 23, tenant isolation: the workflow service believes a RunCompleted only
where the database agrees with it. Forged and stale records travel the real
path (the `run-completed` topic -> the running workflow service), produced with
the platform's own client (tenants can no longer write to that topic), and
change nothing: no node moves, no child run is created, no counter drops, and
no `processed` row is left behind, so the genuine completion still applies when
it comes. Each refusal is counted by reason, in the service and in
cronwheel_workflow_records_refused_total; a test waits for that count before it
looks at the database, so the record was provably consumed first."""

from __future__ import annotations

import psycopg
import pytest
from prometheus_client import REGISTRY

from cronwheel import kafka
from cronwheel.core import events
from cronwheel.core.avro import default_registry
from cronwheel.core.clock import now_ms
from cronwheel.core.ids import partition_of_run, run_id_for_node
from cronwheel.kafka import Topics
from services.timer.service import TimerService
from services.workflow.service import WorkflowService
from tests.integration.test_workflows import DIAMOND, Flow, node
from tests.support.running import running
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration

REFUSED = "cronwheel_workflow_records_refused_total"


@pytest.fixture
def flow(database_url, topic_prefix):
    with psycopg.connect(database_url, autocommit=True) as c:
        yield Flow(c, Topics(topic_prefix))


class Topic:
    """The `run-completed` topic as the platform writes it, and the workflow
    service reading it."""

    def __init__(self, flow: Flow, service: WorkflowService, bootstrap: str):
        self.flow, self.service = flow, service
        # The relay writes run-completed; tenants cannot (cronwheel.principals).
        self.producer = kafka.producer(bootstrap, principal="relay")

    def publish(self, *values: bytes) -> None:
        for value in values:
            run_id = default_registry().decode(value)[1]["run_id"]
            self.producer.produce(self.flow.topics.run_completed, key=run_id.encode(), value=value)
        assert self.producer.flush(30) == 0

    def held_back(self) -> list[bytes]:
        """The genuine RunCompleted rows of the outbox, taken out of it (the relay
        is not running: the test decides when they are published)."""
        rows = self.flow.conn.execute(
            "DELETE FROM outbox WHERE topic = %s RETURNING id, value",
            [self.flow.topics.run_completed],
        ).fetchall()
        return [bytes(v) for _, v in sorted(rows)]

    def refused(self, reason: str, count: int) -> None:
        """Wait until the service refused `count` records for `reason` in all."""
        self._reach(self.service.refused, reason, count)

    def steps(self, outcome: str, count: int) -> None:
        """Wait until `count` records had `outcome` in all (applied, duplicate)."""
        self._reach(self.service.counts, outcome, count)

    @staticmethod
    def _reach(counts: dict[str, int], key: str, count: int) -> None:
        wait_for(lambda: counts.get(key, 0) >= count, what=f"{count} record(s) {key}")
        assert counts.get(key, 0) == count


@pytest.fixture
def topic(database_url, kafka_bootstrap, flow):
    kafka.ensure_topics(
        [flow.topics.run_completed, flow.topics.dead_letter],
        bootstrap=kafka_bootstrap,
        principal="workflow",
    )
    service = WorkflowService(database_url, kafka_bootstrap, flow.topics)
    t = Topic(flow, service, kafka_bootstrap)
    with running(service):
        yield t
    assert service.dead_lettered_total == 0  # a refusal is not poison


def forged(
    run_id: str, tenant_id: str, wfr: str, name: str, state: str = "SUCCEEDED", attempt: int = 1
) -> bytes:
    """A RunCompleted as the lifecycle would write it, saying whatever the caller
    wants it to."""
    return events.run_completed(
        run_id=run_id, tenant_id=tenant_id, partition_id=partition_of_run(run_id),
        attempt=attempt, state=state, finished_ms=now_ms(), workflow_run_id=wfr, node=name,
        error=None if state == "SUCCEEDED" else "forged",
    )  # fmt: skip


def snapshot(f: Flow, wfr: str) -> tuple:
    """All a completion step can change: the workflow run and its nodes (state,
    run, pending_deps), its runs, the outbox and the `processed` rows."""
    view = f.wf.get_run(f.conn, f.tenant, wfr)
    runs = f.conn.execute(
        "SELECT node, run_id, state, attempt FROM runs_daily WHERE workflow_run_id = %s ORDER BY node",
        [wfr],
    ).fetchall()
    outbox = f.conn.execute("SELECT id, topic, key FROM outbox ORDER BY id").fetchall()
    processed = f.conn.execute(
        "SELECT message_key FROM processed WHERE consumer = 'workflow' ORDER BY 1"
    ).fetchall()
    return view, runs, outbox, processed


def metric(reason: str) -> float:
    return REGISTRY.get_sample_value(REFUSED, {"reason": reason}) or 0.0


def is_processed(f: Flow, run_id: str) -> bool:
    return bool(
        f.conn.execute(
            "SELECT 1 FROM processed WHERE consumer = 'workflow' AND message_key = %s", [run_id]
        ).fetchone()
    )


def start(f: Flow, run_id: str) -> dict:
    return f.lc.start(f.conn, f.tenant["tenant_id"], run_id, "worker-1", now_ms())


def complete(f: Flow, run_id: str, got: dict, outcome: str = "SUCCEEDED") -> str:
    return f.lc.complete(
        f.conn, f.tenant["tenant_id"], run_id, got["attempt"], got["start_token"], outcome,
        now_ms(), error=None if outcome == "SUCCEEDED" else "boom",
    )["state"]  # fmt: skip


# -- the cases ------------------------------------------------------------------------


def test_forged_end_of_a_running_node__changes_nothing__the_genuine_one_still_advances(flow, topic):
    wf = flow.create(DIAMOND)["workflow_id"]
    wfr = flow.trigger(wf)
    a = flow.nodes(wfr)["a"]["run_id"]
    got = start(flow, a)  # a is RUNNING, attempt 1
    tid = flow.tenant["tenant_id"]
    before = snapshot(flow, wfr)
    metric_before = metric("state")
    # A SUCCEEDED would release b and c; a FAILED would fail the workflow run and
    # skip everything below a. Both claim what the database does not show.
    topic.publish(forged(a, tid, wfr, "a"), forged(a, tid, wfr, "a", state="FAILED"))
    topic.refused("state", 2)
    assert metric("state") - metric_before == 2
    assert snapshot(flow, wfr) == before
    assert flow.state(wfr) == "RUNNING" and flow.nodes(wfr)["d"]["pending_deps"] == 2
    assert set(flow.runs_by_node(wfr)) == {"a"} and not is_processed(flow, a)
    # A run id that is not in the database at all (the id of a node the workflow
    # does not have: a workflow id of its own would share a's id whenever the two
    # ids fall in the same partition, one time in 1,024).
    ghost = run_id_for_node(wf, wfr, "ghost")
    assert ghost != a
    topic.publish(forged(ghost, tid, wfr, "a"))
    topic.refused("no_run", 1)
    assert snapshot(flow, wfr) == before

    # The worker really finishes a: its RunCompleted is applied, not a duplicate.
    assert complete(flow, a, got) == "SUCCEEDED"
    topic.publish(*topic.held_back())
    topic.steps("applied", 1)
    nodes = flow.nodes(wfr)
    assert nodes["b"]["state"] == nodes["c"]["state"] == "PENDING"
    assert nodes["d"]["pending_deps"] == 2 and is_processed(flow, a)
    assert topic.service.counts == {"refused": 3, "applied": 1}


def test_forged_stale_attempt__changes_nothing__before_or_after_the_retry_ends(flow, topic):
    retry = {"max_attempts": 2, "initial_backoff_ms": 0}
    wfr = flow.trigger(flow.create([node("a", retry=retry), node("b", "a")])["workflow_id"])
    a = flow.nodes(wfr)["a"]["run_id"]
    tid = flow.tenant["tenant_id"]
    assert complete(flow, a, start(flow, a), "FAILED") == "RETRY_WAIT"
    assert topic.held_back() == []  # a retry is not a completion
    timer = TimerService(flow.conn.info.dsn, flow.topics)
    timer.leases.tick(flow.conn, now_ms())
    wait_for(lambda: timer.fire_once(flow.conn, now_ms() + 10).runs_created, what="the retry")
    got = start(flow, a)
    assert got["attempt"] == 2
    metric_before = metric("attempt")
    before = snapshot(flow, wfr)
    # Attempt 1 as it really ended (FAILED), and attempt 1 claimed a success.
    topic.publish(
        forged(a, tid, wfr, "a", state="FAILED", attempt=1), forged(a, tid, wfr, "a", attempt=1)
    )
    topic.refused("attempt", 2)
    assert snapshot(flow, wfr) == before
    assert flow.state(wfr) == "RUNNING" and flow.nodes(wfr)["b"]["state"] == "WAITING"

    # Attempt 2 succeeds; its genuine record is held back while a stale one claims
    # the same end at attempt 1: only the attempt is false now, and that suffices.
    assert complete(flow, a, got) == "SUCCEEDED"
    [genuine] = topic.held_back()
    before = snapshot(flow, wfr)
    topic.publish(forged(a, tid, wfr, "a", attempt=1))
    topic.refused("attempt", 3)
    assert metric("attempt") - metric_before == 3
    assert snapshot(flow, wfr) == before and not is_processed(flow, a)
    topic.publish(genuine)
    topic.steps("applied", 1)
    assert flow.nodes(wfr)["b"]["state"] == "PENDING"


def test_record_naming_another_tenants_workflow_run__changes_nothing_in_either(flow, topic):
    mine = flow.trigger(flow.create(DIAMOND)["workflow_id"])
    a = flow.nodes(mine)["a"]["run_id"]
    got = start(flow, a)  # RUNNING
    other = Flow(flow.conn, flow.topics, "mallory")
    theirs = other.trigger(other.create(DIAMOND)["workflow_id"])
    their_a = other.nodes(theirs)["a"]["run_id"]
    assert complete(other, their_a, start(other, their_a)) == "SUCCEEDED"
    [their_genuine] = topic.held_back()
    me, them = flow.tenant["tenant_id"], other.tenant["tenant_id"]
    metric_before = metric("tenant"), metric("workflow_run")
    before = snapshot(flow, mine), snapshot(other, theirs)
    topic.publish(
        # Their tenant id on my workflow run and my node's run.
        forged(a, them, mine, "a"),
        # My tenant id claimed, my workflow run, their (really SUCCEEDED) run.
        forged(their_a, me, mine, "a"),
        # Every claim about their run true, but pointed at my workflow run.
        forged(their_a, them, mine, "a"),
    )
    topic.refused("tenant", 2)
    topic.refused("workflow_run", 1)
    assert (metric("tenant"), metric("workflow_run")) == (
        metric_before[0] + 2,
        metric_before[1] + 1,
    )
    assert (snapshot(flow, mine), snapshot(other, theirs)) == before
    assert not is_processed(flow, a) and not is_processed(flow, their_a)

    # Their genuine completion still applies, to their workflow run only; mine
    # still advances when my node really ends.
    topic.publish(their_genuine)
    topic.steps("applied", 1)
    assert other.nodes(theirs)["b"]["state"] == "PENDING"
    assert set(flow.runs_by_node(mine)) == {"a"}
    assert complete(flow, a, got) == "SUCCEEDED"
    topic.publish(*topic.held_back())
    topic.steps("applied", 2)
    assert flow.nodes(mine)["b"]["state"] == "PENDING"


def test_replay_of_an_applied_completion__a_duplicate__changes_nothing(flow, topic):
    wfr = flow.trigger(flow.create(DIAMOND)["workflow_id"])
    a = flow.nodes(wfr)["a"]["run_id"]
    assert complete(flow, a, start(flow, a)) == "SUCCEEDED"
    [genuine] = topic.held_back()
    topic.publish(genuine)
    topic.steps("applied", 1)
    before = snapshot(flow, wfr)
    topic.publish(genuine, genuine)
    topic.steps("duplicate", 2)
    assert snapshot(flow, wfr) == before
    assert flow.nodes(wfr)["d"]["pending_deps"] == 2
    assert {k: len(v) for k, v in flow.runs_by_node(wfr).items()} == {"a": 1, "b": 1, "c": 1}
    assert topic.service.counts == {"applied": 1, "duplicate": 2} and topic.service.refused == {}


def test_failed_node__the_workflow_run_takes_the_runs_error__not_the_records(flow, topic):
    wfr = flow.trigger(
        flow.create([node("a", retry={"max_attempts": 1}), node("b", "a")])["workflow_id"]
    )
    a = flow.nodes(wfr)["a"]["run_id"]
    assert complete(flow, a, start(flow, a), "FAILED") == "FAILED"
    [genuine] = topic.held_back()
    record = default_registry().decode(genuine)[1]
    # Every claim the step checks is true; only the free text is not the run's.
    topic.publish(
        forged(a, record["tenant_id"], wfr, "a", state="FAILED", attempt=record["attempt"])
    )
    topic.steps("applied", 1)
    view = flow.wf.get_run(flow.conn, flow.tenant, wfr)
    assert view["state"] == "FAILED" and view["error"] == "node 'a' FAILED: boom"
    assert flow.nodes(wfr)["b"]["state"] == "SKIPPED"
