"""`cronwheel serve gateway`: the API on CRONWHEEL_HTTP_ADDR (default 127.0.0.1:8080).
Settings: CRONWHEEL_OPERATOR_KEY, CRONWHEEL_RATE_LIMIT (requests per second per
key, default 1000), CRONWHEEL_RATE_BURST (default 2000),
CRONWHEEL_WEBHOOK_ALLOW_CIDRS, CRONWHEEL_GATEWAY_POOL (connections per process,
default 10), CRONWHEEL_GATEWAY_WORKERS (processes, default one per two CPUs,
at most 8), CRONWHEEL_GATEWAY_FASTPATH (0 serves the worker protocol through
FastAPI's routing too; for comparisons).

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

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading

from cronwheel import config
from cronwheel.runtime import setup_logging, stop_on_signals

LISTEN_FD = "CRONWHEEL_GATEWAY_LISTEN_FD"  # set for a worker: the inherited socket
WORKERS = "CRONWHEEL_GATEWAY_WORKERS"
RATE_LIMIT_TABLE = "CRONWHEEL_GATEWAY_RATE_LIMIT_TABLE"  # set for a worker: the shared buckets


def worker_count() -> int:
    raw = os.environ.get(WORKERS, "").strip()
    if raw:
        n = int(raw)
        if n < 1:
            raise ValueError(f"{WORKERS} must be at least 1, not {n}")
        return n
    # PostgreSQL takes about half the gateway's CPU per request and usually
    # shares the host: leave it half of the cores.
    return max(1, min(8, len(os.sched_getaffinity(0)) // 2))


def main() -> None:
    log = setup_logging("gateway")
    fd = os.environ.get(LISTEN_FD)
    if fd is None and worker_count() > 1:
        supervise(worker_count(), log)
    else:
        serve(None if fd is None else int(fd), log)


def serve(fd: int | None, log) -> None:
    """One process: the app on the inherited socket `fd`, or on its own."""
    import socket

    from cronwheel.demo import operator_key
    from cronwheel.kafka import Topics
    from services.gateway import metrics_dir
    from services.gateway.app import create_app
    from services.gateway.service import GatewayService

    host, _, port = config.http_addr().rpartition(":")
    app = create_app(
        config.database_url(),
        Topics.from_env(),
        config.kafka_bootstrap(),
        operator_key(),
        rate_per_s=float(os.environ.get("CRONWHEEL_RATE_LIMIT", "1000")),
        burst=float(os.environ.get("CRONWHEEL_RATE_BURST", "2000")),
        pool_max=int(os.environ.get("CRONWHEEL_GATEWAY_POOL", "10")),
        worker_fastpath=os.environ.get("CRONWHEEL_GATEWAY_FASTPATH", "1") != "0",
        rate_limit_table=os.environ.get(RATE_LIMIT_TABLE) if fd is not None else None,
    )
    metrics_dir.collect_for_all_workers()
    try:
        sock = None if fd is None else socket.socket(fileno=fd)
        service = GatewayService(
            app,
            host.strip("[]") or "127.0.0.1",
            int(port),
            log_level=os.environ.get("CRONWHEEL_LOG_LEVEL", "info").lower(),
            sock=sock,
        )
        if fd is None:
            log.info("gateway listening on %s/v1", service.url)
        service.run(stop_on_signals())
    finally:
        app.state.gateway.close()


def supervise(n: int, log) -> None:
    """Bind, start `n` workers on the socket, restart any that dies, and pass
    SIGTERM / SIGINT on to them."""
    from services.gateway.metrics_dir import MULTIPROC_ENV, mark_dead
    from services.gateway.ratelimit import create_table
    from services.gateway.service import listen, url_of

    host, _, port = config.http_addr().rpartition(":")
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
    stop = stop_on_signals()
    procs: list[subprocess.Popen | None] = [None] * n
    lock = threading.Lock()

    def start(i: int) -> None:
        procs[i] = subprocess.Popen(
            [sys.executable, "-m", "services.gateway.main"],
            env=env,
            pass_fds=(sock.fileno(),),
            preexec_fn=_die_with_parent,
        )

    try:
        for i in range(n):
            start(i)
        log.info("gateway listening on %s/v1 with %d worker processes", url_of(sock), n)
        while not stop.wait(0.5):
            with lock:
                for i, p in enumerate(procs):
                    if p is not None and p.poll() is not None:
                        log.error(
                            "gateway worker %d exited with %s; starting it again",
                            p.pid,
                            p.returncode,
                        )
                        mark_dead(metrics, p.pid)
                        start(i)
    finally:
        live = [p for p in procs if p is not None and p.poll() is None]
        for p in live:
            p.send_signal(signal.SIGTERM)
        for p in live:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
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
