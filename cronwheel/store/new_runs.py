"""Run creation: the one place that inserts a job's runs and builds the RunReady
outbox rows that announce a run (new, or back from a retry wait).

Runs are inserted PENDING and `ON CONFLICT DO NOTHING` (deterministic ids: a
duplicate fire inserts nothing and announces nothing); every later change of
state is cronwheel.store.lifecycle's. Who creates runs: the firing loop (a
job's instants), a job's trigger and backfill, a buffered instant released by
the end of a run (through insert_runs), and the workflow service (its node
runs, inserted with their nodes by workflows.sql, announced by ready_row).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field

import psycopg

from cronwheel import config
from cronwheel.core import events
from cronwheel.core.clock import to_dt
from cronwheel.core.events import OutboxRow
from cronwheel.core.runs import priority_rank
from cronwheel.kafka import Topics
from cronwheel.store import pgarrays
from cronwheel.store.sql_loader import queries

Q = queries("new_runs")
_json_string = json.encoder.encode_basestring_ascii  # json.dumps of a str


def run_spec(job: dict) -> dict:
    """The snapshot a run keeps of what to execute."""
    return {
        "target": job["target"],
        "payload": job["payload"],
        "retry": job["retry"],
        "timeout_ms": job["timeout_ms"],
        "lease_ms": job["lease_ms"],
    }


def run_spec_text(
    target: str, payload: str, retry: str, timeout_ms: int | None, lease_ms: int
) -> str:
    """run_spec as JSON text, from the job's target and retry as JSON text: what
    the firing loop writes without decoding and re-encoding them per run."""
    timeout = "null" if timeout_ms is None else str(int(timeout_ms))
    return (
        f'{{"target": {target}, "payload": {_json_string(payload)}, "retry": {retry},'
        f' "timeout_ms": {timeout}, "lease_ms": {int(lease_ms)}}}'
    )


@functools.cache
def this_cell() -> str:
    """The cell this process serves (CRONWHEEL_CELL, read once: every process
    of a cell has its cell's name, cronwheel/stack/cells.py), written as the
    `cell` of each RunReady it announces: the cell that fired the run, which
    a moved tenant's later runs show."""
    return config.cell()


def ready_row(
    topic: str,
    partition_id: int,
    run_id: str,
    tenant_id: str,
    attempt: int,
    scheduled_ms: int,
    now: int,
    priority: str,
    target_type: str,
    queue: str | None,
    payload: str,
    *,
    job_id: str | None = None,
    workflow_run_id: str | None = None,
    node: str | None = None,
    covers: list[int] | tuple[int, ...] | None = None,
    not_before_ms: int | None = None,
) -> OutboxRow:
    """The RunReady row that announces a run on its tenant's run topic, with its
    class (the relay reads no value back) and, for a run fired ahead of its
    instant, when it may be published. Every RunReady is written here, so every
    one names this process's cell."""
    value = events.run_ready(
        run_id=run_id, tenant_id=tenant_id, partition_id=partition_id, attempt=attempt,
        scheduled_ms=scheduled_ms, created_ms=now, priority=priority, target_type=target_type,
        queue=queue, payload=payload, job_id=job_id, workflow_run_id=workflow_run_id, node=node,
        covers=covers, cell=this_cell(),
    )  # fmt: skip
    return OutboxRow(
        partition_id,
        topic,
        run_id.encode(),
        value,
        priority=priority_rank(priority),
        not_before_ms=not_before_ms,
    )


@dataclass
class NewRuns:
    """Runs to insert, column by column (the shape insert_runs sends)."""

    partition_id: list[int] = field(default_factory=list)
    run_id: list[str] = field(default_factory=list)
    tenant_id: list[str] = field(default_factory=list)
    job_id: list[str | None] = field(default_factory=list)
    scheduled_ms: list[int] = field(default_factory=list)
    covers: list[tuple[int, ...] | None] = field(default_factory=list)
    priority: list[str] = field(default_factory=list)
    spec: list[str] = field(default_factory=list)  # JSON text
    target_type: list[str] = field(default_factory=list)
    queue: list[str | None] = field(default_factory=list)
    payload: list[str] = field(default_factory=list)
    # When the RunReady may be published (fired ahead of its instant), or None
    not_before_ms: list[int | None] = field(default_factory=list)

    def add(
        self, partition_id, run_id, tenant_id, job_id, scheduled_ms, covers, priority, spec,
        target_type, queue, payload, not_before_ms=None,
    ) -> None:  # fmt: skip
        self.partition_id.append(partition_id)
        self.run_id.append(run_id)
        self.tenant_id.append(tenant_id)
        self.job_id.append(job_id)
        self.scheduled_ms.append(scheduled_ms)
        self.covers.append(covers)
        self.priority.append(priority)
        self.spec.append(spec)
        self.target_type.append(target_type)
        self.queue.append(queue)
        self.payload.append(payload)
        self.not_before_ms.append(not_before_ms)

    def add_spec(
        self, partition_id: int, run_id: str, tenant_id: str, job_id: str, scheduled_ms: int,
        priority: str, spec: dict, not_before_ms: int | None = None,
    ) -> None:  # fmt: skip
        """A run from its spec as a dict (run_spec): a trigger, a backfill, a
        buffered instant."""
        target = spec["target"]
        self.add(
            partition_id, run_id, tenant_id, job_id, scheduled_ms, None, priority,
            json.dumps(spec), target["type"], target.get("queue"), spec["payload"], not_before_ms,
        )  # fmt: skip

    @classmethod
    def of(cls, runs: list[dict]) -> NewRuns:
        """From dicts: partition_id, run_id, tenant_id, job_id, scheduled_ms,
        priority, spec, and optionally covers and not_before_ms."""
        cols = cls()
        for r in runs:
            spec = r["spec"]
            cols.add(
                r["partition_id"], r["run_id"], r["tenant_id"], r["job_id"], r["scheduled_ms"],
                r.get("covers"), r["priority"], json.dumps(spec), spec["target"]["type"],
                spec["target"].get("queue"), spec["payload"], r.get("not_before_ms"),
            )  # fmt: skip
        return cols


def insert_runs(
    conn: psycopg.Connection, topics: Topics, runs: NewRuns | list[dict], now: int
) -> list[OutboxRow]:
    """Insert runs (ON CONFLICT DO NOTHING) and return the RunReady rows for the
    ones that are new (the caller appends them in the same transaction)."""
    if not isinstance(runs, NewRuns):
        runs = NewRuns.of(runs)
    if not runs.run_id:
        return []
    inserted = {
        r[0]
        for r in conn.execute(
            Q["insert_runs"],
            {
                "now": to_dt(now),
                "p": pgarrays.int2_array(runs.partition_id),
                "id": pgarrays.text_array(runs.run_id),
                "t": pgarrays.text_array(runs.tenant_id),
                "j": pgarrays.text_array(runs.job_id),
                "s": pgarrays.timestamptz_array(runs.scheduled_ms),
                "c": pgarrays.text_array([json.dumps(list(c)) if c else None for c in runs.covers]),
                "pr": pgarrays.text_array(runs.priority),
                "sp": pgarrays.text_array(runs.spec),
            },
        )
    }
    rows = []
    topic_of: dict[str, str] = {}
    for i, run_id in enumerate(runs.run_id):
        if run_id not in inserted:
            continue
        tenant_id = runs.tenant_id[i]
        topic = topic_of.get(tenant_id)
        if topic is None:
            topic = topic_of[tenant_id] = topics.runs(tenant_id)
        rows.append(
            ready_row(
                topic,
                runs.partition_id[i],
                run_id,
                tenant_id,
                1,
                runs.scheduled_ms[i],
                now,
                runs.priority[i],
                runs.target_type[i],
                runs.queue[i],
                runs.payload[i],
                job_id=runs.job_id[i],
                covers=runs.covers[i],
                not_before_ms=runs.not_before_ms[i],
            )  # fmt: skip
        )
    return rows
