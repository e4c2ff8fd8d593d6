"""A workflow's definition: a static DAG of nodes, each a job template (target,
payload, retry, timeout), joined by success-only edges, with an optional
schedule of its own.

The graph is fixed at creation and checked whole here (unique names, known
dependencies, no cycle, at most MAX_NODES), because the store trusts it: a
node's run is created when its last parent succeeds, so a cycle or a dangling
edge would leave a workflow run waiting forever. Branching, loops and dynamic
fan-out are deliberately absent (docs/workflows.md says why).

Workflow run ids are deterministic, like run ids: hash(workflow, instant) for a
scheduled run and hash(workflow, trigger time) in a namespace of its own for a
manual trigger, with the workflow's partition in the id so that a bare
workflow_run_id routes to its partition.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from cronwheel.core.errors import ValidationError
from cronwheel.core.ids import PARTITIONS, partition_of
from cronwheel.core.jobs import (
    OVERLAP,
    QUEUE_NAME,
    SCHEDULE_EXTRAS,
    Catchup,
    Retry,
    _int,
    _obj,
    parse_catchup,
    parse_retry,
    parse_target,
    payload_text,
)
from cronwheel.core.runs import PRIORITIES
from cronwheel.core.schedule import ScheduleError, parse_schedule

MAX_NODES = 500
# The whole graph as stored (every node's target, payload, retry...). One node may
# carry a payload as large as a job's (256 KiB); 500 of them would not fit a row
# that every workflow run reads.
MAX_GRAPH_BYTES = 1024 * 1024
WORKFLOW_RUN_PREFIX = "wfr_"
_WFR_ID = re.compile(r"wfr_[0-9a-f]{28}")


@dataclass(frozen=True)
class NodeSpec:
    name: str
    target: dict
    payload: str = "null"  # JSON text, kept as the user sent it
    retry: Retry = field(default_factory=Retry)
    timeout_ms: int | None = None
    lease_ms: int = 30_000
    depends_on: tuple[str, ...] = ()

    def run_spec(self) -> dict:
        """The snapshot each of this node's runs keeps (as store/firing.run_spec)."""
        return {
            "target": self.target,
            "payload": self.payload,
            "retry": asdict(self.retry),
            "timeout_ms": self.timeout_ms,
            "lease_ms": self.lease_ms,
        }


@dataclass(frozen=True)
class WorkflowSpec:
    name: str
    nodes: tuple[NodeSpec, ...]
    schedule: dict | None = None  # cron/timezone/dst, every_ms or at; None: trigger only
    priority: str = "normal"
    overlap: str = "allow"
    catchup: Catchup = field(default_factory=Catchup)
    jitter_ms: int = 0

    def children(self) -> dict[str, list[str]]:
        """Each node's direct dependants, in definition order."""
        out: dict[str, list[str]] = {n.name: [] for n in self.nodes}
        for n in self.nodes:
            for parent in n.depends_on:
                out[parent].append(n.name)
        return out


# -- the graph ---------------------------------------------------------------


def find_cycle(depends_on: Mapping[str, Sequence[str]]) -> list[str] | None:
    """A cycle in run order (each node runs before the next), closed by repeating
    its first node, e.g. ['a', 'b', 'a']; None for an acyclic graph. Every name
    in a depends_on list must be a key."""
    WHITE, GREY, BLACK = 0, 1, 2
    colour = dict.fromkeys(depends_on, WHITE)
    for start in depends_on:
        if colour[start] != WHITE:
            continue
        # Iterative DFS along depends_on: the stack holds (node, its next dependency index).
        stack: list[tuple[str, int]] = [(start, 0)]
        colour[start] = GREY
        while stack:
            node, i = stack[-1]
            deps = depends_on[node]
            if i == len(deps):
                colour[node] = BLACK
                stack.pop()
                continue
            stack[-1] = (node, i + 1)
            dep = deps[i]
            if colour[dep] == GREY:
                path = [n for n, _ in stack]
                loop = path[path.index(dep) :]  # dep depends (transitively) on itself
                # Along the stack each node depends on the next; run order is reversed.
                order = list(reversed(loop))
                return [*order, order[0]]
            if colour[dep] == WHITE:
                colour[dep] = GREY
                stack.append((dep, 0))
    return None


def descendants(children: Mapping[str, Sequence[str]], node: str) -> set[str]:
    """Every node below `node` (reachable along success edges), not itself."""
    seen: set[str] = set()
    todo = list(children.get(node, ()))
    while todo:
        n = todo.pop()
        if n not in seen:
            seen.add(n)
            todo.extend(children.get(n, ()))
    return seen


# -- validation --------------------------------------------------------------


def _parse_node(raw: Any, i: int) -> NodeSpec:
    f = f"nodes[{i}]"
    d = _obj(
        raw,
        f,
        {"name", "target", "payload", "retry", "timeout_ms", "lease_ms", "depends_on"},
    )
    name = d.get("name")
    if not isinstance(name, str) or not QUEUE_NAME.match(name):
        raise ValidationError(f"{f}.name", "must be 1-100 of A-Z a-z 0-9 _ -")
    deps = d.get("depends_on", [])
    if not isinstance(deps, list) or not all(isinstance(x, str) for x in deps):
        raise ValidationError(f"{f}.depends_on", "must be a list of node names")
    if len(set(deps)) != len(deps):
        dup = next(x for x in deps if deps.count(x) > 1)
        raise ValidationError(f"{f}.depends_on", f"lists {dup!r} more than once")
    try:
        payload = payload_text(d.get("payload"), "payload" in d)
    except ValidationError as e:
        raise ValidationError(f"{f}.payload", e.message, e.code, e.status) from e
    timeout = d.get("timeout_ms")
    return NodeSpec(
        name=name,
        target=parse_target(d.get("target"), f"{f}.target"),
        payload=payload,
        retry=parse_retry(d.get("retry"), f"{f}.retry"),
        timeout_ms=None
        if timeout is None
        else _int(timeout, f"{f}.timeout_ms", 100, 7 * 86_400_000),
        lease_ms=_int(d.get("lease_ms", 30_000), f"{f}.lease_ms", 1000, 3_600_000),
        depends_on=tuple(deps),
    )


def _parse_nodes(raw: Any) -> tuple[NodeSpec, ...]:
    if not isinstance(raw, list) or not raw:
        raise ValidationError("nodes", "must be a non-empty list")
    if len(raw) > MAX_NODES:
        raise ValidationError(
            "nodes",
            f"has {len(raw)} nodes; a workflow has at most {MAX_NODES}",
            code="TOO_MANY_NODES",
        )
    nodes: list[NodeSpec] = []
    index: dict[str, int] = {}
    for i, item in enumerate(raw):
        node = _parse_node(item, i)
        if node.name in index:
            raise ValidationError(
                f"nodes[{i}].name",
                f"duplicate node name {node.name!r} (also nodes[{index[node.name]}])",
                code="DUPLICATE_NODE",
            )
        index[node.name] = i
        nodes.append(node)
    for i, node in enumerate(nodes):
        for dep in node.depends_on:
            if dep not in index:
                raise ValidationError(
                    f"nodes[{i}].depends_on", f"unknown node {dep!r}", code="UNKNOWN_NODE"
                )
    cycle = find_cycle({n.name: n.depends_on for n in nodes})
    if cycle:
        # Name the node whose depends_on closes the loop: the cycle's first node
        # depends on its last step before it.
        raise ValidationError(
            f"nodes[{index[cycle[0]]}].depends_on",
            "forms a cycle: " + " -> ".join(cycle),
            code="CYCLE",
        )
    size = len(json.dumps([n.run_spec() for n in nodes]).encode())
    if size > MAX_GRAPH_BYTES:
        raise ValidationError(
            "nodes",
            f"the nodes take {size} bytes; at most {MAX_GRAPH_BYTES} (1 MiB) in all",
            code="PAYLOAD_TOO_LARGE",
            status=413,
        )
    return tuple(nodes)


def _parse_workflow_schedule(raw: Any, now_ms: int) -> tuple[dict | None, str, Catchup, int]:
    """(schedule proper, overlap, catchup, jitter_ms), as parse_job reads a job's."""
    if raw is None:
        return None, "allow", Catchup(), 0
    if not isinstance(raw, dict):
        raise ValidationError("schedule", "must be an object")
    schedule = {k: v for k, v in raw.items() if k not in SCHEDULE_EXTRAS}
    try:
        parse_schedule(schedule, anchor_ms=now_ms)
    except ScheduleError as e:
        raise ValidationError(e.field, e.message) from e
    overlap = raw.get("overlap", "allow")
    if overlap not in OVERLAP:
        raise ValidationError("schedule.overlap", "must be allow, skip or buffer_one")
    return (
        schedule,
        overlap,
        parse_catchup(raw.get("catchup")),
        _int(raw.get("jitter_ms", 0), "schedule.jitter_ms", 0, 3_600_000),
    )


def parse_workflow(
    body: Any, *, now_ms: int, allowed_priorities: tuple[str, ...] = PRIORITIES
) -> WorkflowSpec:
    """Validate a workflow as the API receives it; raises ValidationError naming
    the field, e.g. `nodes[3].depends_on`."""
    d = _obj(body, "body", {"name", "schedule", "nodes", "priority"})
    name = d.get("name")
    if not isinstance(name, str) or not 1 <= len(name) <= 200:
        raise ValidationError("name", "must be a string of 1-200 characters")
    priority = d.get("priority", "normal")
    if priority not in PRIORITIES:
        raise ValidationError("priority", "must be critical, high, normal or low")
    if priority not in allowed_priorities:
        raise ValidationError(
            "priority",
            f"this tenant may not use class {priority!r}",
            code="PRIORITY_NOT_ALLOWED",
            status=403,
        )
    schedule, overlap, catchup, jitter_ms = _parse_workflow_schedule(d.get("schedule"), now_ms)
    return WorkflowSpec(
        name=name,
        nodes=_parse_nodes(d.get("nodes")),
        schedule=schedule,
        priority=priority,
        overlap=overlap,
        catchup=catchup,
        jitter_ms=jitter_ms,
    )


# -- workflow run ids ---------------------------------------------------------


def _workflow_run_id(workflow_id: str, *parts: str) -> str:
    digest = hashlib.sha256("\x1f".join(parts).encode()).hexdigest()
    return f"{WORKFLOW_RUN_PREFIX}{partition_of(workflow_id):03x}{digest[:25]}"


def workflow_run_id_for_instant(workflow_id: str, instant_ms: int) -> str:
    """The one workflow run of `workflow_id` at a scheduled instant (UTC ms)."""
    return _workflow_run_id(workflow_id, "wf", workflow_id, str(instant_ms))


def workflow_run_id_for_trigger(workflow_id: str, at_ms: int) -> str:
    """A manual trigger's workflow run: its own namespace, never an instant's id."""
    return _workflow_run_id(workflow_id, "wf-trigger", workflow_id, str(at_ms))


def partition_of_workflow_run(workflow_run_id: str) -> int:
    """The partition encoded in a workflow run id; ValueError when it is not one."""
    if not isinstance(workflow_run_id, str) or not _WFR_ID.fullmatch(workflow_run_id):
        raise ValueError("not a workflow run id")
    p = int(workflow_run_id[len(WORKFLOW_RUN_PREFIX) :][:3], 16)
    if p >= PARTITIONS:
        raise ValueError("not a workflow run id")
    return p
