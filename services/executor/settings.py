"""The executor's settings, each default written here once (docs/settings.md),
the sandbox's in Policy (sandbox.py); `cronwheel serve executor` reads them
(main.py) and Executor's defaults are these."""

from __future__ import annotations

from dataclasses import dataclass

from cronwheel.config import Common, Metrics, group, setting
from services.executor.sandbox import Policy


@dataclass(frozen=True)
class SandboxSettings:
    """The operator's Policy: what managed jobs get unless they ask, and the most
    they may ask for. The defaults are Policy's (sandbox.py)."""

    allow_network: bool = setting("CRONWHEEL_EXECUTOR_ALLOW_NETWORK", Policy.allow_network)
    memory_mb: int = setting("CRONWHEEL_EXECUTOR_MEMORY_MB", Policy.memory_mb, minimum=1)
    max_memory_mb: int = setting(
        "CRONWHEEL_EXECUTOR_MAX_MEMORY_MB", Policy.max_memory_mb, minimum=1
    )
    cpu_ms: int = setting("CRONWHEEL_EXECUTOR_CPU_MS", Policy.cpu_ms, minimum=1)
    max_cpu_ms: int = setting("CRONWHEEL_EXECUTOR_MAX_CPU_MS", Policy.max_cpu_ms, minimum=1)
    pids: int = setting("CRONWHEEL_EXECUTOR_PIDS", Policy.pids, minimum=1)
    max_pids: int = setting("CRONWHEEL_EXECUTOR_MAX_PIDS", Policy.max_pids, minimum=1)
    fsize_mb: int = setting("CRONWHEEL_EXECUTOR_FSIZE_MB", Policy.fsize_mb, minimum=0)
    nofile: int = setting("CRONWHEEL_EXECUTOR_NOFILE", Policy.nofile, minimum=1)
    scratch_mb: int = setting("CRONWHEEL_EXECUTOR_SCRATCH_MB", Policy.scratch_mb, minimum=1)
    max_wall_ms: int = setting("CRONWHEEL_EXECUTOR_MAX_WALL_MS", Policy.max_wall_ms, minimum=1)
    uid_base: int = setting("CRONWHEEL_EXECUTOR_UID_BASE", Policy.uid_base, minimum=1)
    uid_range: int = setting("CRONWHEEL_EXECUTOR_UID_RANGE", Policy.uid_range, minimum=1)
    cgroup: str | None = setting("CRONWHEEL_EXECUTOR_CGROUP", Policy.cgroup)
    lock_dir: str | None = setting("CRONWHEEL_EXECUTOR_LOCK_DIR", Policy.lock_dir)


@dataclass(frozen=True)
class ExecutorSettings:
    common: Common = group(Common)
    metrics: Metrics = group(Metrics)
    sandbox: SandboxSettings = group(SandboxSettings)
    concurrency: int = setting("CRONWHEEL_EXECUTOR_CONCURRENCY", 4, minimum=1)
    per_tenant: int = setting("CRONWHEEL_EXECUTOR_TENANT_CONCURRENCY", 2, minimum=1)
    session_timeout_ms: int = setting("CRONWHEEL_EXECUTOR_SESSION_TIMEOUT_MS", 10_000, minimum=1)
    shutdown_grace_ms: int = setting("CRONWHEEL_EXECUTOR_SHUTDOWN_GRACE_MS", 10_000, minimum=0)
