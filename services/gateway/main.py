"""`cronwheel serve gateway`: the API on CRONWHEEL_HTTP_ADDR (default 127.0.0.1:8080).
Settings: GatewaySettings (docs/settings.md).

One Python process is held to one core by its GIL (bench/RESULTS-lifecycle.md).
With several workers this process binds the socket and supervises: each worker
is a fresh interpreter (`python -m services.gateway.main`) handed the listening
socket, so they accept from it in turn; a worker that dies is started again.
Their metrics are merged by prometheus_client's multiprocess mode in a
directory this process owns (services/gateway/metrics_dir.py), so /metrics answers for all of
them whichever one serves it. The rate-limit buckets live in a table in that
directory which every worker maps (ratelimit.SharedRateLimiter), so a key's
limit holds across the workers, not per worker.
"""

from __future__ import annotations

import collections
import math
import os
import shutil
import signal
import sys
import tempfile
from dataclasses import dataclass

from cronwheel import config
from cronwheel.config import Common, Destinations, Serving, group, setting
from cronwheel.runtime import freeze_heap, setup_logging, stop_on_signals
from cronwheel.supervisor import Supervisor

LISTEN_FD = "CRONWHEEL_GATEWAY_LISTEN_FD"  # set for a worker: the inherited socket
WORKERS = "CRONWHEEL_GATEWAY_WORKERS"
RATE_LIMIT_TABLE = "CRONWHEEL_GATEWAY_RATE_LIMIT_TABLE"  # set for a worker: the shared buckets


def _rate(text: str) -> float:
    value = float(text)
    if not (math.isfinite(value) and value > 0):
        raise ValueError(text)
    return value


@dataclass(frozen=True)
class GatewaySettings:
    common: Common = group(Common)
    serving: Serving = group(Serving)
    destinations: Destinations = group(Destinations)
    # Unset: a local key kept in the stack's state directory (cronwheel/demo.py).
    operator_key: str | None = setting("CRONWHEEL_OPERATOR_KEY", None)
    rate_limit: float = setting(
        "CRONWHEEL_RATE_LIMIT", 1000.0, parse=_rate, accepts="a number > 0"
    )  # requests per second per tenant (all its keys)
    rate_burst: float = setting("CRONWHEEL_RATE_BURST", 2000.0, minimum=1)
    # Failed authentications (unknown or revoked keys) per client address per
    # minute before 429; how long a process remembers a key's tenant or refusal.
    auth_failures: int = setting("CRONWHEEL_AUTH_FAILURES_PER_MINUTE", 30, minimum=1)
    auth_cache_s: float = setting("CRONWHEEL_AUTH_CACHE_S", 30.0, minimum=0)
    # Object quotas per tenant, unless the operator set its own (docs/tenancy.md).
    quota_jobs: int = setting("CRONWHEEL_QUOTA_JOBS", 10_000, minimum=0)
    quota_workflows: int = setting("CRONWHEEL_QUOTA_WORKFLOWS", 1_000, minimum=0)
    quota_keys: int = setting("CRONWHEEL_QUOTA_KEYS", 100, minimum=0)
    pool: int = setting("CRONWHEEL_GATEWAY_POOL", 10, minimum=1)  # connections per process
    # How long a webhook URL's lookup may take, before the transaction (destinations.py).
    webhook_dns_timeout_ms: int = setting("CRONWHEEL_WEBHOOK_DNS_TIMEOUT_MS", 2000, minimum=1)
    # Off: the worker protocol and job creation go through FastAPI's routing
    # too (for comparisons); the answers are the same.
    fastpath: bool = setting("CRONWHEEL_GATEWAY_FASTPATH", True)
    # A new tenant's run topic and a new job's topics made before the call
    # answers, so its first run is as punctual as any (topics_ready.py).
    make_topics: bool = setting("CRONWHEEL_GATEWAY_MAKES_TOPICS", True)
    # topics_ready.WAIT_S, written again: this module imports the gateway's
    # modules only once the metrics directory is set (prometheus_client reads
    # it at import).
    topics_wait_ms: int = setting("CRONWHEEL_GATEWAY_TOPICS_WAIT_MS", 2000, minimum=1)
    # Processes; unset: one per two CPUs, at most 8 (worker_count).
    workers: int | None = setting(WORKERS, None, minimum=1)
    # Set by the gateway for its workers, not by people.
    listen_fd: int | None = setting(LISTEN_FD, None, minimum=0)
    rate_limit_table: str | None = setting(RATE_LIMIT_TABLE, None)


MIN_OPERATOR_KEY_CHARS = 32
MIN_OPERATOR_KEY_BITS = 96  # Shannon estimate over the key's own characters


class WeakOperatorKey(ValueError):
    """The operator key a deployment gave is guessable (`CHANGE-ME`, short,
    repetitive): the gateway refuses to start with it."""


def operator_key_weakness(key: str) -> str | None:
    """Why `key` is too weak to manage tenants, or None. At least 32 characters,
    at least 10 different ones, and about 96 bits by the Shannon entropy of its
    characters (a template's `CHANGE-ME`, a word repeated, `aaaa...`, fail; a
    random key of 32 characters or more from `secrets.token_urlsafe(32)` or
    `openssl rand -hex 32` passes, as does the local stack's generated key)."""
    if len(key) < MIN_OPERATOR_KEY_CHARS:
        return f"shorter than {MIN_OPERATOR_KEY_CHARS} characters"
    counts = collections.Counter(key)
    if len(counts) < 10:
        return "too few different characters"
    bits = -sum(n * math.log2(n / len(key)) for n in counts.values())
    repeated = any(
        key == (key[:n] * (len(key) // n + 1))[: len(key)] for n in range(1, len(key) // 2 + 1)
    )
    if bits < MIN_OPERATOR_KEY_BITS or repeated:
        return "too repetitive to be random"
    return None


def check_operator_key(key: str) -> None:
    """WeakOperatorKey (one line, without the key) for a weak key."""
    if why := operator_key_weakness(key):
        raise WeakOperatorKey(
            f"CRONWHEEL_OPERATOR_KEY is too weak ({why}): use at least "
            f"{MIN_OPERATOR_KEY_CHARS} random characters, e.g. from "
            "`python -c 'import secrets; print(secrets.token_urlsafe(32))'`"
        )


def worker_count(settings: GatewaySettings | None = None) -> int:
    settings = settings or config.load(GatewaySettings)
    if settings.workers is not None:
        return settings.workers
    # PostgreSQL takes about half the gateway's CPU per request and usually
    # shares the host: leave it half of the cores.
    return max(1, min(8, len(os.sched_getaffinity(0)) // 2))


def main() -> None:
    from cronwheel.demo import operator_key

    settings = config.load(GatewaySettings)
    check_operator_key(settings.operator_key or operator_key())
    config.secret_keyring()  # a bad CRONWHEEL_SECRET_KEYS stops the start, in one line
    log = setup_logging("gateway", settings.common.log_level)
    if settings.listen_fd is None and worker_count(settings) > 1:
        supervise(settings, worker_count(settings), log)
    else:
        serve(settings, log)


def serve(settings: GatewaySettings, log) -> None:
    """One process: the app on the inherited socket (a worker's), or on its own."""
    import socket

    from cronwheel.demo import operator_key
    from cronwheel.kafka import Topics
    from cronwheel.store.dbclock import ClockSync, DbClock
    from cronwheel.store.quotas import ObjectLimits
    from services.gateway import metrics_dir
    from services.gateway.app import create_app
    from services.gateway.auth import AuthLimits, KeyGuard
    from services.gateway.destinations import DestinationCheck
    from services.gateway.idempotency import Pruner
    from services.gateway.service import GatewayService

    fd = settings.listen_fd
    host, _, port = settings.serving.http_addr.rpartition(":")
    # Due times and leases by the database's clock, as the timer reads them
    # (cronwheel/store/dbclock.py): a gateway 2 s behind refused due runs.
    clock_sync = ClockSync(settings.common.database_url, DbClock()).start()
    app = create_app(
        settings.common.database_url,
        Topics(settings.common.topic_prefix),
        settings.common.kafka_bootstrap,
        settings.operator_key or operator_key(),
        rate_per_s=settings.rate_limit,
        burst=settings.rate_burst,
        clock=clock_sync.clock,
        cell=settings.serving.cell,
        webhook_allow=settings.destinations.allow,
        pool_max=settings.pool,
        worker_fastpath=settings.fastpath,
        rate_limit_table=settings.rate_limit_table if fd is not None else None,
        make_topics=settings.make_topics,
        topics_wait_s=settings.topics_wait_ms / 1000,
    )
    app.state.key_guard = KeyGuard(AuthLimits(settings.auth_failures, settings.auth_cache_s))
    app.state.gateway.destinations = DestinationCheck(
        settings.destinations.allow, settings.webhook_dns_timeout_ms / 1000
    )
    app.state.object_limits = ObjectLimits(
        settings.quota_jobs, settings.quota_workflows, settings.quota_keys
    )
    metrics_dir.collect_for_all_workers()
    gateway = app.state.gateway
    pruner = Pruner(gateway.pool, gateway.clock).start()  # expired Idempotency-Keys
    try:
        sock = None if fd is None else socket.socket(fileno=fd)
        service = GatewayService(
            app,
            host.strip("[]") or "127.0.0.1",
            int(port),
            log_level=settings.common.log_level.lower(),
            sock=sock,
        )
        if fd is None:
            log.info("gateway listening on %s/v1", service.url)
        freeze_heap()
        service.run(stop_on_signals())
    finally:
        pruner.stop()
        clock_sync.stop()
        app.state.gateway.close()


def supervise(settings: GatewaySettings, n: int, log) -> None:
    """Bind, start `n` workers on the socket, and supervise them as `cronwheel
    dev` supervises services (cronwheel.supervisor: a worker that dies is
    started again after a backoff, with a line saying why; SIGTERM / SIGINT
    stop them all)."""
    from services.gateway.metrics_dir import MULTIPROC_ENV, mark_dead
    from services.gateway.ratelimit import create_table
    from services.gateway.service import listen, url_of

    host, _, port = settings.serving.http_addr.rpartition(":")
    sock = listen(host.strip("[]") or "127.0.0.1", int(port))
    metrics = tempfile.mkdtemp(prefix="cronwheel-gateway-metrics-")
    limits = os.path.join(metrics, "rate-limit.table")  # not a *.db: metrics ignore it
    create_table(limits)
    env = {
        **os.environ,
        LISTEN_FD: str(sock.fileno()),
        MULTIPROC_ENV: metrics,
        RATE_LIMIT_TABLE: limits,
    }
    workers = Supervisor(
        {f"gateway-{i}": [sys.executable, "-m", "services.gateway.main"] for i in range(n)},
        None,
        label="gateway",
        popen={"env": env, "pass_fds": (sock.fileno(),), "preexec_fn": _die_with_parent},
        on_death=lambda pid: mark_dead(metrics, pid),
        log=log,
    )
    log.info("gateway listening on %s/v1 with %d worker processes", url_of(sock), n)
    try:
        workers.run(stop_on_signals())
    finally:
        sock.close()
        shutil.rmtree(metrics, ignore_errors=True)


def _die_with_parent() -> None:
    """In the worker before exec: SIGTERM when the supervisor dies (kill -9), so no
    worker keeps serving on its own."""
    import ctypes

    pr_set_pdeathsig = 1
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(pr_set_pdeathsig, signal.SIGTERM)


if __name__ == "__main__":
    main()
