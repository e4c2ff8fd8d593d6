"""A property over random DAGs (up to 12 nodes) and random interleavings of
worker completions, RunCompleted deliveries and duplicate deliveries, against
the real database through the store's completion step (no broker):

- every node runs at most once, and only after all its parents succeeded;
- pending_deps never goes below zero and always counts the parents not yet
  SUCCEEDED;
- at the end every node is SUCCEEDED, FAILED (it was made to fail) or SKIPPED
  (below a failure), and the workflow run is SUCCEEDED exactly when none failed.
"""

from __future__ import annotations

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cronwheel.kafka import Topics
from tests.integration.test_workflows import Flow

pytestmark = pytest.mark.integration

QUEUE = {"type": "queue", "queue": "q"}


@pytest.fixture
def flow(database_url, topic_prefix):
    with psycopg.connect(database_url, autocommit=True) as c:
        yield Flow(c, Topics(topic_prefix))


@st.composite
def dags(draw) -> list[list[int]]:
    """parents[i]: indices of node i's parents, all below i (so acyclic)."""
    n = draw(st.integers(1, 12))
    return [sorted(draw(st.sets(st.integers(0, i - 1), max_size=3))) if i else [] for i in range(n)]


def check_invariants(flow: Flow, wfr: str, parents: list[list[int]]) -> dict[str, tuple]:
    rows = flow.conn.execute(
        "SELECT node, state, pending_deps, run_id FROM workflow_run_nodes"
        " WHERE workflow_run_id = %s",
        [wfr],
    ).fetchall()
    nodes = {r[0]: r[1:] for r in rows}
    runs = flow.runs_by_node(wfr)
    assert all(len(v) == 1 for v in runs.values()), f"a node ran twice: {runs}"
    for i, ps in enumerate(parents):
        state, pending, run_id = nodes[f"n{i}"]
        assert pending >= 0
        not_done = sum(1 for p in ps if nodes[f"n{p}"][0] != "SUCCEEDED")
        if state == "WAITING":
            assert pending == not_done, f"n{i}: pending_deps {pending}, parents left {not_done}"
        if run_id is not None or f"n{i}" in runs:
            assert not_done == 0 and pending == 0, f"n{i} ran before all its parents succeeded"
            assert runs[f"n{i}"] == [run_id]
    return nodes


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(parents=dags(), data=st.data())
def test_random_dags__random_completions_and_duplicates__invariants_hold(flow, parents, data):
    n = len(parents)
    failing = data.draw(st.sets(st.integers(0, n - 1), max_size=2), label="failing")
    wf = flow.create(
        [
            {
                "name": f"n{i}",
                "target": QUEUE,
                "retry": {"max_attempts": 1},
                "depends_on": [f"n{p}" for p in ps],
            }
            for i, ps in enumerate(parents)
        ]
    )
    wfr = flow.trigger(wf["workflow_id"])
    inbox: list[dict] = []  # RunCompleted not yet delivered
    delivered: list[dict] = []
    while True:
        nodes = check_invariants(flow, wfr, parents)
        runnable = sorted(
            name
            for name, (state, _, run_id) in nodes.items()
            if state == "CREATED" and flow.nodes(wfr)[name]["state"] == "PENDING"
        )
        moves = [("finish", x) for x in runnable] + [("deliver", i) for i in range(len(inbox))]
        moves += [("duplicate", i) for i in range(len(delivered))]
        if not runnable and not inbox:
            break
        kind, arg = data.draw(st.sampled_from(moves), label="move")
        if kind == "finish":
            run_id = nodes[arg][2]
            outcome = "FAILED" if int(arg[1:]) in failing else "SUCCEEDED"
            flow.finish(run_id, outcome, retryable=False)
            inbox.extend(flow.take_completions())
        elif kind == "deliver":
            record = inbox.pop(arg)
            [step] = flow.apply([record])
            assert step.outcome == "applied"
            delivered.append(record)
        else:
            [step] = flow.apply([delivered[arg]])
            assert step.outcome == "duplicate"
    # The end state follows from the graph and the failing set alone.
    final = check_invariants(flow, wfr, parents)
    expect: dict[str, str] = {}
    for i, ps in enumerate(parents):
        if all(expect[f"n{p}"] == "SUCCEEDED" for p in ps):
            expect[f"n{i}"] = "FAILED" if i in failing else "SUCCEEDED"
        else:
            expect[f"n{i}"] = "SKIPPED"
    assert {k: v[0] for k, v in final.items()} == expect
    want = "FAILED" if "FAILED" in expect.values() else "SUCCEEDED"
    assert flow.state(wfr) == want
