"""The whole run lifecycle with every part a process: the timer fires, the relay
publishes, the dispatcher forwards to the queue topic, SDK workers start the
run and complete it over the gateway's HTTP worker protocol.

1. Dispatch latency at a steady 200 runs/s (200 jobs `every_ms: 1000`, anchors
   spread evenly over the second, 20 s warm-up, then a 30 s window): from when
   the run was due to go out -- its created_at (RunCreated: the firing
   transaction's clock), or its instant if later (the timer service fires
   ahead: the run is created before its instant and the relay publishes it at
   the instant) -- to (a) an SDK worker holding the record (its consumer's
   poll handed it over, before StartRun), and (b) the SDK handler's entry,
   i.e. after the worker's StartRun answered. Target: p99 <= 50 ms. The time
   to (a) is split by the records' timestamps (the relay's produce, the
   dispatcher's), read after the window, and each process's wait for a CPU
   is printed beside its CPU share. BENCH_STEADY_RATE sets another rate.
2. Full cycles per second: a storm of one-off jobs due at one instant (30k, or
   if the steady case could not keep up with 200/s, 1.5x what it managed over
   the 45 s of measuring, so a backlog stands throughout without firing runs
   that cannot finish); every run SUCCEEDED per second over the steady part
   (from the 10% mark of the storm's completions to the 90% mark, or to the end
   of measuring if the backlog was still there). Target: >= 1,000/s.

`--readers` adds two plain consumers (of every queue topic and of every runs
topic) to split the latency between the relay's and the dispatcher's hops.
They are not on by default: librdkafka fetches without sessions (no KIP-227),
so every record wakes each consumer of its partition with a fetch that the
broker answers partition by partition for all the consumer's partitions; the
two readers, 64 partitions between them, took the broker from 34% to 40% of a
core and this process from 4% to 10% at 200 runs/s, on a machine the steady
case keeps busy. The steady case runs first, so they read only its records. Each
figure is printed beside the CPU share of every process (PostgreSQL backends
per service), the CPU each spent per completed run, and the machine's load.
`--hold-only` measures (1) with the worker protocol's CPU taken off the machine:
after the warm-up the SDK workers take each record and start nothing. At 200
runs/s StartRun and CompleteRun (gateway, its PostgreSQL backends, the SDK's
HTTP) take about a core of this machine's two, which a deployment spends on
other hosts (the workers' own, a gateway scaled out); the dispatch path is the
same processes either way.
`--profile` runs the gateway under cProfile (each thread on its own CPU clock)
and prints where its CPU went.

This file also holds what bench_gateway.py reuses: `Platform` (the processes),
`CpuTimeline`, the gateway's /metrics read back (`http_counts`, `server_side`)
and the profile report.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pstats
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import deque
from pathlib import Path

import httpx
import psycopg
from common import (
    ROOT,
    JobBatch,
    Reader,
    bulk_jobs,
    check_like_create,
    completions_topic,
    cpu_seconds,
    create_tenants,
    delete_topics,
    describe,
    ensure_tenant_topics,
    fresh_database,
    grant,
    header,
    kafka_broker_pid,
    local_ports,
    machine_load,
    percentile,
    prefix_topics,
    say,
    tenant_kafka,
    vacuum_analyze,
    waited_seconds,
)

from cronwheel import config
from cronwheel.core.clock import now_ms, to_dt, to_ms
from cronwheel.kafka import Topics

QUEUE = "bench"  # the queue JobBatch.body() targets
TENANTS = 4  # a worker per tenant (its own key: the per-key rate limit is 1000/s)
WORKER_PROCS = int(os.environ.get("BENCH_WORKER_PROCS", "2"))
# Per tenant's Worker. A Worker starts at most its free slots per start-batch, one
# request at a time, so it tops out near concurrency / round trip: 16 slots over a
# 100 ms round trip (a loaded machine) is 160 runs/s. A no-op handler frees its
# slot at once, so slots cost nothing but bound the batch (RESULTS-lifecycle.md).
CONCURRENCY = int(os.environ.get("BENCH_WORKER_CONCURRENCY", "64"))
WARMUP_RUNS = 200
STEADY_EVERY_MS = 1_000
# The target's rate is 200/s; BENCH_STEADY_RATE shows how the latency grows with it.
STEADY_JOBS = int(os.environ.get("BENCH_STEADY_RATE", "200"))
# 20 s warm-up: past fresh partitions' one-time stall (docs/architecture.md).
STEADY_WARMUP_MS, STEADY_WINDOW_MS, SETTLE_MS = 20_000, 30_000, 15_000
STORM_MAX = 30_000
STORM_RUNS = int(os.environ.get("BENCH_STORM_RUNS", "0"))  # 0: sized from the steady case
STORM_MEASURE_S = float(os.environ.get("BENCH_STORM_SECONDS", "45"))
TARGET_RATE, TARGET_P99_MS = 1_000, 50
OPERATOR_KEY = "cwop_bench_" + uuid.uuid4().hex


# -- processes ----------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Platform:
    """`cronwheel serve NAME` processes and SDK worker processes against one
    database and topic prefix, stopped with SIGTERM (their clean shutdown) on
    exit. With `profile_to`, the gateway runs under cProfile (every thread) and
    writes its merged statistics there when it stops."""

    def __init__(self, url: str, prefix: str, services: tuple[str, ...], profile_to: Path | None):
        self.url = url
        self.services = services
        self.profile_to = profile_to
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.logdir = Path(tempfile.mkdtemp(prefix="cw-bench-lc-"))
        self.procs: dict[str, subprocess.Popen] = {}
        self.entry_files: list[Path] = []
        self.broker = kafka_broker_pid()
        drop = ("CRONWHEEL_METRICS_PORT", "CRONWHEEL_METRICS_ADDR", "CRONWHEEL_DEBUG")
        self.env = {k: v for k, v in os.environ.items() if k not in drop}
        self.env.update(
            DATABASE_URL=config.role_url(url, config.PG_PLATFORM_USER),  # not the owner
            KAFKA_BOOTSTRAP=config.kafka_bootstrap(),
            CRONWHEEL_TOPIC_PREFIX=prefix,
            CRONWHEEL_LOG_LEVEL=os.environ.get("CRONWHEEL_LOG_LEVEL", "WARNING"),
            CRONWHEEL_HTTP_ADDR=f"127.0.0.1:{self.port}",
            CRONWHEEL_OPERATOR_KEY=OPERATOR_KEY,
            CRONWHEEL_URL=self.base,
            PYTHONUNBUFFERED="1",
        )

    def _spawn(self, name: str, argv: list[str], **env: str) -> None:
        log = open(self.logdir / f"{name}.log", "wb")  # noqa: SIM115 - kept by the process
        self.procs[name] = subprocess.Popen(
            argv, cwd=ROOT, env={**self.env, **env}, stdout=log, stderr=subprocess.STDOUT
        )

    def __enter__(self) -> Platform:
        try:
            for name in self.services:
                argv = [sys.executable, "-m", "services.entrypoints", "serve", name]
                env = {}
                if name == "gateway" and self.profile_to is not None:
                    argv = [sys.executable, __file__, "--profiled-gateway", str(self.profile_to)]
                    env["CRONWHEEL_GATEWAY_WORKERS"] = "1"  # cProfile sees one process
                self._spawn(name, argv, **env)
            self._wait_ready()
        except BaseException:
            self.__exit__(*sys.exc_info())
            raise
        return self

    def start_workers(self, tenants: list[dict], topics: Topics, procs: int, concurrency: int):
        """`procs` worker processes; each runs one SDK Worker per tenant it serves
        (tenants dealt round-robin), `concurrency` each, a no-op handler that
        notes its entry time per run. Each Worker reads as its tenant's Kafka
        principal (common.tenant_kafka: made as the gateway makes it)."""
        for i in range(procs):
            mine = tenants[i::procs]
            if not mine:
                continue
            out = self.logdir / f"worker{i}.entries"
            self.entry_files.append(out)
            targets = [
                [topics.queue(t["tenant_id"], QUEUE), t["api_key"], t["kafka"]] for t in mine
            ]
            self._spawn(
                f"worker{i}",
                [sys.executable, __file__, "--worker", str(out), "--concurrency", str(concurrency)],
                BENCH_WORKER_TARGETS=json.dumps(targets),
            )

    def hold_only(self) -> None:
        """From now on the SDK workers start nothing (worker_process, SIGUSR1)."""
        for name, p in self.procs.items():
            if name.startswith("worker"):
                p.send_signal(signal.SIGUSR1)

    def _wait_ready(self, timeout: float = 60.0) -> None:
        """Timer and relay hold all 1024 partitions (the database is ours); the
        gateway's /readyz answers 200."""
        deadline = time.monotonic() + timeout
        leasing = [n for n in self.services if n in ("timer", "relay")]
        with psycopg.connect(self.url, autocommit=True) as conn:
            while True:
                self.check_alive()
                held = dict(
                    conn.execute(
                        "SELECT service, count(*) FROM partition_leases"
                        " WHERE owner IS NOT NULL AND expires_at > now() GROUP BY service"
                    ).fetchall()
                )
                ready = all(held.get(n, 0) == 1024 for n in leasing)
                if ready and "gateway" in self.services:
                    try:
                        ready = httpx.get(f"{self.base}/readyz", timeout=2).status_code == 200
                    except httpx.HTTPError:
                        ready = False
                if ready:
                    return
                if time.monotonic() > deadline:
                    raise RuntimeError(f"services not ready after {timeout}s: leases {held}")
                time.sleep(0.1)

    def check_alive(self) -> None:
        for name, p in self.procs.items():
            if p.poll() is not None:
                tail = (self.logdir / f"{name}.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"{name} exited with {p.returncode}:\n{tail}")

    def pids(self) -> dict[str, int]:
        """Each process, the PostgreSQL backends serving it (`<name>-pg`, found by
        client port), this process and the shared Kafka broker."""
        pids = {n: p.pid for n, p in self.procs.items() if p.poll() is None}
        for name, pid in list(pids.items()):  # a supervisor's workers (gateway)
            for i, child in enumerate(child_pids(pid)):
                pids[f"{name}-w{i}"] = child
        with psycopg.connect(self.url, autocommit=True) as conn:
            backends = conn.execute(
                "SELECT client_port, pid FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            ).fetchall()
        for name, pid in list(pids.items()):
            with contextlib.suppress(OSError):
                ports = local_ports(pid)
                for i, (_port, bpid) in enumerate(b for b in backends if b[0] in ports):
                    pids[f"{name}-pg{i}"] = bpid
        pids["bench"] = os.getpid()
        if self.broker:
            pids["kafka-broker(shared)"] = self.broker
        return pids

    def cpu(self) -> dict[str, float]:
        """CPU seconds so far per process, backends summed per service, and the
        whole machine's busy CPU seconds as `machine`; `wait:<name>` the seconds
        its threads waited for a CPU."""
        out: dict[str, float] = {"machine": machine_busy_seconds()}
        for name, pid in self.pids().items():
            key = re.sub(r"-pg\d+$", "-pg", re.sub(r"-w\d+", "", name))
            out[key] = out.get(key, 0.0) + cpu_seconds(pid)
            out[f"wait:{key}"] = out.get(f"wait:{key}", 0.0) + waited_seconds(pid)
        return out

    def stop(self, names: list[str]) -> None:
        for name in names:
            p = self.procs[name]
            if p.poll() is None:
                p.terminate()
        for name in names:
            try:
                self.procs[name].wait(30)
            except subprocess.TimeoutExpired:
                self.procs[name].kill()
                self.procs[name].wait(5)

    def __exit__(self, *exc) -> None:
        # Workers first (they drain through the gateway), then the services.
        workers = [n for n in self.procs if n.startswith("worker")]
        self.stop(workers)
        self.stop([n for n in self.procs if n not in workers])
        clean = all(p.returncode == 0 for p in self.procs.values())
        if clean and exc[0] is None and not os.environ.get("BENCH_KEEP_LOGS"):
            shutil.rmtree(self.logdir, ignore_errors=True)
        else:
            say(f"process logs kept in {self.logdir}")


def child_pids(pid: int) -> list[int]:
    """The direct children of a process (the gateway's worker processes)."""
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(x) for x in text.split()]


def machine_busy_seconds() -> float:
    """All cores' non-idle CPU seconds since boot (/proc/stat)."""
    f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(f[:8]) - f[3] - f[4]) / os.sysconf("SC_CLK_TCK")


class CpuTimeline:
    """Samples Platform.cpu() every `every_s` in a thread, so the CPU share of
    each process can be read for any interval afterwards."""

    def __init__(self, platform: Platform, every_s: float = 1.0):
        self.platform = platform
        self.every_s = every_s
        self.samples: list[tuple[int, dict[str, float]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="cpu-timeline")

    def __enter__(self) -> CpuTimeline:
        self._thread.start()
        return self

    def _loop(self) -> None:
        while True:
            with contextlib.suppress(Exception):  # a process that just exited
                self.samples.append((now_ms(), self.platform.cpu()))
            if self._stop.wait(self.every_s):
                return

    def used(
        self, start_ms: int, end_ms: int, waited: bool = False
    ) -> tuple[float, dict[str, float]]:
        """(wall seconds, CPU seconds per process) between the samples nearest the
        interval's ends; `machine` is every core's busy time. With `waited`, the
        seconds each process's threads waited for a CPU instead."""
        if len(self.samples) < 2:
            return 0.0, {}
        a = min(self.samples, key=lambda s: abs(s[0] - start_ms))
        b = min(self.samples, key=lambda s: abs(s[0] - end_ms))
        delta = {n: b[1][n] - a[1].get(n, 0.0) for n in b[1]}
        if waited:
            delta = {n[5:]: c for n, c in delta.items() if n.startswith("wait:")}
        else:
            delta = {n: c for n, c in delta.items() if not n.startswith("wait:")}
        return (b[0] - a[0]) / 1000, delta

    def share(self, start_ms: int, end_ms: int) -> str:
        """Cores used per process over the interval (one core = 100%)."""
        wall, used = self.used(start_ms, end_ms)
        if wall <= 0:
            return "no samples"
        machine = used.pop("machine", 0.0)
        parts = [f"{n} {100 * c / wall:.0f}%" for n, c in sorted(used.items(), key=lambda x: -x[1])]
        return (
            f"whole machine {100 * machine / wall:.0f}% of {100 * (os.cpu_count() or 1)}%;"
            f" {', '.join(parts)} (one core = 100%, {wall:.0f} s)"
        )

    def waits(self, start_ms: int, end_ms: int) -> str:
        """Per process over the interval: how long its threads were runnable but
        waited for a CPU, per second of CPU they got. On a saturated machine every
        wake-up queues, and each hop of a run's way is a few wake-ups."""
        _wall, used = self.used(start_ms, end_ms)
        _wall, waited = self.used(start_ms, end_ms, waited=True)
        busy = sorted((n for n in waited if used.get(n, 0) > 0.3), key=lambda n: -used[n])
        return ", ".join(f"{n} {waited[n] / used[n]:.1f}" for n in busy)

    def per_unit(self, start_ms: int, end_ms: int, units: int) -> str:
        """CPU milliseconds per unit of work (a run, a request) per process."""
        _wall, used = self.used(start_ms, end_ms)
        used.pop("machine", None)
        return ", ".join(
            f"{n} {1000 * c / max(units, 1):.2f}"
            for n, c in sorted(used.items(), key=lambda x: -x[1])
            if c > 0 and "(shared)" not in n
        )

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(10)


def scrape(base: str) -> str:
    """The gateway's /metrics text."""
    return httpx.get(f"{base}/metrics", timeout=10).text


def http_counts(base: str) -> dict[tuple[str, str], float]:
    """The gateway's cronwheel_http_requests_total by (route, status)."""
    text = scrape(base)
    out: dict[tuple[str, str], float] = {}
    for m in re.finditer(r"^cronwheel_http_requests_total\{(.*)\} (\S+)$", text, flags=re.M):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        key = (labels.get("route", "?"), labels.get("status", "?"))
        out[key] = out.get(key, 0.0) + float(m.group(2))
    return out


def server_side(before: str, after: str, kind: str) -> str:
    """The gateway's own histogram (request received -> response started) for the
    `kind` route over the bucket counts that moved between two scrapes of
    /metrics; p50 and p99 interpolated within the buckets."""
    moved: dict[float, float] = {}
    for text, sign in ((after, 1), (before, -1)):
        for m in re.finditer(r"^cronwheel_http_request_seconds_bucket\{(.*)\} (\S+)$", text, re.M):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
            if labels.get("route", "").endswith("/" + kind):
                le = float(labels["le"])
                moved[le] = moved.get(le, 0.0) + sign * float(m.group(2))
    bounds = sorted(moved)
    if not bounds or moved[bounds[-1]] <= 0:
        return "no requests"
    total = moved[bounds[-1]]

    def quantile(q: float) -> str:
        lo_bound, lo_count = 0.0, 0.0
        for b in bounds:
            if moved[b] >= q * total:
                if b == float("inf"):
                    return f"> {lo_bound * 1000:.0f} ms"
                share = (q * total - lo_count) / max(moved[b] - lo_count, 1e-9)
                return f"{(lo_bound + (b - lo_bound) * share) * 1000:.1f} ms"
            lo_bound, lo_count = b, moved[b]
        return "?"

    return f"p50 {quantile(0.5)}, p99 {quantile(0.99)}"


def answered(counts: dict[tuple[str, str], float], verb: str) -> float:
    """How many `verb` (start, complete) requests got a 200 in http_counts()."""
    return sum(
        n for (route, status), n in counts.items() if route.endswith(f"/{verb}") and status == "200"
    )


def per_request(before: dict, after: dict, runs: int) -> str:
    """Runs per start / complete request (single or batch) between two http_counts."""
    moved = {k: after[k] - before.get(k, 0.0) for k in after}
    out = []
    for verb in ("start", "complete"):
        n = sum(c for (route, _s), c in moved.items() if route.rsplit("/", 1)[-1].startswith(verb))
        out.append(f"{verb} {runs / n:.1f}" if n else f"{verb}: no requests")
    return ", ".join(out)


def n_steady_all(conn, due: int) -> int:
    """The storm's runs started so far (each started once, by one request item)."""
    return conn.execute(
        "SELECT count(*) FROM runs_daily WHERE scheduled_at = %s AND started_at IS NOT NULL",
        [to_dt(due)],
    ).fetchone()[0]


def http_delta(before: dict, after: dict) -> str:
    moved = {k: after[k] - before.get(k, 0.0) for k in after if after[k] != before.get(k, 0.0)}
    return ", ".join(
        f"{route.rsplit('/', 1)[-1]} {status}: {int(n)}"
        for (route, status), n in sorted(moved.items())
    )


# -- the profiled gateway -------------------------------------------------------


def profiled_gateway(out: str) -> None:
    """`cronwheel serve gateway` with cProfile in every thread (the event loop and
    the threadpool that runs the sync endpoints), timed by each thread's CPU
    clock: with the wall clock, a call that releases the GIL (every libpq call)
    would be charged the time its thread waits to get it back. Merged
    statistics go to `out` when the process stops."""
    import cProfile

    profiles: list[cProfile.Profile] = []

    def begin(*_args) -> None:  # the first profile event of a new thread
        prof = cProfile.Profile(time.thread_time)
        profiles.append(prof)
        prof.enable()  # replaces this hook for the thread

    main_prof = cProfile.Profile(time.thread_time)
    profiles.append(main_prof)
    threading.setprofile(begin)
    from services.gateway.main import main

    main_prof.enable()
    try:
        main()
    finally:
        main_prof.disable()
        threading.setprofile(None)
        merged = None
        for prof in profiles:
            try:
                stats = pstats.Stats(prof)
            except TypeError:  # a thread that recorded nothing
                continue
            merged = stats if merged is None else merged.add(stats)
        if merged is not None:
            merged.dump_stats(out)


def profile_report(path: Path, top: int = 22) -> None:
    """Where the gateway's CPU went: by package, the functions with the most own
    CPU, and the cumulative CPU of the handlers and store calls."""
    if not path.exists():
        say(f"profile: no statistics written to {path}")
        return
    st = pstats.Stats(str(path))
    rows = [
        (tt, ct, nc, file, line, func)
        for (file, line, func), (_cc, nc, tt, ct, _callers) in st.stats.items()
    ]
    total = sum(r[0] for r in rows) or 1e-9
    by_pkg: dict[str, float] = {}
    for tt, _ct, _nc, file, _line, _func in rows:
        by_pkg[_package(file)] = by_pkg.get(_package(file), 0.0) + tt
    say(f"profile: {total:.1f} s of CPU in all threads (cProfile itself makes Python ~2x slower)")
    say(
        "profile: own CPU by package: "
        + ", ".join(
            f"{p} {100 * t / total:.0f}%"
            for p, t in sorted(by_pkg.items(), key=lambda x: -x[1])[:14]
        )
    )
    say("profile: top functions by own CPU (% of all, own s, cumulative s, calls, where):")
    for tt, ct, nc, file, line, func in sorted(rows, reverse=True)[:top]:
        say(
            f"profile:   {100 * tt / total:4.1f}% {tt:6.2f} {ct:7.2f} {nc:8d}"
            f"  {_short(file)}:{line} {func}"
        )
    say("profile: cronwheel's and the gateway's functions by cumulative CPU:")
    ours = [r for r in rows if re.search(r"/(cronwheel|services)/", r[3])]
    for tt, ct, nc, file, line, func in sorted(ours, key=lambda r: -r[1])[:16]:
        say(
            f"profile:   {100 * ct / total:4.1f}% {tt:6.2f} {ct:7.2f} {nc:8d}"
            f"  {_short(file)}:{line} {func}"
        )


def _package(file: str) -> str:
    if file == "~":
        return "builtins"
    m = re.search(r"site-packages/([A-Za-z0-9_]+)", file)
    if m:
        return m.group(1)
    for name in ("cronwheel", "services"):
        if f"/{name}/" in file:
            return name
    m = re.search(r"python3\.\d+/([A-Za-z0-9_]+)", file)
    return f"stdlib:{m.group(1)}" if m else Path(file).name


def _short(file: str) -> str:
    for cut in ("site-packages/", "/main/", "python3.11/"):
        if cut in file:
            return file.split(cut, 1)[1]
    return file


# -- the SDK worker process -------------------------------------------------------


def worker_process(out: str, concurrency: int) -> None:
    """One process, one SDK Worker per (topic, key) in BENCH_WORKER_TARGETS, each in
    a thread; the handler notes (run_id, entry ms) and returns, and each Worker
    notes when its consumer's poll handed it a record ("held", before StartRun).
    Both go to `out` every half second; SIGTERM stops and drains every Worker.
    After SIGUSR1 (--hold-only) the Workers take each record and start nothing:
    its offset is done, the run stays PENDING."""
    from cronwheel.sdk import Worker

    entries: deque[tuple] = deque()  # append and popleft are thread-safe
    hold_only = threading.Event()

    class Timed(Worker):
        def _read(self, consumer, n: int, timeout: float):
            msgs = Worker._read(consumer, n, timeout)
            ms = now_ms()
            for m in msgs:
                if m.error() is None:
                    key = m.key().decode()
                    # The queue record's timestamp: when the dispatcher produced it.
                    entries.extend((("held", key, ms), ("queued", key, m.timestamp()[1])))
            return msgs

        def _start(self, msgs, pool) -> None:
            if not hold_only.is_set():
                return super()._start(msgs, pool)
            for m in msgs:
                self._offsets.finish(m.topic(), m.partition(), m.offset())

    def handle(run) -> None:
        entries.append((run.run_id, now_ms()))

    workers = [
        Timed(topic, handle, api_key=key, concurrency=concurrency, drain_seconds=5, **creds)
        for topic, key, creds in json.loads(os.environ["BENCH_WORKER_TARGETS"])
    ]
    signal.signal(signal.SIGTERM, lambda *_: [w.stop() for w in workers])
    signal.signal(signal.SIGINT, lambda *_: [w.stop() for w in workers])
    signal.signal(signal.SIGUSR1, lambda *_: hold_only.set())
    threads = [threading.Thread(target=w.run, name=f"worker-{i}") for i, w in enumerate(workers)]
    for t in threads:
        t.start()
    with open(out, "a") as f:
        while True:
            alive = any(t.is_alive() for t in threads)
            while entries:
                f.write(" ".join(map(str, entries.popleft())) + "\n")
            f.flush()
            if not alive:
                break
            threads[0].join(0.5)  # wakes for SIGTERM's handler in this (main) thread


def read_entries(files: list[Path], kind: str = "") -> dict[str, int]:
    """run_id -> the first handler entry (ms) the workers noted so far; with kind
    "held" the first time a worker's poll handed it the run's record, with
    "queued" that record's timestamp (the dispatcher's produce)."""
    got: dict[str, int] = {}
    for path in files:
        with contextlib.suppress(FileNotFoundError):
            for line in path.read_text().splitlines():
                *noted, run_id, ms = line.split()
                if (noted[0] if noted else "") == kind:
                    got.setdefault(run_id, int(ms))
    return got


def produced_at(
    keys: list[str], platform: Platform, runs: list[str], runs_reader: Reader | None
) -> dict[str, dict]:
    """Per run: when the relay produced it (the run topic record's timestamp, read
    after the window so that no extra consumer loads the machine during it, or
    from `--readers`' consumer, which has them already) and when the dispatcher
    did (the queue record's, as the SDK worker read it)."""
    with contextlib.nullcontext(runs_reader) if runs_reader else Reader(runs) as reader:
        deadline = time.monotonic() + 30
        while True:
            relayed = {k.decode(): a.produced_ms for k, a in reader.arrivals.items()}
            if len(relayed) >= len(keys) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
    return {"relay": relayed, "dispatcher": read_entries(platform.entry_files, "queued")}


def dump_runs(path: Path, keys: list[str], times: dict[str, dict[str, int]]) -> None:
    """One line per run, tab-separated: run_id, then ms (empty if never seen):
    due, the relay's produce, the dispatcher's produce, held, handler entry."""
    columns = ("due", "relay", "dispatcher", "held", "entry")
    with path.open("w") as f:
        for k in keys:
            f.write("\t".join([k, *(str(times[c].get(k, "")) for c in columns)]) + "\n")


def split(times: dict[str, dict[str, int]], keys: list[str]) -> None:
    """Where the time from due to held went, per stage, from the timestamps."""
    stages = [
        ("due -> the relay's produce() (timer, relay)", "due", "relay"),
        ("the relay's produce() -> the dispatcher's", "relay", "dispatcher"),
        ("the dispatcher's produce() -> held (SDK poll)", "dispatcher", "held"),
    ]
    seen = [k for k in keys if all(k in times[c] for c in ("due", "relay", "dispatcher", "held"))]
    say(f"steady:   where it went, by the records' timestamps ({len(seen):,} runs):")
    for label, a, b in stages:
        say(f"steady:     {label:48} {_describe([times[b][k] - times[a][k] for k in seen])}")


# -- the benchmark ---------------------------------------------------------------


def add_jobs(conn, topics: Topics, tenants: list[dict], batch: JobBatch) -> None:
    """common.bulk_jobs, then the timers' tenant_id where the schema has one
    (migration 0005; bulk_jobs leaves it ''), then check_like_create."""
    seed = bulk_jobs(conn, tenants, batch)
    has_tenant = conn.execute(
        "SELECT 1 FROM information_schema.columns"
        " WHERE table_name = 'timers' AND column_name = 'tenant_id'"
    ).fetchone()
    if has_tenant:
        conn.execute(
            "UPDATE timers t SET tenant_id = j.tenant_id FROM jobs j"
            " WHERE t.kind = 'job' AND t.tenant_id = '' AND j.partition_id = t.partition_id"
            " AND j.job_id = t.owner_id"
        )
    check_like_create(conn, topics, tenants, batch, seed)


def wait_succeeded(conn, where: str, args: list, want: int, timeout: float, platform) -> int:
    deadline = time.monotonic() + timeout
    while True:
        got = conn.execute(
            f"SELECT count(*) FROM runs_daily WHERE state = 'SUCCEEDED' AND {where}", args
        ).fetchone()[0]
        if got >= want or time.monotonic() > deadline:
            return got
        platform.check_alive()
        time.sleep(0.25)


def warm_up(conn, platform: Platform, tenants: list[dict], topics: Topics) -> None:
    """A few one-off runs through the whole path: consumer groups joined, pools
    filled, topics known everywhere."""
    due = now_ms() + 1500
    add_jobs(conn, topics, tenants, JobBatch(WARMUP_RUNS, now_ms(), at_ms=due, name="warmup"))
    t0 = time.monotonic()
    done = wait_succeeded(conn, "scheduled_at = %s", [to_dt(due)], WARMUP_RUNS, 90, platform)
    if done < WARMUP_RUNS:
        raise RuntimeError(f"warm-up: only {done}/{WARMUP_RUNS} runs SUCCEEDED in 90 s")
    say(f"warm-up: {WARMUP_RUNS} one-off runs SUCCEEDED {time.monotonic() - t0:.1f} s after insert")


def hops(since_due, created: dict, reader: Reader, runs_reader: Reader) -> None:
    """`--readers`: the latency split between the relay's and the dispatcher's
    hops, from two plain consumers of every queue and runs topic."""
    queue, runs = reader.arrivals, runs_reader.arrivals
    arrivals = {k: a for k in created if (a := queue.get(k.encode()))}
    on_runs = {k: a for k in arrivals if (a := runs.get(k.encode()))}
    to_queue = since_due({k: a.received_ms for k, a in arrivals.items()})
    relay_hop = [on_runs[k].received_ms - created[k] for k in on_runs]
    relay_read = [on_runs[k].produced_ms - created[k] for k in on_runs]
    relay_kafka = [on_runs[k].received_ms - on_runs[k].produced_ms for k in on_runs]
    dispatcher_hop = [arrivals[k].received_ms - on_runs[k].received_ms for k in on_runs]
    dispatcher_read = [arrivals[k].produced_ms - on_runs[k].received_ms for k in on_runs]
    say(f"steady: due -> readable on the queue topic (plain consumer): {describe(to_queue)}")
    say(
        f"steady:   of which due -> readable on the runs topic (relay):       {_describe(relay_hop)}"
    )
    say(f"steady:     due -> the relay's produce():                       {_describe(relay_read)}")
    say(f"steady:     the relay's produce() -> readable:                  {_describe(relay_kafka)}")
    say(
        f"steady:   and runs topic -> queue topic (dispatcher):             {_describe(dispatcher_hop)}"
    )
    say(
        f"steady:     readable on the runs topic -> its produce():         {_describe(dispatcher_read)}"
    )


def steady(
    conn,
    url,
    platform,
    cpu: CpuTimeline,
    reader: Reader | None,
    runs_reader: Reader | None,
    tenants,
    topics,
    dump: Path | None = None,
    hold_only: bool = False,
) -> float:
    """200 every-second jobs, anchors spread over the second: dispatch latency.
    Returns the completions per second the window saw. `hold_only`: the workers
    start nothing (Platform.hold_only), so only the time to held is measured."""
    batch = JobBatch(  # first due from 1.5 s on: check_like_create sees them unfired
        STEADY_JOBS,
        now_ms() - STEADY_EVERY_MS + 1500,
        every_ms=STEADY_EVERY_MS,
        spread_ms=STEADY_EVERY_MS,
        name="steady",
    )
    add_jobs(conn, topics, tenants, batch)
    vacuum_analyze(url)
    start = now_ms() + STEADY_WARMUP_MS
    end = start + STEADY_WINDOW_MS
    while now_ms() < start:
        time.sleep(0.05)
    http0 = http_counts(platform.base)
    while now_ms() < end:
        platform.check_alive()
        time.sleep(0.2)
    http1 = http_counts(platform.base)
    # Stop the jobs: their timers go in one statement, which waits for a firing
    # transaction holding one. (Jobs.pause per job can deadlock with the firing
    # loop: it locks the job, then the timer; the loop locks timers, then jobs.)
    conn.execute(
        "DELETE FROM timers WHERE kind = 'job' AND owner_id IN"
        " (SELECT job_id FROM jobs WHERE name LIKE 'steady-%%')"
    )
    rows = conn.execute(
        "SELECT run_id, created_at, scheduled_at FROM runs_daily WHERE job_id IN"
        " (SELECT job_id FROM jobs WHERE name LIKE 'steady-%%')"
        " AND scheduled_at >= %s AND scheduled_at < %s",
        [to_dt(start), to_dt(end)],
    ).fetchall()
    expected = STEADY_JOBS * STEADY_WINDOW_MS // STEADY_EVERY_MS
    keys = [r[0] for r in rows]
    settle = now_ms() + SETTLE_MS
    while True:  # the window's last runs, up to SETTLE_MS after it
        held = read_entries(platform.entry_files, "held")
        entries = held if hold_only else read_entries(platform.entry_files)
        have = [sum(1 for k in keys if k in got) for got in (entries, held)]
        if reader is not None:
            arrived = reader.arrivals
            have.append(sum(1 for k in keys if k.encode() in arrived))
        if min(have) >= len(keys) or now_ms() > settle:
            break
        time.sleep(0.5)
    # From when the run was due to go out: its RunCreated, or with firing ahead
    # (the default: created_at before the instant, the relay holding the record)
    # its instant. The steady jobs have no jitter.
    created = {r[0]: max(to_ms(r[1]), to_ms(r[2])) for r in rows}
    unfired = [float("inf")] * max(0, expected - len(rows))  # instants never fired

    def since_due(got: dict[str, float]) -> list[float]:
        return [got[k] - created[k] if k in got else float("inf") for k in keys] + unfired

    to_worker, to_handler = since_due(held), since_due(entries)
    firing = [to_ms(r[1]) - to_ms(r[2]) for r in rows]
    say(
        f"steady: {STEADY_JOBS} jobs every {STEADY_EVERY_MS} ms, anchors spread over the second;"
        f" {len(rows):,} of {expected:,} instants of the {STEADY_WINDOW_MS // 1000} s window fired;"
        f" {sum(1 for k in keys if k in held):,} of them held by an SDK worker and"
        f" {sum(1 for k in keys if k in entries):,} in a handler by {SETTLE_MS // 1000} s after"
        " the window (a missing one counts as infinitely late)"
    )
    say(f"steady: due -> an SDK worker holds the record (its poll):   {describe(to_worker)}")
    if not hold_only:
        say(
            f"steady: due -> SDK handler entry (after StartRun):              {describe(to_handler)}"
        )
    times = {"due": created, "held": held, "entry": entries}
    runs = [topics.runs(t["tenant_id"]) for t in tenants]
    times |= produced_at(keys, platform, runs, runs_reader)
    split(times, keys)
    if dump is not None:
        dump_runs(dump, keys, times)
    if reader is not None and runs_reader is not None:
        hops(since_due, created, reader, runs_reader)
    say(f"steady:   for context, scheduled_at -> created_at (firing):      {_describe(firing)}")
    say(f"steady:   requests in the window: {http_delta(http0, http1)}")
    say(f"steady:   CPU over the window: {cpu.share(start, end)}")
    say(f"steady:   seconds waiting for a CPU per second on one: {cpu.waits(start, end)}")
    say(f"steady: machine after: {machine_load()}")
    w99, h99 = percentile(to_worker, 99), percentile(to_handler, 99)
    verdict = "met" if w99 <= TARGET_P99_MS else "MISSED"
    without = ", no StartRun on these cores (--hold-only)" if hold_only else ""
    say(
        f"RESULT dispatch latency at {STEADY_JOBS} runs/s, due -> an SDK worker holds the record"
        f"{without}: p50 {percentile(to_worker, 50):.0f} ms, p99 {w99:.0f} ms"
        f" (target p99 <= {TARGET_P99_MS} ms: {verdict})"
    )
    if hold_only:
        return 0.0
    verdict = "met" if h99 <= TARGET_P99_MS else "MISSED"
    say(
        f"RESULT dispatch latency at {STEADY_JOBS} runs/s, due -> SDK handler entry:"
        f" p50 {percentile(to_handler, 50):.0f} ms, p99 {h99:.0f} ms"
        f" (target p99 <= {TARGET_P99_MS} ms: {verdict})"
    )
    # Let the steady runs finish before the storm.
    steady_jobs = "job_id IN (SELECT job_id FROM jobs WHERE name LIKE 'steady-%%')"
    total = conn.execute(f"SELECT count(*) FROM runs_daily WHERE {steady_jobs}").fetchone()[0]
    done = wait_succeeded(conn, steady_jobs, [], total, 30, platform)
    if done < total:
        say(f"steady: {total - done:,} steady runs still unfinished 30 s on; the storm follows")
    # Runs completed in the window (a complete-batch request completes several).
    completed = conn.execute(
        "SELECT count(*) FROM runs_daily WHERE state = 'SUCCEEDED' AND finished_at BETWEEN %s AND %s",
        [to_dt(start), to_dt(end)],
    ).fetchone()[0]
    return completed / (STEADY_WINDOW_MS / 1000)


def storm(conn, url, platform, cpu: CpuTimeline, tenants, topics, steady_rate: float) -> float:
    """One-off jobs due together; completions per second while the backlog stands.
    How many: STORM_MAX, or if the steady case could not keep up with 200/s,
    1.5 x what it managed over the measuring time (the backlog outlasts the
    measurement, and firing more runs than can finish would only take CPU from
    the rest)."""
    n = STORM_RUNS or (
        STORM_MAX
        if steady_rate >= 0.95 * STEADY_JOBS * 1000 / STEADY_EVERY_MS
        else max(2_000, min(STORM_MAX, int(1.5 * steady_rate * STORM_MEASURE_S)))
    )
    t0 = now_ms()
    due = t0 + n // 10 + 8000  # 10k jobs/s insert with margin, then VACUUM
    batch = JobBatch(n, t0, at_ms=due, name="storm")
    add_jobs(conn, topics, tenants, batch)
    inserted = now_ms()
    vacuum_analyze(url)
    if now_ms() > due - 200:
        say(f"storm: warning: the insert and VACUUM ended {now_ms() - due} ms after due - 200 ms")
    while now_ms() < due:
        time.sleep(0.01)
    http0, text0 = http_counts(platform.base), scrape(platform.base)
    stop_at = due + int(STORM_MEASURE_S * 1000)
    done = 0
    while now_ms() < stop_at:
        platform.check_alive()
        done = conn.execute(
            "SELECT count(*) FROM runs_daily WHERE scheduled_at = %s AND state = 'SUCCEEDED'",
            [to_dt(due)],
        ).fetchone()[0]
        if done >= n:
            break
        time.sleep(1.0)
    end = now_ms()
    http1, text1 = http_counts(platform.base), scrape(platform.base)
    created, started, finished = (
        sorted(to_ms(x) for (x,) in conn.execute(
            f"SELECT {col} FROM runs_daily WHERE scheduled_at = %s AND {col} IS NOT NULL",
            [to_dt(due)],
        ))
        for col in ("created_at", "started_at", "finished_at")
    )  # fmt: skip
    finished = [f for f in finished if f <= end]
    all_done = len(finished) >= n
    say(
        f"storm: {n:,} one-off jobs due at one instant (inserted in"
        f" {(inserted - t0) / 1000:.1f} s, {due - inserted} ms before due);"
        f" {len(finished):,} SUCCEEDED by +{(end - due) / 1000:.1f} s"
        + ("" if all_done else " (measuring stopped with a backlog left)")
    )
    say(
        f"storm:   created {_span(created, due)} ms (timer); started {_span(started, due)} ms;"
        f" SUCCEEDED {_span(finished, due)} ms"
    )
    if all_done:  # the 10% and 90% marks of the storm's completions
        lo, hi = finished[len(finished) // 10], finished[(len(finished) * 9) // 10 - 1]
    elif len(finished) >= 100:  # from its 10% mark to the end: the backlog stood throughout
        lo, hi = finished[len(finished) // 10], end
    else:  # still behind an earlier backlog (the steady case's): count those completions
        lo, hi = due + 5000, end
    # Every run that completed in the interval (a steady run left over counts too).
    n_steady = conn.execute(
        "SELECT count(*) FROM runs_daily WHERE state = 'SUCCEEDED' AND finished_at BETWEEN %s AND %s",
        [to_dt(lo), to_dt(hi)],
    ).fetchone()[0]
    rate = n_steady / max((hi - lo) / 1000, 1e-3)
    say(
        f"storm: full cycles (fired, dispatched, started, completed) {rate:,.0f}/s over the steady"
        f" part, +{(lo - due) / 1000:.1f}..+{(hi - due) / 1000:.1f} s ({n_steady:,} runs)"
        + (f"; {n / ((finished[-1] - due) / 1000):,.0f}/s due -> last" if all_done else "")
    )
    say(f"storm:   requests: {http_delta(http0, http1)}")
    held = [
        to_ms(f) - to_ms(s)
        for s, f in conn.execute(
            "SELECT started_at, finished_at FROM runs_daily WHERE scheduled_at = %s"
            " AND finished_at IS NOT NULL",
            [to_dt(due)],
        )
    ]
    say(
        f"storm:   inside the gateway (its histogram, request read -> response started):"
        f" start {server_side(text0, text1, 'start')};"
        f" complete {server_side(text0, text1, 'complete')};"
        f" start-batch {server_side(text0, text1, 'start-batch')};"
        f" complete-batch {server_side(text0, text1, 'complete-batch')}"
    )
    say(f"storm:   runs per request: {per_request(http0, http1, n_steady_all(conn, due))}")
    say(
        f"storm:   StartRun -> CompleteRun of a no-op handler (started_at -> finished_at): {_describe(held)}"
    )
    say(f"storm:   CPU over the steady part: {cpu.share(lo, hi)}")
    say(f"storm:   CPU ms per completed run (steady part): {cpu.per_unit(lo, hi, n_steady)}")
    _wall, used = cpu.used(lo, hi)
    if used.get("gateway") and n_steady:
        per_run = used["gateway"] / n_steady
        ours = sum(
            c for p, c in used.items() if p not in ("machine", "bench") and "(shared)" not in p
        )
        ours /= n_steady
        say(
            f"storm:   the gateway (one process, one GIL) spent {1000 * per_run:.2f} ms of CPU per"
            f" run (a start and a complete): with a core to itself it would top out near"
            f" {1 / per_run:,.0f} runs/s; the platform's processes and their PostgreSQL backends"
            f" together spent {1000 * ours:.1f} ms per run (the shared Kafka broker not"
            f" counted): ~{1 / ours:,.0f} runs/s per core they would have to themselves"
        )
    say(f"storm: machine after: {machine_load()}")
    say(
        f"RESULT full cycles per second: {rate:,.0f}/s"
        f" (target >= {TARGET_RATE:,}/s: {'met' if rate >= TARGET_RATE else 'MISSED'})"
    )
    return rate


def _describe(values: list[float]) -> str:
    return describe(values) if values else "no samples"


def _span(times: list[int], origin: int) -> str:
    return f"+{times[0] - origin}..+{times[-1] - origin}" if times else "none"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--profile", action="store_true", help="cProfile the gateway process")
    parser.add_argument("--steady-only", action="store_true", help="skip the storm")
    parser.add_argument(
        "--hold-only",
        action="store_true",
        help="after the warm-up the SDK workers take each record and start nothing: the"
        " dispatch path's latency without the worker protocol's CPU on the same cores"
        " (implies --steady-only)",
    )
    parser.add_argument(
        "--dump",
        type=Path,
        help="write each steady run's due, produce (relay, dispatcher), held and entry ms (TSV)",
    )
    parser.add_argument(
        "--readers",
        action="store_true",
        help="split the steady latency by hop with two plain consumers of every runs and"
        " queue topic (they load the broker: see the docstring)",
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--concurrency", type=int, default=CONCURRENCY, help=argparse.SUPPRESS)
    parser.add_argument("--profiled-gateway", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker_process(args.worker, args.concurrency)
    if args.profiled_gateway:
        return profiled_gateway(args.profiled_gateway)

    header("bench_lifecycle: fire -> dispatch -> SDK worker start -> complete")
    prefix = f"bench{uuid.uuid4().hex[:8]}"
    topics = Topics(prefix)
    grant(prefix)
    profile = Path(tempfile.mkdtemp(prefix="cw-bench-prof-")) / "gateway.prof"
    with fresh_database() as url:
        with psycopg.connect(url, autocommit=True) as conn:
            tenants = create_tenants(conn, TENANTS)
        for t in tenants:
            t["kafka"] = tenant_kafka(topics, t["tenant_id"])
        queues = [topics.queue(t["tenant_id"], QUEUE) for t in tenants]
        runs = [topics.runs(t["tenant_id"]) for t in tenants]
        ensure_tenant_topics(runs + queues)  # one partition each, as the platform makes them
        completions_topic(topics)  # no workflow service here to create it
        say(
            f"setup: fresh database, {TENANTS} tenants; `cronwheel serve gateway timer relay"
            f" dispatcher` as processes with default settings"
            f"{' (the gateway under cProfile)' if args.profile else ''};"
            f" {WORKER_PROCS} SDK worker processes, one Worker per tenant"
            f" ({TENANTS // WORKER_PROCS} each), concurrency {CONCURRENCY} each, no-op handler"
        )
        try:
            with (
                Platform(
                    url,
                    prefix,
                    ("gateway", "timer", "relay", "dispatcher"),
                    profile if args.profile else None,
                ) as platform,
                psycopg.connect(url, autocommit=True) as conn,
            ):
                platform.start_workers(tenants, topics, WORKER_PROCS, CONCURRENCY)
                warm_up(conn, platform, tenants, topics)
                if args.hold_only:
                    platform.hold_only()
                    say("hold-only: from here the SDK workers take records and start none")
                with CpuTimeline(platform) as cpu:
                    with (
                        Reader(queues, decode=True) if args.readers else _none() as reader,
                        Reader(runs) if args.readers else _none() as runs_reader,
                    ):
                        rate = steady(
                            conn,
                            url,
                            platform,
                            cpu,
                            reader,
                            runs_reader,
                            tenants,
                            topics,
                            args.dump,
                            args.hold_only,
                        )
                    if not (args.steady_only or args.hold_only):
                        storm(conn, url, platform, cpu, tenants, topics, rate)
            if args.profile:
                profile_report(profile)
        finally:
            if mine := prefix_topics(prefix):
                delete_topics(mine)
            shutil.rmtree(profile.parent, ignore_errors=True)


def _none():
    return contextlib.nullcontext(None)


if __name__ == "__main__":
    main()
