"""The records the system publishes, built from domain values. Every record goes
through the outbox: `OutboxRow`s are written in the transaction of the change
they announce, and the relay publishes them."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from cronwheel.core.avro import default_registry, fast_writer
from cronwheel.core.runs import NORMAL_RANK


@dataclass(frozen=True)
class OutboxRow:
    """A record to publish. Its builder says its class (0 critical .. 3 low; a
    run's RunReady takes the run's, every other record is normal), so nothing
    downstream decodes the value to find it, and, for a run fired ahead of its
    instant, when it may be published."""

    partition_id: int
    topic: str
    key: bytes
    value: bytes
    headers: dict | None = None
    priority: int = NORMAL_RANK
    not_before_ms: int | None = None


def traceparent(run_id: str, attempt: int) -> str:
    """The run's W3C Trace Context `traceparent`: one trace per run, one parent
    span per attempt, flags 00 (the scheduler records no trace of its own; a
    worker samples as it likes). A run id is 32 lowercase hex digits, the shape
    of a trace id, and random past its 3 partition digits (cronwheel/core/ids.py),
    so it is the trace id as it stands; every attempt and re-announcement of the
    run joins that trace. Any other id is hashed into one."""
    trace_id = run_id if _TRACE_ID.fullmatch(run_id) and run_id.strip("0") else None
    if trace_id is None:
        trace_id = hashlib.sha256(run_id.encode()).hexdigest()[:32]
    return f"00-{trace_id}-{attempt:016x}-00"


_TRACE_ID = re.compile(r"[0-9a-f]{32}")


def run_ready(
    *,
    run_id: str,
    tenant_id: str,
    partition_id: int,
    attempt: int,
    scheduled_ms: int,
    created_ms: int,
    priority: str,
    payload: str,
    target: dict | None = None,
    job_id: str | None = None,
    workflow_run_id: str | None = None,
    node: str | None = None,
    covers: list[int] | tuple[int, ...] | None = None,
    target_type: str | None = None,
    queue: str | None = None,
    cell: str | None = None,
    trace: str | None = None,
) -> bytes:
    """RunReady v2. `target` (the job's target object), or its `target_type`
    and `queue` as the firing loop reads them. `trace`: a traceparent that came
    with the run, else the run's own (`traceparent`: nothing is stored, the
    same run and attempt give the same one, so a duplicate fire or a record
    announced again writes the same bytes); `cell`: the cell firing it (its
    writers pass their process's, cronwheel/store/new_runs.py)."""
    if target is not None:
        target_type, queue = target["type"], target.get("queue")
    datum = {
        "run_id": run_id,
        "tenant_id": tenant_id,
        "job_id": job_id,
        "workflow_run_id": workflow_run_id,
        "node": node,
        "attempt": attempt,
        "scheduled_at": scheduled_ms,
        "created_at": created_ms,
        "priority": priority,
        "target_type": target_type,
        "queue": queue,
        "payload": payload,
        "partition_id": partition_id,
        "covers": list(covers) if covers else None,
        "traceparent": trace or traceparent(run_id, attempt),
        "cell": cell,
    }
    # One per fired run: the compiled writer (the same bytes as fastavro's).
    return fast_writer("RunReady")(datum)


def run_completed(
    *,
    run_id: str,
    tenant_id: str,
    partition_id: int,
    attempt: int,
    state: str,
    finished_ms: int,
    job_id: str | None = None,
    workflow_run_id: str | None = None,
    node: str | None = None,
    error: str | None = None,
) -> bytes:
    return default_registry().encode(
        "RunCompleted",
        {
            "run_id": run_id,
            "tenant_id": tenant_id,
            "job_id": job_id,
            "workflow_run_id": workflow_run_id,
            "node": node,
            "attempt": attempt,
            "state": state,
            "finished_at": finished_ms,
            "partition_id": partition_id,
            "error": error,
        },
    )
