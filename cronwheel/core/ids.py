"""Identifiers and partitioning.

partition_of(owner) = first 8 bytes of SHA-256(owner) mod 1024: stable across
languages and releases, so any service (or a future shard router) computes it.

Run ids are deterministic: a duplicate fire of the same (job, instant), or a
duplicate creation of the same (workflow run, node), computes the same id and the
insert becomes a no-op. The first three hex digits are the partition, so a bare
run_id routes to its partition (and, at scale, its database) with no lookup.
"""

from __future__ import annotations

import hashlib
import secrets

PARTITIONS = 1024


def partition_of(owner_id: str) -> int:
    digest = hashlib.sha256(owner_id.encode()).digest()
    return int.from_bytes(digest[:8], "big") % PARTITIONS


def _run_id(partition: int, *parts: str) -> str:
    digest = hashlib.sha256("\x1f".join(parts).encode()).hexdigest()
    return f"{partition:03x}{digest[:29]}"


def run_id_for_instant(job_id: str, instant_ms: int) -> str:
    """The one run of `job_id` at the scheduled instant (UTC ms)."""
    return _run_id(partition_of(job_id), "job", job_id, str(instant_ms))


def run_id_for_trigger(job_id: str, at_ms: int) -> str:
    """A manual trigger's run: its own namespace, so it never collides with an instant."""
    return _run_id(partition_of(job_id), "trigger", job_id, str(at_ms))


def run_id_for_node(workflow_id: str, workflow_run_id: str, node: str) -> str:
    """The one run of `node` in a workflow run; it lives in the workflow's partition."""
    return _run_id(partition_of(workflow_id), "node", workflow_run_id, node)


def partition_of_run(run_id: str) -> int:
    """The partition encoded in a run id; ValueError when it is not one of ours."""
    if len(run_id) != 32:
        raise ValueError("not a run id")
    p = int(run_id[:3], 16)
    int(run_id[3:], 16)
    if p >= PARTITIONS:
        raise ValueError("not a run id")
    return p


def new_id(prefix: str) -> str:
    """A random id with a readable prefix: `job_…`, `ten_…`, `key_…`."""
    return f"{prefix}_{secrets.token_hex(10)}"
