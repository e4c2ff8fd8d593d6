"""Workflows: the one place that writes workflows, workflow runs and their nodes.

Runs create runs. A workflow run starts (its timer fired, or a trigger) by
inserting the workflow run, one row per node with `pending_deps` = its parent
count, and a PENDING run for every node with no parents. From then on the run
lifecycle does the work, and each RunCompleted of a node goes through
`complete_node`, one transaction that checks the record against the run in the
database (a record that disagrees is refused and changes nothing), records the
message as processed (a duplicate stops there), sets the node's state and
either releases its children
(a child whose counter reaches zero gets its run and RunReady outbox row) or, for
a failure after retries, fails the workflow run and marks every node below it
SKIPPED. Node runs live in the workflow's partition, so every step is a
single-partition transaction.

API methods take (conn, tenant dict, ..., now_ms) and return JSON-ready dicts, so
an HTTP route is one call.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from cronwheel.core.clock import iso, to_dt, to_ms
from cronwheel.core.errors import Conflict, NotFound, ValidationError
from cronwheel.core.events import OutboxRow
from cronwheel.core.firing import next_due, plan_fire
from cronwheel.core.ids import new_id, partition_of, partition_of_run, run_id_for_node
from cronwheel.core.jobs import Catchup, shown_target
from cronwheel.core.runs import RunState
from cronwheel.core.schedule import parse_schedule
from cronwheel.core.workflows import (
    WorkflowSpec,
    parse_workflow,
    partition_of_workflow_run,
    workflow_run_id_for_instant,
    workflow_run_id_for_trigger,
)
from cronwheel.kafka import Topics
from cronwheel.store import outbox, timers
from cronwheel.store.lifecycle import Lifecycle
from cronwheel.store.new_runs import ready_row
from cronwheel.store.run_days import one_in_days, plausible
from cronwheel.store.sql_loader import queries
from cronwheel.store.timers import FireReport, ScheduleCache, Timer
from cronwheel.store.timers import workflow_timer_id as workflow_timer_id  # where it was

Q = queries("workflows")
CONSUMER = "workflow"  # its rows in `processed`: one per node run's RunCompleted
FAILURES = (RunState.FAILED, RunState.TIMED_OUT, RunState.CANCELLED)
# Why a RunCompleted of a node was refused, the first of its claims found false
# (begin_step in workflows.sql): no such run; the run (or the workflow run) is
# another tenant's; the run is not that workflow run's node (or no such workflow
# run); the run is at another attempt; the run is not in the state claimed.
REFUSALS = ("no_run", "tenant", "workflow_run", "attempt", "state")


@dataclass
class NodeStep:
    """What one RunCompleted did to its workflow run (for metrics and tests).

    outcome: `applied`; `duplicate` (already processed); `stale` (the node was no
    longer waiting for this run, e.g. the workflow run was cancelled);
    `refused` (the database does not agree with the record: `reason` is one of
    REFUSALS); `not_a_node` (no workflow_run_id)."""

    outcome: str
    workflow_run_id: str | None = None
    node: str | None = None
    created: list[str] = field(default_factory=list)  # run ids of released children
    skipped: list[str] = field(default_factory=list)  # nodes marked SKIPPED
    workflow_state: str | None = None
    reason: str | None = None  # why a record was refused


@dataclass(frozen=True)
class _RunCtx:
    """A workflow run as its steps need it."""

    p: int
    workflow_run_id: str
    workflow_id: str
    tenant_id: str
    priority: str
    scheduled_ms: int
    covers: list[int] | None


def _wf_partition(workflow_id: str) -> int:
    if not isinstance(workflow_id, str):
        raise NotFound("workflow")
    return partition_of(workflow_id)


def _wfr_partition(workflow_run_id: str) -> int:
    try:
        return partition_of_workflow_run(workflow_run_id)
    except ValueError as e:
        raise NotFound("workflow run") from e


class Workflows:
    def __init__(self, topics: Topics, cache: ScheduleCache | None = None):
        self.topics = topics
        self.lifecycle = Lifecycle(topics)
        self.cache = cache or ScheduleCache()

    # -- views ---------------------------------------------------------------
    def _node_view(self, tenant_id: str, name: str, spec: dict, depends_on: list[str]) -> dict:
        out = {
            "name": name,
            "target": shown_target(spec["target"]),
            "payload": json.loads(spec["payload"]),
            "retry": spec["retry"],
            "timeout_ms": spec["timeout_ms"],
            "lease_ms": spec["lease_ms"],
            "depends_on": list(depends_on),
        }
        if spec["target"]["type"] == "queue":
            out["topic"] = self.topics.queue(tenant_id, spec["target"]["queue"])
        return out

    def _view(self, row: dict, nodes: list[tuple] | None) -> dict:
        schedule = None
        if row["schedule"] is not None:
            schedule = dict(row["schedule"])
            schedule.update(
                jitter_ms=row["jitter_ms"], catchup=row["catchup"], overlap=row["overlap"]
            )
        out = {
            "workflow_id": row["workflow_id"],
            "tenant_id": row["tenant_id"],
            "name": row["name"],
            "priority": row["priority"],
            "schedule": schedule,
            "node_count": row["node_count"],
            "paused": row["paused"],
            "next_fire_at": iso(to_ms(row["next_due_at"])) if row.get("next_due_at") else None,
            "last_instant": iso(to_ms(row["last_instant"])) if row["schedule"] else None,
            "fired_count": row["fired_count"],
            "missed_count": row["missed_count"],
            "overlap_skipped": row["overlap_skipped"],
            "created_at": iso(to_ms(row["created_at"])),
            "updated_at": iso(to_ms(row["updated_at"])),
        }
        if nodes is not None:
            out["nodes"] = [self._node_view(row["tenant_id"], *n) for n in nodes]
        return out

    def _load(self, conn, tenant_id: str, workflow_id: str, lock: bool = False) -> dict:
        if lock:  # the timer first, as the firing loop (workflows.sql lock_workflow_timer)
            conn.execute(
                Q["lock_workflow_timer"], {"p": _wf_partition(workflow_id), "wf": workflow_id}
            )
        with conn.cursor(row_factory=dict_row) as cur:
            row = cur.execute(
                Q["lock_workflow" if lock else "get_workflow"],
                {"p": _wf_partition(workflow_id), "wf": workflow_id, "tenant_id": tenant_id},
            ).fetchone()
        if row is None:
            raise NotFound("workflow")
        return row

    def _nodes(self, conn, p: int, workflow_id: str) -> list[tuple]:
        return conn.execute(Q["get_nodes"], {"p": p, "wf": workflow_id}).fetchall()

    # -- workflows -------------------------------------------------------------
    def create(self, conn, tenant: dict, body: Any, now: int) -> dict:
        """POST /v1/workflows -> 201 with the workflow (as `get`)."""
        spec = parse_workflow(
            body, now_ms=now, allowed_priorities=tuple(tenant["priority_classes"])
        )
        workflow_id = new_id("wf")
        p = partition_of(workflow_id)
        children = spec.children()
        with conn.transaction():
            conn.execute(
                Q["insert_workflow"],
                {
                    "p": p, "wf": workflow_id, "tenant_id": tenant["tenant_id"],
                    "name": spec.name, "priority": spec.priority, "node_count": len(spec.nodes),
                    "schedule": None if spec.schedule is None else Jsonb(spec.schedule),
                    "overlap": spec.overlap, "catchup": Jsonb(asdict(spec.catchup)),
                    "jitter_ms": spec.jitter_ms, "now": to_dt(now),
                },
            )  # fmt: skip
            conn.execute(
                Q["insert_nodes"],
                {
                    "p": p,
                    "wf": workflow_id,
                    "node": [n.name for n in spec.nodes],
                    "idx": list(range(len(spec.nodes))),
                    "spec": [json.dumps(n.run_spec()) for n in spec.nodes],
                    "deps": [json.dumps(list(n.depends_on)) for n in spec.nodes],
                    "kids": [json.dumps(children[n.name]) for n in spec.nodes],
                },
            )
            self._arm_timer(conn, workflow_id, p, spec, now, now)
        return self.get(conn, tenant, workflow_id)

    def _arm_timer(
        self, conn, workflow_id: str, p: int, spec: WorkflowSpec | dict, anchor: int, after: int
    ) -> None:
        """Point the workflow's timer at its next instant after `after` (or drop it)."""
        if isinstance(spec, WorkflowSpec):
            schedule, jitter, priority = spec.schedule, spec.jitter_ms, spec.priority
        else:
            schedule, jitter, priority = spec["schedule"], spec["jitter_ms"], spec["priority"]
        nxt = None
        if schedule is not None:
            nxt = next_due(parse_schedule(schedule, anchor_ms=anchor), workflow_id, after, jitter)
        timers.set_timer(conn, "workflow", workflow_id, p, nxt[1] if nxt else None, priority)

    def get(self, conn, tenant: dict, workflow_id: str) -> dict:
        """GET /v1/workflows/{id}: the workflow with its nodes."""
        row = self._load(conn, tenant["tenant_id"], workflow_id)
        return self._view(row, self._nodes(conn, row["partition_id"], workflow_id))

    def list(self, conn, tenant: dict, cursor: str | None = None, limit: int = 50) -> dict:
        """GET /v1/workflows: {items (without their nodes), next_cursor}."""
        after_created, after_id = None, None
        if cursor:
            try:
                ms, after_id = cursor.split(".", 1)
                after_created = to_dt(int(ms))
            except ValueError as e:
                raise ValidationError("cursor", "is not a cursor this API returned") from e
        with conn.cursor(row_factory=dict_row) as cur:
            rows = cur.execute(
                Q["list_workflows"],
                {
                    "tenant_id": tenant["tenant_id"],
                    "after_created": after_created,
                    "after_id": after_id,
                    "limit": limit + 1,
                },
            ).fetchall()
        more = len(rows) > limit
        rows = rows[:limit]
        nxt = f"{to_ms(rows[-1]['created_at'])}.{rows[-1]['workflow_id']}" if more else None
        return {"items": [self._view(r, None) for r in rows], "next_cursor": nxt}

    def pause(self, conn, tenant: dict, workflow_id: str, now: int) -> dict:
        with conn.transaction():
            row = self._load(conn, tenant["tenant_id"], workflow_id, lock=True)
            if not row["paused"]:
                p = row["partition_id"]
                conn.execute(
                    Q["set_paused"], {"paused": True, "now": to_dt(now), "p": p, "wf": workflow_id}
                )
                timers.set_timer(conn, "workflow", workflow_id, p, None, row["priority"])
        return self.get(conn, tenant, workflow_id)

    def resume(self, conn, tenant: dict, workflow_id: str, now: int) -> dict:
        """Instants missed while paused go through the catch-up window like downtime."""
        with conn.transaction():
            row = self._load(conn, tenant["tenant_id"], workflow_id, lock=True)
            if row["paused"]:
                p = row["partition_id"]
                conn.execute(
                    Q["set_paused"], {"paused": False, "now": to_dt(now), "p": p, "wf": workflow_id}
                )
                self._arm_timer(
                    conn, workflow_id, p, row, to_ms(row["anchor_at"]), to_ms(row["last_instant"])
                )
        return self.get(conn, tenant, workflow_id)

    def delete(self, conn, tenant: dict, workflow_id: str, now: int) -> None:
        """Soft delete: no more firings, and its running workflow runs are cancelled."""
        with conn.transaction():
            row = self._load(conn, tenant["tenant_id"], workflow_id, lock=True)
            p = row["partition_id"]
            conn.execute(Q["soft_delete"], {"now": to_dt(now), "p": p, "wf": workflow_id})
            timers.set_timer(conn, "workflow", workflow_id, p, None, row["priority"])
            running = conn.execute(Q["running_workflow_runs"], {"p": p, "wf": workflow_id})
            for (wfr,) in running.fetchall():
                self._cancel(conn, p, wfr, now, "workflow deleted")

    def trigger(self, conn, tenant: dict, workflow_id: str, now: int) -> dict:
        """POST /v1/workflows/{id}/trigger -> {workflow_run_id, created}: a workflow
        run now, outside the schedule (also for a paused workflow: an explicit ask)."""
        with conn.transaction():
            row = self._load(conn, tenant["tenant_id"], workflow_id, lock=True)
            wfr = workflow_run_id_for_trigger(workflow_id, now)
            rows = self._start(conn, row, wfr, now, "manual", None, now)
            outbox.append(conn, rows or [])
        return {"workflow_run_id": wfr, "created": rows is not None}

    # -- workflow runs -----------------------------------------------------------
    def _run_view(self, row: dict, nodes: list[dict] | None) -> dict:
        out = {
            "workflow_run_id": row["workflow_run_id"],
            "workflow_id": row["workflow_id"],
            "workflow_name": row["workflow_name"],
            "tenant_id": row["tenant_id"],
            "state": row["state"],
            "trigger": row["trigger"],
            "scheduled_at": iso(to_ms(row["scheduled_at"])),
            "covers": [iso(c) for c in row["covers"]] if row["covers"] else None,
            "error": row["error"],
            "created_at": iso(to_ms(row["created_at"])),
            "finished_at": iso(to_ms(row["finished_at"])) if row["finished_at"] else None,
        }
        if nodes is not None:
            out["nodes"] = nodes
        return out

    def get_run(self, conn, tenant: dict, workflow_run_id: str) -> dict:
        """GET /v1/workflow-runs/{id}: its state and every node's state and run_id
        (run_id null until the node's run exists)."""
        p = _wfr_partition(workflow_run_id)
        with conn.cursor(row_factory=dict_row) as cur:
            row = cur.execute(
                Q["get_workflow_run"],
                {"p": p, "wfr": workflow_run_id, "tenant_id": tenant["tenant_id"]},
            ).fetchone()
            if row is None:
                raise NotFound("workflow run")
            nodes = cur.execute(Q["run_nodes_view"], {"p": p, "wfr": workflow_run_id}).fetchall()
        return self._run_view(
            row,
            [
                {
                    "name": n["node"],
                    "state": n["run_state"] or n["node_state"],
                    "run_id": n["run_id"],
                    "attempt": n["attempt"],
                    "depends_on": n["depends_on"],
                    "pending_deps": n["pending_deps"],
                }
                for n in nodes
            ],
        )

    def list_runs(
        self, conn, tenant: dict, workflow_id: str, cursor: str | None = None, limit: int = 50
    ) -> dict:
        """GET /v1/workflows/{id}/runs: newest first, without their nodes."""
        row = self._load(conn, tenant["tenant_id"], workflow_id)
        before_created, before_id = None, None
        if cursor:
            try:
                ms, before_id = cursor.split(".", 1)
                before_created = to_dt(int(ms))
            except ValueError as e:
                raise ValidationError("cursor", "is not a cursor this API returned") from e
        with conn.cursor(row_factory=dict_row) as cur:
            rows = cur.execute(
                Q["list_workflow_runs"],
                {
                    "p": row["partition_id"], "wf": workflow_id, "tenant_id": tenant["tenant_id"],
                    "before_created": before_created, "before_id": before_id, "limit": limit + 1,
                },
            ).fetchall()  # fmt: skip
        more = len(rows) > limit
        rows = rows[:limit]
        nxt = f"{to_ms(rows[-1]['created_at'])}.{rows[-1]['workflow_run_id']}" if more else None
        return {"items": [self._run_view(r, None) for r in rows], "next_cursor": nxt}

    def cancel_run(self, conn, tenant: dict, workflow_run_id: str, now: int) -> dict:
        """POST /v1/workflow-runs/{id}/cancel: cancel its pending and running node
        runs (as Lifecycle.cancel does, RunCompleted included) and every node not
        yet created. A FAILED workflow run keeps its state; its remaining nodes stop."""
        p = _wfr_partition(workflow_run_id)
        with conn.transaction():
            state = conn.execute(
                Q["workflow_run_state"],
                {"p": p, "wfr": workflow_run_id, "tenant_id": tenant["tenant_id"]},
            ).fetchone()
            if state is None:
                raise NotFound("workflow run")
            if not self._cancel(conn, p, workflow_run_id, now, "workflow run cancelled"):
                raise Conflict("NOT_RUNNABLE", f"the workflow run is {state[0]}")
        return self.get_run(conn, tenant, workflow_run_id)

    def _cancel(self, conn, p: int, wfr: str, now: int, reason: str) -> bool:
        """In the caller's transaction; False if the workflow run had already ended."""
        ctx_row = conn.execute(Q["lock_workflow_run"], {"p": p, "wfr": wfr}).fetchone()
        if ctx_row is None or ctx_row[2] in ("SUCCEEDED", "CANCELLED"):
            return False
        was_running = ctx_row[2] == "RUNNING"
        conn.execute(
            Q["cancel_workflow_run"], {"p": p, "wfr": wfr, "now": to_dt(now), "error": reason}
        )
        cancelled = []
        for node, run_id in conn.execute(Q["created_node_runs"], {"p": p, "wfr": wfr}).fetchall():
            try:
                self.lifecycle.cancel(conn, ctx_row[1], run_id, now, reason=reason)
            except Conflict:
                continue  # already terminal: its RunCompleted is on its way
            cancelled.append(node)
        conn.execute(
            Q["cancel_nodes"], {"p": p, "wfr": wfr, "now": to_dt(now), "cancelled": cancelled}
        )
        if was_running:
            outbox.append(conn, self._release_buffered(conn, p, ctx_row[0], now))
        return True

    # -- starting a workflow run ---------------------------------------------------
    def _start(
        self,
        conn,
        wf: dict,
        workflow_run_id: str,
        scheduled_ms: int,
        trigger: str,
        covers: tuple[int, ...] | list[int] | None,
        now: int,
    ) -> list[OutboxRow] | None:
        """Insert the workflow run, its nodes and the runs of its roots; None when
        it already existed (a duplicate fire or trigger)."""
        p = wf["partition_id"]
        got = conn.execute(
            Q["insert_workflow_run"],
            {
                "p": p, "wfr": workflow_run_id, "wf": wf["workflow_id"],
                "tenant_id": wf["tenant_id"], "trigger": trigger, "scheduled": to_dt(scheduled_ms),
                "covers": Jsonb(list(covers)) if covers else None, "priority": wf["priority"],
                "nodes_left": wf["node_count"], "now": to_dt(now),
            },
        ).fetchone()  # fmt: skip
        if got is None:
            return None
        roots = conn.execute(
            Q["insert_run_nodes"],
            {"p": p, "wfr": workflow_run_id, "wf": wf["workflow_id"], "now": to_dt(now)},
        ).fetchall()
        ctx = _RunCtx(
            p, workflow_run_id, wf["workflow_id"], wf["tenant_id"], wf["priority"], scheduled_ms,
            list(covers) if covers else None,
        )  # fmt: skip
        return self._create_node_runs(conn, ctx, roots, now)

    def _create_node_runs(
        self, conn, ctx: _RunCtx, nodes: list[tuple[str, dict]], now: int
    ) -> list[OutboxRow]:
        """Runs (PENDING) for nodes whose parents all succeeded, and their RunReady
        rows for the tenant's runs topic; only runs that are new get a row."""
        if not nodes:
            return []
        ids = [run_id_for_node(ctx.workflow_id, ctx.workflow_run_id, n) for n, _ in nodes]
        created = dict(
            conn.execute(
                Q["create_node_runs"],
                {
                    "p": ctx.p, "wfr": ctx.workflow_run_id, "tenant_id": ctx.tenant_id,
                    "scheduled": to_dt(ctx.scheduled_ms),
                    "covers": json.dumps(ctx.covers) if ctx.covers else None,
                    "priority": ctx.priority, "now": to_dt(now), "id": ids,
                    "node": [n for n, _ in nodes], "spec": [json.dumps(s) for _, s in nodes],
                },
            ).fetchall()
        )  # fmt: skip
        topic = self.topics.runs(ctx.tenant_id)
        rows = []
        for (node, spec), run_id in zip(nodes, ids, strict=True):
            if created.get(node) != run_id:
                continue
            target = spec["target"]
            rows.append(
                ready_row(
                    topic, ctx.p, run_id, ctx.tenant_id, 1, ctx.scheduled_ms, now, ctx.priority,
                    target["type"], target.get("queue"), spec["payload"],
                    workflow_run_id=ctx.workflow_run_id, node=node, covers=ctx.covers,
                )
            )  # fmt: skip
        return rows

    def _release_buffered(self, conn, p: int, workflow_id: str, now: int) -> list[OutboxRow]:
        """overlap=buffer_one: the instant held back starts once the active run ended."""
        got = conn.execute(Q["take_buffered_instant"], {"p": p, "wf": workflow_id}).fetchone()
        if got is None:
            return []
        with conn.cursor(row_factory=dict_row) as cur:
            wf = cur.execute(Q["workflow_by_id"], {"p": p, "wf": workflow_id}).fetchone()
        at = to_ms(got[0])
        return (
            self._start(
                conn, wf, workflow_run_id_for_instant(workflow_id, at), at, "schedule", None, now
            )
            or []
        )

    # -- the `workflow` timer kind ---------------------------------------------------
    def on_timers(
        self, conn: psycopg.Connection, due: list[Timer], now: int, report: FireReport
    ) -> list[OutboxRow]:
        """`workflow` timers: a workflow's next instant. Planned like a job's
        (catch-up window, overlap, jitter); each instant becomes a workflow run."""
        with conn.cursor(row_factory=dict_row) as cur:
            rows = cur.execute(
                Q["workflows_for_timers"],
                {
                    "partitions": [t.partition_id for t in due],
                    "ids": [t.owner_id for t in due],
                },
            ).fetchall()
        out: list[OutboxRow] = []

        def step(t: Timer, wf: dict) -> int | None:
            wf_id = wf["workflow_id"]
            sched = self.cache.get(wf_id, wf["version"], wf["schedule"], to_ms(wf["anchor_at"]))
            plan = plan_fire(
                sched,
                job_id=wf_id,
                last_instant_ms=to_ms(wf["last_instant"]),
                now_ms=now,
                catchup=Catchup(**wf["catchup"]),
                jitter_ms=wf["jitter_ms"],
                overlap=wf["overlap"],
                has_active_run=wf["has_active"],
            )
            started = 0
            for pr in plan.runs:
                wfr = workflow_run_id_for_instant(wf_id, pr.instant_ms)
                rows_ = self._start(conn, wf, wfr, pr.instant_ms, "schedule", pr.covers, now)
                if rows_ is not None:
                    started += 1
                    out.extend(rows_)
                    report.lateness_ms.append((now - t.due_ms, t.priority))
            report.missed += plan.missed
            conn.execute(
                Q["advance_workflow"],
                {
                    "p": wf["partition_id"], "wf": wf_id, "li": to_dt(plan.last_instant_ms),
                    "missed": plan.missed, "fired": started, "skipped": plan.overlap_skipped,
                    "buffered": None if plan.buffered_ms is None else to_dt(plan.buffered_ms),
                },
            )  # fmt: skip
            return plan.next_due_ms

        # Deleted, paused or unscheduled since the timer was written: the timer goes.
        timers.plan_each(due, {r["workflow_id"]: r for r in rows}, step).apply(conn)
        report.runs_created += len(out)
        return out

    # -- the completion step ------------------------------------------------------------
    def complete_node(self, conn: psycopg.Connection, record: dict, now: int) -> NodeStep:
        """Apply one RunCompleted (a decoded record) to its workflow run, in one
        transaction, if the database agrees with it: the run exists, is the
        record's tenant's, belongs to the record's workflow run and node, and is in
        the state the record claims at the record's attempt. Anything else is
        `refused` and leaves no trace (not even in `processed`), so a forged or
        stale record changes nothing and the genuine one still applies later.
        Idempotent: a duplicate is recorded in `processed` already and changes
        nothing."""
        wfr, node, run_id = record.get("workflow_run_id"), record.get("node"), record["run_id"]
        if wfr is None or node is None:
            return NodeStep("not_a_node")
        try:
            p = partition_of_run(run_id)
        except ValueError:
            return NodeStep("refused", wfr, node, reason="no_run")
        state = RunState(record["state"])  # ValueError for a state we do not know
        if state != RunState.SUCCEEDED and state not in FAILURES:
            raise ValueError(f"a node's run cannot end {state.value}")
        with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
            asked = {
                "consumer": CONSUMER, "key": run_id, "now": to_dt(now), "p": p, "wfr": wfr,
                "node": node, "tenant_id": record["tenant_id"],
                "attempt": record["attempt"], "state": state.value,
            }  # fmt: skip
            # A node's run carries its workflow run's instant (_create_node_runs),
            # so its day is near its end's only for a workflow run that ends
            # within a day or so of its instant; a later node of a longer one
            # is found by the second ask, over every day. Nothing is written
            # when no run is found, so asking again is exact.
            begun = one_in_days(
                plausible(record.get("finished_at"), now),
                lambda days: days.execute(cur, Q["begin_step"], asked).fetchone(),
                missing=lambda verdict: verdict["refused"] == "no_run",
            )
            wf_state, wf_id = begun["state"], begun["workflow_id"]
            if begun["refused"] is not None:
                return NodeStep(
                    "refused", wfr, node, workflow_state=wf_state, reason=begun["refused"]
                )
            if not begun["fresh"]:
                return NodeStep("duplicate", wfr, node)
            args = {
                "p": p, "wfr": wfr, "wf": wf_id, "node": node, "run_id": run_id,
                "now": to_dt(now),
            }  # fmt: skip
            step = NodeStep("applied", wfr, node, workflow_state=wf_state)
            rows: list[OutboxRow] = []
            if state == RunState.SUCCEEDED:
                got = conn.execute(Q["node_succeeded"], args).fetchall()
                if not got:
                    return NodeStep("stale", wfr, node, workflow_state=wf_state)
                step.workflow_state = got[0][0]
                ctx = _RunCtx(
                    p, wfr, wf_id, begun["tenant_id"], begun["priority"],
                    to_ms(begun["scheduled_at"]), begun["covers"] or None,
                )  # fmt: skip
                rows = self._create_node_runs(conn, ctx, [(r[1], r[2]) for r in got[1:]], now)
                step.created = [r.key.decode() for r in rows]
            else:
                error = f"node {node!r} {state.value}"
                if begun["run_error"]:  # the run's, not the record's
                    error += f": {begun['run_error']}"
                hit, failed, skipped = conn.execute(
                    Q["node_failed"], {**args, "state": state.value, "error": error}
                ).fetchone()
                if not hit:
                    return NodeStep("stale", wfr, node, workflow_state=wf_state)
                step.workflow_state = failed or wf_state
                step.skipped = list(skipped)
            if wf_state == "RUNNING" and step.workflow_state != "RUNNING":
                rows += self._release_buffered(conn, p, wf_id, now)
            outbox.append(conn, rows)
        return step
