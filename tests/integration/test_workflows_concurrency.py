"""The completion step under concurrency: copies of one RunCompleted, and the
completions of a join's parents, applied at the same moment from several
threads (each with its own connection, as several workflow service instances
would during a rebalance). Each parent's success counts once and each child is
created once."""

from __future__ import annotations

import threading
from collections import Counter

import psycopg
import pytest

from cronwheel.core.clock import now_ms
from cronwheel.kafka import Topics
from tests.integration.test_workflows import DIAMOND, Flow, node

pytestmark = pytest.mark.integration

ROUNDS = 8


@pytest.fixture
def flow(database_url, topic_prefix):
    with psycopg.connect(database_url, autocommit=True) as c:
        yield Flow(c, Topics(topic_prefix))


def apply_together(database_url: str, flow: Flow, records: list[dict]) -> list[str]:
    """Each record applied by its own thread and connection, released at once."""
    conns = [psycopg.connect(database_url, autocommit=True) for _ in records]
    gate = threading.Barrier(len(records))
    outcomes: list[str] = []
    errors: list[BaseException] = []

    def apply(conn, record):
        try:
            gate.wait(10)
            outcomes.append(flow.wf.complete_node(conn, record, now_ms()).outcome)
        except BaseException as e:  # reported in the test's thread
            errors.append(e)

    threads = [
        threading.Thread(target=apply, args=(c, r)) for c, r in zip(conns, records, strict=True)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    for c in conns:
        c.close()
    if errors:
        raise errors[0]
    return outcomes


def test_same_completion_from_two_threads__decrements_once__children_created_once(
    database_url, flow
):
    wf = flow.create(DIAMOND)
    for _ in range(ROUNDS):
        wfr = flow.trigger(wf["workflow_id"])
        flow.finish(flow.nodes(wfr)["a"]["run_id"])
        [rec] = flow.take_completions()
        outcomes = apply_together(database_url, flow, [rec, rec])
        assert Counter(outcomes) == {"applied": 1, "duplicate": 1}
        nodes = flow.nodes(wfr)
        assert nodes["b"]["state"] == nodes["c"]["state"] == "PENDING"
        assert nodes["d"]["pending_deps"] == 2
        assert {k: len(v) for k, v in flow.runs_by_node(wfr).items()} == {"a": 1, "b": 1, "c": 1}
    outbox = flow.conn.execute("SELECT key, count(*) FROM outbox GROUP BY key").fetchall()
    assert {n for _, n in outbox} == {1}  # each run announced once


def test_join_parents_and_their_duplicates_from_four_threads__child_created_once(
    database_url, flow
):
    wf = flow.create([node("p1"), node("p2"), node("join", "p1", "p2")])
    for _ in range(ROUNDS):
        wfr = flow.trigger(wf["workflow_id"])
        nodes = flow.nodes(wfr)
        flow.finish(nodes["p1"]["run_id"])
        flow.finish(nodes["p2"]["run_id"])
        recs = flow.take_completions()
        assert len(recs) == 2
        outcomes = apply_together(database_url, flow, recs + recs)
        assert Counter(outcomes) == {"applied": 2, "duplicate": 2}
        join = flow.nodes(wfr)["join"]
        assert join["state"] == "PENDING" and join["pending_deps"] == 0
        assert len(flow.runs_by_node(wfr)["join"]) == 1
        ready = flow.conn.execute(
            "SELECT count(*) FROM outbox WHERE key = %s", [join["run_id"].encode()]
        ).fetchone()[0]
        assert ready == 1
