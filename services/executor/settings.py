"""The executor's settings, each default written here once (docs/settings.md),
the sandbox's in Policy (sandbox.py); `cronwheel serve executor` reads them
(main.py) and Executor's defaults are these."""

from __future__ import annotations

from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network

from cronwheel.config import Common, Metrics, group, setting
from cronwheel.core.ssrf import allowed_networks
from services.executor.sandbox import Policy


def _ipv4_cidrs(text: str) -> tuple[IPv4Network, ...]:
    nets = allowed_networks(text)
    if any(not isinstance(net, IPv4Network) for net in nets):
        raise ValueError("network runs have IPv4 only")
    return tuple(n for n in nets if isinstance(n, IPv4Network))


def _ipv4_addresses(text: str) -> tuple[str, ...]:
    return tuple(str(IPv4Address(part.strip())) for part in text.split(",") if part.strip())


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
    egress_allow: tuple[IPv4Network, ...] = setting(
        "CRONWHEEL_EXECUTOR_EGRESS_ALLOW",
        Policy.egress_allow,
        parse=_ipv4_cidrs,
        accepts="comma-separated IPv4 CIDRs, e.g. 10.20.0.0/16,192.168.7.0/24",
    )
    egress_dns: tuple[str, ...] | None = setting(
        "CRONWHEEL_EXECUTOR_EGRESS_DNS",
        Policy.egress_dns,
        parse=_ipv4_addresses,
        accepts="comma-separated IPv4 addresses, e.g. 1.1.1.1,9.9.9.9",
    )
    egress_subnet: str = setting(
        "CRONWHEEL_EXECUTOR_EGRESS_SUBNET",
        Policy.egress_subnet,
        parse=lambda text: str(IPv4Network(text)),
        accepts="an IPv4 network, e.g. 10.254.0.0/16",
    )


@dataclass(frozen=True)
class ExecutorSettings:
    common: Common = group(Common)
    metrics: Metrics = group(Metrics)
    sandbox: SandboxSettings = group(SandboxSettings)
    concurrency: int = setting("CRONWHEEL_EXECUTOR_CONCURRENCY", 4, minimum=1)
    per_tenant: int = setting("CRONWHEEL_EXECUTOR_TENANT_CONCURRENCY", 2, minimum=1)
    session_timeout_ms: int = setting("CRONWHEEL_EXECUTOR_SESSION_TIMEOUT_MS", 10_000, minimum=1)
    shutdown_grace_ms: int = setting("CRONWHEEL_EXECUTOR_SHUTDOWN_GRACE_MS", 10_000, minimum=0)
    # Partitions held and not read for this long though the broker has
    # records for them: new Kafka clients (cronwheel.fetch_watch); 0: never.
    fetch_watch_s: float = setting("CRONWHEEL_EXECUTOR_FETCH_WATCH_S", 15.0, minimum=0)
