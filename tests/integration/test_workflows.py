"""Workflows against the real database (and, where the flow needs it, the real
broker): a workflow run's nodes run once each, in dependency order, driven by
RunCompleted; failures skip what lies below; cancels stop what is left.

Completions are driven through the run lifecycle (Lifecycle.start/complete),
and the RunCompleted rows it writes to the outbox are either applied directly
with Workflows.complete_node or travel the real path (relay -> Kafka -> the
workflow service)."""

from __future__ import annotations

import psycopg
import pytest

from cronwheel import kafka
from cronwheel.core import events
from cronwheel.core.avro import default_registry
from cronwheel.core.clock import now_ms, to_dt, to_ms
from cronwheel.core.errors import Conflict, NotFound, ValidationError
from cronwheel.core.ids import run_id_for_node
from cronwheel.core.workflows import workflow_run_id_for_instant
from cronwheel.kafka import Topics
from cronwheel.store import runs_daily
from cronwheel.store.jobs import create_tenant
from cronwheel.store.lifecycle import Lifecycle
from cronwheel.store.run_days import recent_days
from cronwheel.store.workflows import Workflows
from services.relay.service import Relay
from services.timer.service import TimerService
from services.workflow.service import WorkflowService
from tests.support.kafka import drain
from tests.support.running import running
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration

QUEUE = {"type": "queue", "queue": "settle"}
NO_RETRY = {"max_attempts": 1}


def node(name: str, *deps: str, **extra) -> dict:
    return {"name": name, "target": QUEUE, "depends_on": list(deps), **extra}


DIAMOND = [node("a"), node("b", "a"), node("c", "a"), node("d", "b", "c")]


# -- helpers shared with the other workflow tests ------------------------------------


class Flow:
    """One tenant's workflows in one test database, and the moves a worker makes."""

    def __init__(self, conn: psycopg.Connection, topics: Topics, name: str = "acme"):
        self.conn = conn
        self.topics = topics
        self.tenant = create_tenant(conn, name)
        self.wf = Workflows(topics)
        self.lc = Lifecycle(topics)

    def create(self, nodes: list[dict], at: int | None = None, **body) -> dict:
        body = {"name": "wf", "nodes": nodes, **body}
        return self.wf.create(self.conn, self.tenant, body, at or now_ms())

    def trigger(self, workflow_id: str, at: int | None = None) -> str:
        return self.wf.trigger(self.conn, self.tenant, workflow_id, at or now_ms())[
            "workflow_run_id"
        ]

    def nodes(self, wfr: str) -> dict[str, dict]:
        return {n["name"]: n for n in self.wf.get_run(self.conn, self.tenant, wfr)["nodes"]}

    def state(self, wfr: str) -> str:
        return self.wf.get_run(self.conn, self.tenant, wfr)["state"]

    def finish(self, run_id: str, outcome: str = "SUCCEEDED", retryable: bool = True) -> str:
        """A worker's StartRun + CompleteRun; returns the run's new state."""
        tid = self.tenant["tenant_id"]
        got = self.lc.start(self.conn, tid, run_id, "worker-1", now_ms())
        done = self.lc.complete(
            self.conn, tid, run_id, got["attempt"], got["start_token"], outcome, now_ms(),
            error=None if outcome == "SUCCEEDED" else "boom", retryable=retryable,
        )  # fmt: skip
        return done["state"]

    def take_completions(self) -> list[dict]:
        """The RunCompleted rows in the outbox (removed, as the relay would)."""
        rows = self.conn.execute(
            "DELETE FROM outbox WHERE topic = %s RETURNING id, value", [self.topics.run_completed]
        ).fetchall()
        return [default_registry().decode(bytes(v))[1] for _, v in sorted(rows)]

    def apply(self, records: list[dict]) -> list:
        return [self.wf.complete_node(self.conn, r, now_ms()) for r in records]

    def run_and_apply(self, wfr: str, name: str, outcome: str = "SUCCEEDED") -> list:
        """Finish the node's run (no retry) and apply its RunCompleted."""
        self.finish(self.nodes(wfr)[name]["run_id"], outcome, retryable=False)
        return self.apply(self.take_completions())

    def runs_by_node(self, wfr: str) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for n, r in self.conn.execute(
            "SELECT node, run_id FROM runs_daily WHERE workflow_run_id = %s", [wfr]
        ).fetchall():
            out.setdefault(n, []).append(r)
        return out


@pytest.fixture
def conn(database_url):
    with psycopg.connect(database_url, autocommit=True) as c:
        yield c


@pytest.fixture
def flow(conn, topic_prefix) -> Flow:
    return Flow(conn, Topics(topic_prefix))


# -- the store, no broker ---------------------------------------------------------------


def test_completion__of_a_run_days_old__applied_though_its_day_is_outside_the_first_window(
    flow, admin_database_url
):
    """begin_step looks for the run in the days around the record's finished_at
    first, then in every day: a node whose run was due five days before it
    ended (a workflow triggered for then) still advances its workflow run."""
    now = now_ms()
    long_ago = now - 5 * 86_400_000
    with psycopg.connect(admin_database_url, autocommit=True) as owner:
        runs_daily.ensure_days(owner, [to_dt(long_ago).date()])
    wf = flow.create(DIAMOND, at=long_ago)
    wfr = flow.trigger(wf["workflow_id"], at=long_ago)
    a = flow.nodes(wfr)["a"]["run_id"]
    (day,) = flow.conn.execute(
        "SELECT tableoid::regclass::text FROM runs_daily WHERE run_id = %s", [a]
    ).fetchone()
    assert day == runs_daily.runs_part(to_dt(long_ago).date())
    assert to_dt(long_ago) < recent_days(now).lo
    assert [s.outcome for s in flow.run_and_apply(wfr, "a")] == ["applied"]
    assert {k: v["state"] for k, v in flow.nodes(wfr).items()} == {
        "a": "SUCCEEDED", "b": "PENDING", "c": "PENDING", "d": "WAITING",
    }  # fmt: skip


def test_completion__finished_at_centuries_away__still_applied_not_a_bad_record(flow):
    """The record's finished_at only chooses the first days looked in: a value
    no date can hold falls back to now's days, and the run is found."""
    wfr = flow.trigger(flow.create(DIAMOND)["workflow_id"])
    flow.finish(flow.nodes(wfr)["a"]["run_id"], retryable=False)
    (record,) = flow.take_completions()
    record["finished_at"] = 2**62
    assert [s.outcome for s in flow.apply([record])] == ["applied"]


def test_trigger__creates_workflow_run_and_runs_of_roots_only(flow):
    wf = flow.create(DIAMOND)
    wfr = flow.trigger(wf["workflow_id"])
    nodes = flow.nodes(wfr)
    assert {k: v["state"] for k, v in nodes.items()} == {
        "a": "PENDING", "b": "WAITING", "c": "WAITING", "d": "WAITING",
    }  # fmt: skip
    assert nodes["a"]["run_id"] == run_id_for_node(wf["workflow_id"], wfr, "a")
    assert nodes["b"]["run_id"] is None
    run = flow.conn.execute(
        "SELECT partition_id, job_id, workflow_run_id, node, spec FROM runs_daily"
    ).fetchall()
    assert len(run) == 1 and run[0][1:4] == (None, wfr, "a")
    assert run[0][0] == int(nodes["a"]["run_id"][:3], 16)  # the workflow's partition
    assert run[0][4]["target"] == QUEUE


def test_diamond__applied_in_order__d_created_only_after_b_and_c(flow):
    wfr = flow.trigger(flow.create(DIAMOND)["workflow_id"])
    [step] = flow.run_and_apply(wfr, "a")
    assert step.outcome == "applied" and len(step.created) == 2
    assert {k: v["state"] for k, v in flow.nodes(wfr).items()}["b"] == "PENDING"
    flow.run_and_apply(wfr, "b")
    nodes = flow.nodes(wfr)
    assert nodes["d"]["run_id"] is None and nodes["d"]["pending_deps"] == 1
    [step] = flow.run_and_apply(wfr, "c")
    d = flow.nodes(wfr)["d"]
    assert step.created == [d["run_id"]] and d["state"] == "PENDING"
    [step] = flow.run_and_apply(wfr, "d")
    assert step.workflow_state == "SUCCEEDED"
    view = flow.wf.get_run(flow.conn, flow.tenant, wfr)
    assert view["state"] == "SUCCEEDED" and view["finished_at"] is not None
    assert {n["state"] for n in view["nodes"]} == {"SUCCEEDED"}
    assert {k: len(v) for k, v in flow.runs_by_node(wfr).items()} == dict.fromkeys("abcd", 1)


def test_node_records__carry_workflow_run_id_and_node(flow):
    wfr = flow.trigger(flow.create(DIAMOND, priority="high")["workflow_id"])
    flow.run_and_apply(wfr, "a")
    rows = flow.conn.execute(
        "SELECT topic, key, value FROM outbox WHERE topic <> %s ORDER BY id",
        [flow.topics.run_completed],
    ).fetchall()
    records = [default_registry().decode(bytes(v)) for _, _, v in rows]
    assert [name for name, _ in records] == ["RunReady"] * 3
    assert {d["node"] for _, d in records} == {"a", "b", "c"}
    for (topic, key, _), (_, d) in zip(rows, records, strict=True):
        assert topic == flow.topics.runs(flow.tenant["tenant_id"])
        assert bytes(key).decode() == d["run_id"]
        assert d["workflow_run_id"] == wfr and d["job_id"] is None
        assert d["queue"] == "settle" and d["priority"] == "high"


def test_duplicate_completion__applied_twice__decrements_once_creates_once(flow):
    wfr = flow.trigger(flow.create(DIAMOND)["workflow_id"])
    flow.finish(flow.nodes(wfr)["a"]["run_id"])
    [rec] = flow.take_completions()
    first, again = flow.apply([rec, rec])
    assert first.outcome == "applied" and again.outcome == "duplicate"
    nodes = flow.nodes(wfr)
    assert nodes["d"]["pending_deps"] == 2 and nodes["b"]["pending_deps"] == 0
    assert sum(len(v) for v in flow.runs_by_node(wfr).values()) == 3
    # Even with its `processed` row gone, a second application changes nothing:
    # the node is no longer waiting for that run.
    flow.conn.execute("DELETE FROM processed")
    [stale] = flow.apply([rec])
    assert stale.outcome == "stale" and flow.nodes(wfr)["d"]["pending_deps"] == 2


def test_failure_after_retries__fails_workflow_run__skips_below__siblings_unaffected(flow):
    #   a -> b -> d -> f      b fails after its 2 attempts: d, e, f are SKIPPED.
    #   a -> c -> g           c (created with b) and g below it run on.
    #        b -> e
    nodes = [
        node("a"), node("b", "a", retry={"max_attempts": 2, "initial_backoff_ms": 0}),
        node("c", "a"), node("d", "b"), node("e", "b"), node("f", "d", "c"), node("g", "c"),
    ]  # fmt: skip
    wfr = flow.trigger(flow.create(nodes)["workflow_id"])
    flow.run_and_apply(wfr, "a")
    b = flow.nodes(wfr)["b"]["run_id"]
    assert flow.finish(b, "FAILED") == "RETRY_WAIT"
    assert flow.take_completions() == []  # a retry is not a completion
    timer = TimerService(flow.conn.info.dsn, flow.topics, ahead_ms=0)
    timer.leases.tick(flow.conn, now_ms())
    wait_for(lambda: timer.fire_once(flow.conn, now_ms() + 10).runs_created, what="retry fired")
    assert flow.finish(b, "FAILED") == "FAILED"
    [step] = flow.apply(flow.take_completions())
    assert step.workflow_state == "FAILED" and sorted(step.skipped) == ["d", "e", "f"]
    view = flow.wf.get_run(flow.conn, flow.tenant, wfr)
    assert view["state"] == "FAILED" and "node 'b' FAILED" in view["error"]
    states = {n["name"]: (n["state"], n["run_id"]) for n in view["nodes"]}
    assert states["b"][0] == "FAILED"
    assert all(states[x] == ("SKIPPED", None) for x in "def")
    assert states["c"][0] == "PENDING"  # the sibling's run is untouched
    # The sibling branch is independent of b and runs to its end.
    flow.run_and_apply(wfr, "c")
    flow.run_and_apply(wfr, "g")
    final = {name: n["state"] for name, n in flow.nodes(wfr).items()}
    assert final == {"a": "SUCCEEDED", "b": "FAILED", "c": "SUCCEEDED", "d": "SKIPPED",
                     "e": "SKIPPED", "f": "SKIPPED", "g": "SUCCEEDED"}  # fmt: skip
    assert flow.state(wfr) == "FAILED"
    assert set(flow.runs_by_node(wfr)) == {"a", "b", "c", "g"}


def test_timed_out_node__fails_workflow_run_like_a_failure(flow):
    wfr = flow.trigger(
        flow.create([node("a", retry=NO_RETRY, lease_ms=1000), node("b", "a")])["workflow_id"]
    )
    run_id = flow.nodes(wfr)["a"]["run_id"]
    flow.lc.start(flow.conn, flow.tenant["tenant_id"], run_id, "w", now_ms())
    timer = TimerService(flow.conn.info.dsn, flow.topics, ahead_ms=0)
    timer.leases.tick(flow.conn, now_ms())
    timer.fire_once(flow.conn, now_ms() + 5_000)  # the lease expired, no attempt left
    [step] = flow.apply(flow.take_completions())
    assert step.workflow_state == "FAILED" and step.skipped == ["b"]
    assert flow.nodes(wfr)["a"]["state"] == "TIMED_OUT"


def test_cancel__cancels_node_runs_and_waiting_nodes__late_completions_change_nothing(flow):
    wfr = flow.trigger(flow.create(DIAMOND)["workflow_id"])
    flow.run_and_apply(wfr, "a")
    b = flow.nodes(wfr)["b"]["run_id"]
    flow.lc.start(flow.conn, flow.tenant["tenant_id"], b, "w", now_ms())  # b RUNNING, c PENDING
    view = flow.wf.cancel_run(flow.conn, flow.tenant, wfr, now_ms())
    assert view["state"] == "CANCELLED"
    assert {n["name"]: n["state"] for n in view["nodes"]} == {
        "a": "SUCCEEDED", "b": "CANCELLED", "c": "CANCELLED", "d": "CANCELLED",
    }  # fmt: skip
    records = flow.take_completions()
    assert sorted(r["node"] for r in records) == ["b", "c"]
    assert {r["state"] for r in records} == {"CANCELLED"}
    assert {s.outcome for s in flow.apply(records)} == {"stale"}
    assert flow.state(wfr) == "CANCELLED"
    assert "d" not in flow.runs_by_node(wfr)
    with pytest.raises(Conflict):
        flow.wf.cancel_run(flow.conn, flow.tenant, wfr, now_ms())


def test_delete__cancels_running_workflow_runs_and_drops_the_timer(flow):
    wf = flow.create(DIAMOND, schedule={"every_ms": 60_000})
    wfr = flow.trigger(wf["workflow_id"])
    assert (
        flow.conn.execute("SELECT count(*) FROM timers WHERE kind = 'workflow'").fetchone()[0] == 1
    )
    flow.wf.delete(flow.conn, flow.tenant, wf["workflow_id"], now_ms())
    assert flow.state(wfr) == "CANCELLED"
    assert (
        flow.conn.execute("SELECT count(*) FROM timers WHERE kind = 'workflow'").fetchone()[0] == 0
    )
    with pytest.raises(NotFound):
        flow.wf.get(flow.conn, flow.tenant, wf["workflow_id"])


def test_api_views__shaped_for_the_contract(flow):
    wf = flow.create(DIAMOND, schedule={"cron": "0 2 * * *", "timezone": "America/New_York"})
    got = flow.wf.get(flow.conn, flow.tenant, wf["workflow_id"])
    assert got == wf
    assert [n["name"] for n in got["nodes"]] == ["a", "b", "c", "d"]
    assert got["nodes"][3]["depends_on"] == ["b", "c"]
    assert got["nodes"][0]["topic"] == flow.topics.queue(flow.tenant["tenant_id"], "settle")
    assert got["schedule"]["timezone"] == "America/New_York" and got["next_fire_at"]
    page = flow.wf.list(flow.conn, flow.tenant)
    assert [w["workflow_id"] for w in page["items"]] == [wf["workflow_id"]]
    assert "nodes" not in page["items"][0] and page["next_cursor"] is None
    trig = flow.wf.trigger(flow.conn, flow.tenant, wf["workflow_id"], now_ms())
    assert trig["created"] is True
    run = flow.wf.get_run(flow.conn, flow.tenant, trig["workflow_run_id"])
    assert run["state"] == "RUNNING" and run["trigger"] == "manual"
    assert [(n["name"], n["state"], n["run_id"] is not None) for n in run["nodes"]] == [
        ("a", "PENDING", True), ("b", "WAITING", False), ("c", "WAITING", False),
        ("d", "WAITING", False),
    ]  # fmt: skip
    runs = flow.wf.list_runs(flow.conn, flow.tenant, wf["workflow_id"])
    assert [r["workflow_run_id"] for r in runs["items"]] == [trig["workflow_run_id"]]
    other = create_tenant(flow.conn, "other")
    with pytest.raises(NotFound):
        flow.wf.get(flow.conn, other, wf["workflow_id"])
    with pytest.raises(NotFound):
        flow.wf.get_run(flow.conn, other, trig["workflow_run_id"])
    with pytest.raises(NotFound):
        flow.wf.get_run(flow.conn, flow.tenant, "wfr_nope")
    with pytest.raises(ValidationError):
        flow.create([node("a", "a")])


def test_trigger__same_millisecond_twice__one_workflow_run(flow):
    wf = flow.create(DIAMOND)
    at = now_ms()
    first = flow.wf.trigger(flow.conn, flow.tenant, wf["workflow_id"], at)
    again = flow.wf.trigger(flow.conn, flow.tenant, wf["workflow_id"], at)
    assert first["workflow_run_id"] == again["workflow_run_id"]
    assert (first["created"], again["created"]) == (True, False)
    assert flow.conn.execute("SELECT count(*) FROM runs_daily").fetchone()[0] == 1


# -- the workflow's own schedule, through the firing loop -------------------------------


def _timer(flow: Flow) -> TimerService:
    timer = TimerService(flow.conn.info.dsn, flow.topics, ahead_ms=0)
    timer.leases.tick(flow.conn, now_ms())
    return timer


def test_schedule__fires_through_the_timer__deterministic_ids__refire_is_a_no_op(flow):
    wf = flow.create(DIAMOND, schedule={"every_ms": 60_000})
    created = to_ms_iso(wf["created_at"])
    timer = _timer(flow)
    first = created + 60_000
    report = timer.fire_once(flow.conn, first + 5)
    assert report.timers == 1 and report.runs_created == 1  # the root's run
    wfr = workflow_run_id_for_instant(wf["workflow_id"], first)
    run = flow.wf.get_run(flow.conn, flow.tenant, wfr)
    assert run["trigger"] == "schedule" and to_ms_iso(run["scheduled_at"]) == first
    # A duplicate fire of the same instant (the timer rewound) creates nothing.
    flow.conn.execute(
        "UPDATE workflows SET last_instant = last_instant - interval '60 seconds';"
        " UPDATE timers SET due_at = due_at - interval '60 seconds' WHERE kind = 'workflow'"
    )
    assert timer.fire_once(flow.conn, first + 10).runs_created == 0
    assert flow.conn.execute("SELECT count(*) FROM workflow_runs").fetchone()[0] == 1
    timer.fire_once(flow.conn, first + 60_005)
    assert flow.conn.execute("SELECT count(*) FROM workflow_runs").fetchone()[0] == 2
    assert flow.wf.get(flow.conn, flow.tenant, wf["workflow_id"])["fired_count"] == 2


def test_schedule__paused__fires_nothing__resume_catches_up_in_the_window(flow):
    wf = flow.create(
        DIAMOND, schedule={"every_ms": 1_000, "catchup": {"window_ms": 6_000, "policy": "all"}}
    )
    t0 = to_ms_iso(wf["created_at"])
    flow.wf.pause(flow.conn, flow.tenant, wf["workflow_id"], t0)
    timer = _timer(flow)
    assert timer.fire_once(flow.conn, t0 + 20_000).timers == 0
    flow.wf.resume(flow.conn, flow.tenant, wf["workflow_id"], t0 + 20_000)
    timer.fire_once(flow.conn, t0 + 20_000)
    got = flow.wf.get(flow.conn, flow.tenant, wf["workflow_id"])
    # t0+14s .. t0+20s lie in the 6 s window; the 13 instants before it are missed.
    assert got["fired_count"] == 7 and got["missed_count"] == 13
    assert flow.conn.execute("SELECT count(*) FROM workflow_runs").fetchone()[0] == 7


def test_schedule__overlap_skip__no_second_run_while_one_is_running(flow):
    wf = flow.create([node("a")], schedule={"every_ms": 1_000, "overlap": "skip"})
    t0 = to_ms_iso(wf["created_at"])
    timer = _timer(flow)
    timer.fire_once(flow.conn, t0 + 1_000)
    timer.fire_once(flow.conn, t0 + 2_000)
    assert flow.conn.execute("SELECT count(*) FROM workflow_runs").fetchone()[0] == 1
    [wfr] = [r for (r,) in flow.conn.execute("SELECT workflow_run_id FROM workflow_runs")]
    flow.run_and_apply(wfr, "a")
    assert flow.state(wfr) == "SUCCEEDED"
    timer.fire_once(flow.conn, t0 + 3_000)
    assert flow.conn.execute("SELECT count(*) FROM workflow_runs").fetchone()[0] == 2
    assert flow.wf.get(flow.conn, flow.tenant, wf["workflow_id"])["overlap_skipped"] == 1


def test_schedule__overlap_buffer_one__held_instant_starts_when_the_run_ends(flow):
    wf = flow.create([node("a")], schedule={"every_ms": 1_000, "overlap": "buffer_one"})
    t0 = to_ms_iso(wf["created_at"])
    timer = _timer(flow)
    timer.fire_once(flow.conn, t0 + 1_000)
    timer.fire_once(flow.conn, t0 + 2_000)  # held back
    [wfr] = [r for (r,) in flow.conn.execute("SELECT workflow_run_id FROM workflow_runs")]
    [step] = flow.run_and_apply(wfr, "a")
    assert step.workflow_state == "SUCCEEDED"
    held = workflow_run_id_for_instant(wf["workflow_id"], t0 + 2_000)
    assert flow.state(held) == "RUNNING" and flow.nodes(held)["a"]["state"] == "PENDING"


def to_ms_iso(text: str) -> int:
    from datetime import datetime

    return to_ms(datetime.fromisoformat(text.replace("Z", "+00:00")))


# -- the whole path: timer -> relay -> Kafka -> workflow service ------------------------


def test_diamond__end_to_end__each_node_once__d_after_b_and_c__records_on_the_runs_topic(
    database_url, kafka_bootstrap, flow
):
    # Created a minute ago, so that its first instant is due now.
    wf = flow.create(DIAMOND, at=now_ms() - 60_000, schedule={"every_ms": 60_000})
    first = to_ms_iso(wf["created_at"]) + 60_000
    timer = _timer(flow)
    service = WorkflowService(database_url, kafka_bootstrap, flow.topics)
    wfr = workflow_run_id_for_instant(wf["workflow_id"], first)
    with running(Relay(database_url, kafka_bootstrap)), running(service):
        timer.fire_once(flow.conn, first)

        def pending(name: str) -> str | None:
            n = flow.nodes(wfr)[name]
            return n["run_id"] if n["state"] == "PENDING" else None

        flow.finish(wait_for(lambda: pending("a"), what="a's run"))
        flow.finish(wait_for(lambda: pending("b"), what="b's run"))
        processed = "SELECT count(*) FROM processed WHERE consumer = 'workflow'"
        wait_for(lambda: flow.conn.execute(processed).fetchone()[0] == 2, what="b processed")
        assert flow.nodes(wfr)["d"]["run_id"] is None  # c has not succeeded yet
        flow.finish(wait_for(lambda: pending("c"), what="c's run"))
        flow.finish(wait_for(lambda: pending("d"), what="d's run"))
        wait_for(lambda: flow.state(wfr) == "SUCCEEDED", what="the workflow run to succeed")
        records = drain(kafka_bootstrap, flow.topics.runs(flow.tenant["tenant_id"]), want=4)
    assert service.counts == {"applied": 4}
    assert sorted(r[3]["node"] for r in records) == list("abcd")
    assert {r[3]["workflow_run_id"] for r in records} == {wfr}
    times = dict(
        flow.conn.execute(
            "SELECT node, created_at FROM runs_daily WHERE workflow_run_id = %s", [wfr]
        ).fetchall()
    )
    ends = dict(
        flow.conn.execute(
            "SELECT node, finished_at FROM runs_daily WHERE workflow_run_id = %s", [wfr]
        ).fetchall()
    )
    assert times["d"] >= max(ends["b"], ends["c"]) and min(times["b"], times["c"]) >= ends["a"]
    assert {k: len(v) for k, v in flow.runs_by_node(wfr).items()} == dict.fromkeys("abcd", 1)


def test_service__same_completion_twice_through_kafka__and_poison__one_effect_no_stall(
    database_url, kafka_bootstrap, flow
):
    wfr = flow.trigger(flow.create(DIAMOND)["workflow_id"])
    flow.finish(flow.nodes(wfr)["a"]["run_id"])
    [row] = flow.conn.execute(
        "DELETE FROM outbox WHERE topic = %s RETURNING key, value", [flow.topics.run_completed]
    ).fetchall()
    key, value = bytes(row[0]), bytes(row[1])
    # A RunCompleted that decodes but cannot be a node's end (a non-terminal state).
    bad = events.run_completed(
        run_id=key.decode(), tenant_id=flow.tenant["tenant_id"],
        partition_id=0, attempt=1, state="PENDING", finished_ms=now_ms(),
        workflow_run_id=wfr, node="b",
    )  # fmt: skip
    kafka.ensure_topics([flow.topics.run_completed], bootstrap=kafka_bootstrap, principal="relay")
    producer = kafka.producer(kafka_bootstrap, principal="relay")
    for v in (value, b"\xc3\x01garbage", bad, value):
        producer.produce(flow.topics.run_completed, key=key, value=v)  # one partition: in order
    assert producer.flush(30) == 0
    service = WorkflowService(database_url, kafka_bootstrap, flow.topics)
    with running(service):
        wait_for(lambda: sum(service.counts.values()) == 2, what="both copies processed")
        dead = drain(kafka_bootstrap, flow.topics.dead_letter, want=2)
    assert service.counts == {"applied": 1, "duplicate": 1}
    assert service.dead_lettered_total == 2
    assert [d[2] for d in dead] == ["DeadLetter"] * 2
    assert {d[3]["consumer"] for d in dead} == {"workflow"}
    assert {d[3]["value"] for d in dead} == {b"\xc3\x01garbage", bad}
    assert {k: len(v) for k, v in flow.runs_by_node(wfr).items()} == {"a": 1, "b": 1, "c": 1}
    assert flow.nodes(wfr)["d"]["pending_deps"] == 2
    # The same record fed to the service's processing function again: no effect.
    direct = WorkflowService(database_url, kafka_bootstrap, flow.topics)
    try:
        assert direct.process(value).outcome == "duplicate"
    finally:
        direct.close()


def test_store_calls_in_a_tenant_scope__see_and_change_only_that_tenants_workflows(flow):
    """The gateway runs each request in one transaction scoped for row-level
    security (migration 0002, extended to the workflow tables by 0003)."""
    other = Flow(flow.conn, flow.topics, "other")
    theirs = other.create(DIAMOND)
    their_run = other.trigger(theirs["workflow_id"])

    def scoped(tenant: dict, fn):
        with flow.conn.transaction():
            flow.conn.execute("SET LOCAL ROLE cronwheel_gateway")  # the role the scope binds
            flow.conn.execute(
                "SELECT set_config('cronwheel.tenant_id', %s, true)", [tenant["tenant_id"]]
            )
            return fn()

    t, conn, wf = flow.tenant, flow.conn, flow.wf
    mine = scoped(
        t,
        lambda: wf.create(
            conn, t, {"name": "x", "nodes": DIAMOND, "schedule": {"every_ms": 60_000}}, now_ms()
        ),
    )
    run = scoped(t, lambda: wf.trigger(conn, t, mine["workflow_id"], now_ms()))["workflow_run_id"]
    view = scoped(t, lambda: wf.get_run(conn, t, run))
    assert [n["state"] for n in view["nodes"]] == ["PENDING", "WAITING", "WAITING", "WAITING"]
    assert scoped(t, lambda: wf.cancel_run(conn, t, run, now_ms()))["state"] == "CANCELLED"
    assert [w["workflow_id"] for w in scoped(t, lambda: wf.list(conn, t))["items"]] == [
        mine["workflow_id"]
    ]
    # Even a call naming the other tenant's ids finds nothing of theirs in this scope.
    with pytest.raises(NotFound):
        scoped(t, lambda: wf.get(conn, other.tenant, theirs["workflow_id"]))
    with pytest.raises(NotFound):
        scoped(t, lambda: wf.get_run(conn, other.tenant, their_run))
    seen = scoped(t, lambda: conn.execute(
        "SELECT (SELECT count(*) FROM workflows), (SELECT count(*) FROM workflow_runs),"
        " (SELECT count(*) FROM workflow_nodes), (SELECT count(*) FROM workflow_run_nodes),"
        " (SELECT count(*) FROM timers WHERE kind = 'workflow')"
    ).fetchone())  # fmt: skip
    assert seen == (1, 1, 4, 4, 1)
    assert other.state(their_run) == "RUNNING"
