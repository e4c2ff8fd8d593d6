"""The records the system publishes, built from domain values. Every record goes
through the outbox: `OutboxRow`s are written in the transaction of the change
they announce, and the relay publishes them."""

from __future__ import annotations

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
) -> bytes:
    """`target` (the job's target object), or its `target_type` and `queue`
    as the firing loop reads them."""
    if target is not None:
        target_type, queue = target["type"], target.get("queue")
    # One per fired run: the compiled writer (the same bytes as fastavro's).
    return fast_writer("RunReady")(
        {
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
        },
    )


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
