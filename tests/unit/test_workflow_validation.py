"""cronwheel.core.workflows: a bad graph is refused with the field at fault named
(`nodes[3].depends_on`), a cycle is reported as the cycle, and a good one is
kept in the normalised form the store writes."""

from __future__ import annotations

import copy
import random

import pytest

from cronwheel.core.errors import ValidationError
from cronwheel.core.ids import partition_of
from cronwheel.core.jobs import Catchup, Retry
from cronwheel.core.workflows import (
    MAX_NODES,
    descendants,
    find_cycle,
    parse_workflow,
    partition_of_workflow_run,
    workflow_run_id_for_instant,
    workflow_run_id_for_trigger,
)
from services.gateway.problems import status_of  # what the answer would be

NOW = 1_800_000_000_000
Q = {"type": "queue", "queue": "settle"}


def node(name: str, *deps: str, **extra) -> dict:
    return {"name": name, "target": Q, "depends_on": list(deps), **extra}


def diamond() -> dict:
    return {
        "name": "nightly",
        "nodes": [node("a"), node("b", "a"), node("c", "a"), node("d", "b", "c")],
    }


def _node_with(i: int, **fields) -> dict:
    body = copy.deepcopy(diamond())
    body["nodes"][i].update(fields)
    return body


def test_parse_workflow__diamond__keeps_nodes_edges_and_defaults():
    spec = parse_workflow(diamond(), now_ms=NOW)
    assert [n.name for n in spec.nodes] == ["a", "b", "c", "d"]
    assert spec.nodes[3].depends_on == ("b", "c")
    assert spec.children() == {"a": ["b", "c"], "b": ["d"], "c": ["d"], "d": []}
    assert spec.schedule is None and spec.priority == "normal" and spec.overlap == "allow"
    assert spec.catchup == Catchup()
    a = spec.nodes[0]
    assert a.retry == Retry() and a.lease_ms == 30_000 and a.timeout_ms is None
    assert a.run_spec() == {
        "target": Q,
        "payload": "null",
        "retry": {
            "max_attempts": 3,
            "initial_backoff_ms": 1000,
            "max_backoff_ms": 60_000,
            "multiplier": 2.0,
        },
        "timeout_ms": None,
        "lease_ms": 30_000,
    }


def test_parse_workflow__schedule_with_extras__split_like_a_job():
    body = {
        **diamond(),
        "schedule": {
            "cron": "0 2 * * *",
            "timezone": "America/New_York",
            "dst": {"gap": "skip"},
            "jitter_ms": 500,
            "overlap": "skip",
            "catchup": {"window_ms": 60_000, "policy": "latest"},
        },
    }
    spec = parse_workflow(body, now_ms=NOW)
    assert spec.schedule == {
        "cron": "0 2 * * *",
        "timezone": "America/New_York",
        "dst": {"gap": "skip"},
    }
    assert spec.jitter_ms == 500 and spec.overlap == "skip"
    assert spec.catchup == Catchup(window_ms=60_000, policy="latest", max_runs=100)


def test_parse_workflow__node_template_fields__validated_like_a_job():
    body = _node_with(
        1,
        payload={"file": "settlement.csv"},
        retry={"max_attempts": 5, "initial_backoff_ms": 0},
        timeout_ms=60_000,
        lease_ms=5_000,
    )
    b = parse_workflow(body, now_ms=NOW).nodes[1]
    assert b.payload == '{"file":"settlement.csv"}'
    assert b.retry.max_attempts == 5 and b.retry.initial_backoff_ms == 0
    assert (b.timeout_ms, b.lease_ms) == (60_000, 5_000)


BAD = [
    ("body not an object", [], "body"),
    ("unknown top-level field", {**diamond(), "edges": []}, "edges"),
    ("no name", {"nodes": diamond()["nodes"]}, "name"),
    ("no nodes", {"name": "x"}, "nodes"),
    ("empty nodes", {"name": "x", "nodes": []}, "nodes"),
    ("nodes not a list", {"name": "x", "nodes": {"a": {}}}, "nodes"),
    ("node not an object", {"name": "x", "nodes": [node("a"), "b"]}, "nodes[1]"),
    ("node name charset", _node_with(2, name="c d"), "nodes[2].name"),
    ("node name too long", _node_with(0, name="a" * 101), "nodes[0].name"),
    ("node name missing", {"name": "x", "nodes": [{"target": Q}]}, "nodes[0].name"),
    ("duplicate name", _node_with(2, name="b"), "nodes[2].name"),
    ("unknown dependency", _node_with(3, depends_on=["b", "e"]), "nodes[3].depends_on"),
    ("depends_on not a list", _node_with(1, depends_on="a"), "nodes[1].depends_on"),
    ("dependency listed twice", _node_with(3, depends_on=["b", "b"]), "nodes[3].depends_on"),
    ("self dependency", _node_with(0, depends_on=["a"]), "nodes[0].depends_on"),
    ("unknown node field", _node_with(1, when="success"), "nodes[1].when"),
    ("no target", {"name": "x", "nodes": [{"name": "a"}]}, "nodes[0].target"),
    ("bad queue", _node_with(1, target={"type": "queue", "queue": "a b"}), "nodes[1].target.queue"),
    ("bad target type", _node_with(1, target={"type": "lambda"}), "nodes[1].target.type"),
    ("bad webhook url", _node_with(2, target={"type": "webhook", "url": "ftp://x"}), "nodes[2].target.url"),
    ("retry attempts", _node_with(3, retry={"max_attempts": 0}), "nodes[3].retry.max_attempts"),
    ("retry field", _node_with(3, retry={"tries": 2}), "nodes[3].retry.tries"),
    ("timeout too small", _node_with(1, timeout_ms=5), "nodes[1].timeout_ms"),
    ("lease a string", _node_with(1, lease_ms="30s"), "nodes[1].lease_ms"),
    ("bad cron", {**diamond(), "schedule": {"cron": "61 * * * *"}}, "schedule.cron"),
    ("bad zone", {**diamond(), "schedule": {"cron": "0 2 * * *", "timezone": "Mars/X"}}, "schedule.timezone"),
    ("bad overlap", {**diamond(), "schedule": {"every_ms": 1000, "overlap": "queue"}}, "schedule.overlap"),
    ("bad catchup", {**diamond(), "schedule": {"every_ms": 1000, "catchup": {"policy": "x"}}}, "schedule.catchup.policy"),
    ("schedule not an object", {**diamond(), "schedule": "daily"}, "schedule"),
    ("bad priority", {**diamond(), "priority": "urgent"}, "priority"),
]  # fmt: skip


@pytest.mark.parametrize(("why", "body", "field"), BAD, ids=[b[0] for b in BAD])
def test_parse_workflow__bad_input__names_the_field(why, body, field):
    with pytest.raises(ValidationError) as e:
        parse_workflow(body, now_ms=NOW)
    assert e.value.field == field, why
    assert 400 <= status_of(e.value) < 500


def test_parse_workflow__cycle__names_the_cycle_in_run_order():
    body = {
        "name": "loop",
        "nodes": [node("a"), node("b", "a", "d"), node("c", "b"), node("d", "c"), node("e", "d")],
    }
    with pytest.raises(ValidationError) as e:
        parse_workflow(body, now_ms=NOW)
    assert e.value.code == "CYCLE"
    cycle = e.value.message.removeprefix("forms a cycle: ").split(" -> ")
    assert cycle[0] == cycle[-1] and set(cycle) == {"b", "c", "d"}
    # Each step runs before the next: the next depends on it.
    deps = {n["name"]: n["depends_on"] for n in body["nodes"]}
    assert all(x in deps[y] for x, y in zip(cycle, cycle[1:], strict=False))
    # The field is the node whose depends_on closes the loop.
    names = [n["name"] for n in body["nodes"]]
    assert e.value.field == f"nodes[{names.index(cycle[0])}].depends_on"
    assert cycle[-2] in deps[cycle[0]]


def test_parse_workflow__more_than_500_nodes__refused():
    nodes = [node(f"n{i}") for i in range(MAX_NODES + 1)]
    with pytest.raises(ValidationError) as e:
        parse_workflow({"name": "wide", "nodes": nodes}, now_ms=NOW)
    assert e.value.field == "nodes" and e.value.code == "TOO_MANY_NODES"
    assert (
        len(parse_workflow({"name": "wide", "nodes": nodes[:MAX_NODES]}, now_ms=NOW).nodes) == 500
    )


def test_parse_workflow__priority_not_entitled__403():
    with pytest.raises(ValidationError) as e:
        parse_workflow(
            {**diamond(), "priority": "critical"}, now_ms=NOW, allowed_priorities=("normal",)
        )
    assert (e.value.field, status_of(e.value), e.value.code) == (
        "priority",
        403,
        "PRIORITY_NOT_ALLOWED",
    )


def test_parse_workflow__node_payload_too_large__413_names_the_node():
    with pytest.raises(ValidationError) as e:
        parse_workflow(_node_with(2, payload="x" * 300_000), now_ms=NOW)
    assert (e.value.field, status_of(e.value)) == ("nodes[2].payload", 413)


def test_parse_workflow__graph_over_1_mib__413():
    nodes = [node(f"n{i}", payload="x" * 200_000) for i in range(6)]
    with pytest.raises(ValidationError) as e:
        parse_workflow({"name": "big", "nodes": nodes}, now_ms=NOW)
    assert (e.value.field, status_of(e.value)) == ("nodes", 413)


def test_find_cycle__random_dags__none_and_a_back_edge__found():
    rng = random.Random(7)
    for _ in range(200):
        n = rng.randint(1, 12)
        deps = {f"n{i}": [f"n{j}" for j in range(i) if rng.random() < 0.3] for i in range(n)}
        assert find_cycle(deps) is None
        if n >= 2:
            lo, hi = sorted(rng.sample(range(n), 2))
            deps[f"n{lo}"].append(f"n{hi}")  # lo now waits on hi: a cycle iff hi reaches lo
            cycle = find_cycle(deps)
            reaches = f"n{lo}" in descendants(_children(deps), f"n{lo}")
            assert (cycle is not None) == reaches


def _children(deps: dict[str, list[str]]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {k: [] for k in deps}
    for child, parents in deps.items():
        for p in parents:
            out[p].append(child)
    return out


def test_descendants__diamond__everything_below_not_itself():
    children = parse_workflow(diamond(), now_ms=NOW).children()
    assert descendants(children, "a") == {"b", "c", "d"}
    assert descendants(children, "b") == {"d"}
    assert descendants(children, "d") == set()


def test_workflow_run_ids__deterministic_namespaced_and_in_the_workflow_partition():
    wf = "wf_0123456789abcdef0123"
    a = workflow_run_id_for_instant(wf, NOW)
    assert a == workflow_run_id_for_instant(wf, NOW)
    assert a != workflow_run_id_for_instant(wf, NOW + 1)
    assert a != workflow_run_id_for_trigger(wf, NOW)
    assert len(a) == 32 and a.startswith("wfr_")
    assert partition_of_workflow_run(a) == partition_of(wf)
    assert partition_of_workflow_run(workflow_run_id_for_trigger(wf, NOW)) == partition_of(wf)


@pytest.mark.parametrize(
    "bad",
    ["", "wfr_", "wfr_zzz" + "0" * 25, "run_" + "0" * 28, "wfr_fff" + "0" * 25, "wfr_" + "0" * 29],
)
def test_partition_of_workflow_run__not_an_id__value_error(bad):
    with pytest.raises(ValueError):
        partition_of_workflow_run(bad)
