"""StartRun and CompleteRun over HTTP at a steady 500 requests/s against
`cronwheel serve gateway` as a process: latency p50 / p99 of each.

Open loop: every request has a scheduled send time, one every 2 ms, and its
latency is measured from that time, not from when the client got round to
sending it, so a slow server cannot hide behind a stalled client (coordinated
omission). The client is lean on purpose, so that it is not what runs out of
CPU: one event loop (uvloop when installed) writing raw HTTP/1.1 over 32
persistent connections (--connections). httpx (32 threads) cost ~2.2 ms of
CPU per request here, more than the gateway and its database backends; this
client's thread costs 0.13-0.2 ms at 500/s and ~0.3 ms at 100/s (a timer
wake-up per request). The client's lag (scheduled -> sent) and CPU per request
are printed beside the figures.

The gateway runs as `cronwheel serve gateway` with its production settings:
CRONWHEEL_GATEWAY_WORKERS as the environment has it (--workers sets it),
uvicorn on uvloop and httptools, the worker fast path on.

The runs are PENDING rows written by SQL: copies of a run a real trigger made
(same tenant, job and spec; run ids in their partition's range), so start has
work without firing. The jobs lease for 5 minutes and no timer service runs,
so no lease expires during the measurement.

Phases, each at 500 requests/s (--rate), one after the other:
  warm-up   2 s of starts, then 2 s of completes (not counted)
  start     10 s of StartRun on fresh runs
  complete  5 s of CompleteRun on half of those
  mixed     10 s alternating StartRun (fresh runs) and CompleteRun (the other half)
  mixed@100 6 s of the same at 100 requests/s, for the latency without a queue
When the gateway cannot keep up, a phase takes longer than scheduled and the
latency measures the queue that built up (the achieved rate is its capacity).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import os
import shutil
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import psycopg
from bench_lifecycle import (
    CpuTimeline,
    Platform,
    http_counts,
    http_delta,
    profile_report,
    scrape,
    server_side,
)
from common import (
    create_tenants,
    delete_topics,
    describe,
    fresh_database,
    grant,
    header,
    machine_load,
    percentile,
    prefix_topics,
    say,
    vacuum_analyze,
)

from cronwheel import config
from cronwheel.core.clock import now_ms
from cronwheel.kafka import Topics
from cronwheel.store.jobs import Jobs
from services.gateway.main import WORKERS, worker_count

try:
    import uvloop
except ImportError:  # pragma: no cover - the client then runs on asyncio's loop
    uvloop = None

RATE = 500  # requests per second, every phase (--rate)
CONNECTIONS = 32  # the client's persistent connections (--connections)
TENANTS = 2
WARM_S, START_S, COMPLETE_S, MIXED_S = 2, 10, 5, 10
LOW_RATE, LOW_S = 100, 6  # the mixed phase again, well under capacity: the service time
JOB = {
    "name": "gateway-bench",
    "schedule": {"at": "2099-01-01T00:00:00.000Z"},
    "target": {"type": "queue", "queue": "bench"},
    "payload": {"bench": True},
    "lease_ms": 300_000,
}
_START_BODY = json.dumps({"worker_id": "bench", "attempt": 1})

# Copies of one real run: PENDING, due in the past, the partition in the id's
# first three hex digits (as cronwheel.core.ids makes them).
_BULK_RUNS = """
INSERT INTO runs_daily (partition_id, run_id, tenant_id, job_id, scheduled_at, priority, spec,
                  created_at, updated_at)
SELECT g %% 1024, lpad(to_hex(g %% 1024), 3, '0') || substr(md5(%(seed)s || g::text), 1, 29),
       r.tenant_id, r.job_id, r.scheduled_at - interval '1 millisecond' * g, r.priority, r.spec,
       r.created_at, r.created_at
  FROM runs_daily r, generate_series(0, %(n)s - 1) AS g
 WHERE r.run_id = %(template)s
RETURNING run_id
"""


@dataclass
class Call:
    at: float  # scheduled send time (time.monotonic())
    kind: str  # start | complete | post (path and body given)
    run_id: str
    key: str
    path: str = ""
    body: bytes = b""
    sent: float = 0.0
    done: float = 0.0
    status: int = 0

    @property
    def latency_ms(self) -> float:
        return (self.done - self.at) * 1000


class _Connection:
    """One persistent HTTP/1.1 connection: a request written whole (head and a
    Content-Length body), the answer read by its Content-Length. Enough for
    uvicorn's answers; nothing else is parsed. Closed loop against a trivial
    uvicorn app on this machine, CPU per request: this 0.02-0.05 ms, aiohttp
    (installed) 0.2-0.3 ms, httpx 1.3 ms; hence this rather than aiohttp."""

    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def open(self) -> None:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None

    async def post(self, request: bytes) -> tuple[int, bytes]:
        if self.writer is None:
            await self.open()
        self.writer.write(request)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        lower = head.lower()
        at = lower.find(b"\r\ncontent-length:")
        if at < 0:  # uvicorn always sends one for these answers
            self.close()
            raise ValueError(f"no Content-Length in {head!r}")
        length = int(lower[at + 17 : lower.index(b"\r\n", at + 2)])
        body = await self.reader.readexactly(length) if length else b""
        if b"\r\nconnection: close" in lower:
            self.close()
        return status, body


class OpenLoop:
    """Sends each Call at its scheduled time over a pool of `connections`
    persistent connections: a pacer hands the call to a queue at its time and
    the first free connection sends it, so when every connection is busy the
    wait shows up as client lag (scheduled -> sent) and in the latency.

    One asyncio event loop (uvloop when installed) in the calling thread; its
    thread CPU time over each run() is the client's own cost, kept in
    `client_cpu_s`."""

    def __init__(self, base: str, connections: int = CONNECTIONS):
        url = urlsplit(base)
        self.host, self.port = url.hostname, url.port
        self.connections = connections
        self.tokens: dict[str, str] = {}
        self.loop = uvloop.new_event_loop() if uvloop is not None else asyncio.new_event_loop()
        self.client_cpu_s = 0.0

    def run(self, calls: list[Call]) -> None:
        cpu0 = time.thread_time()
        self.loop.run_until_complete(self._run(calls))
        self.client_cpu_s = time.thread_time() - cpu0

    async def _run(self, calls: list[Call]) -> None:
        # Fresh connections each run: between phases they sit idle longer than
        # uvicorn's keep-alive (5 s) and it may close them.
        pool = [_Connection(self.host, self.port) for _ in range(self.connections)]
        await asyncio.gather(*(c.open() for c in pool))
        queue: asyncio.Queue[Call | None] = asyncio.Queue()
        senders = [asyncio.create_task(self._sender(c, queue)) for c in pool]
        try:
            for c in calls:
                delay = c.at - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)  # the open-loop schedule
                queue.put_nowait(c)
            for _ in senders:
                queue.put_nowait(None)
            await asyncio.gather(*senders)
        finally:
            for c in pool:
                c.close()

    async def _sender(self, conn: _Connection, queue: asyncio.Queue[Call | None]) -> None:
        while (c := await queue.get()) is not None:
            if c.kind == "post":
                path, data = c.path, c.body
            elif c.kind == "start":
                path, data = f"/v1/runs/{c.run_id}/start", _START_BODY.encode()
            else:
                token = self.tokens.get(c.run_id, "")
                body = json.dumps({"attempt": 1, "start_token": token, "outcome": "SUCCEEDED"})
                path, data = f"/v1/runs/{c.run_id}/complete", body.encode()
            request = (
                f"POST {path} HTTP/1.1\r\n"
                f"Host: {self.host}:{self.port}\r\n"
                f"Authorization: Bearer {c.key}\r\n"
                "Content-Type: application/json\r\n"
                f"Content-Length: {len(data)}\r\n\r\n"
            ).encode() + data
            c.sent = time.monotonic()
            try:
                c.status, answer = await conn.post(request)
                c.done = time.monotonic()
                if c.kind == "start" and c.status == 200:
                    self.tokens[c.run_id] = json.loads(answer)["start_token"]
            except (OSError, ValueError, EOFError, asyncio.LimitOverrunError):
                c.done = time.monotonic()
                c.status = -1
                conn.close()  # the next call opens a new one

    def close(self) -> None:
        self.loop.close()


def schedule(items: list[tuple[str, str, str]], rate: float = RATE) -> list[Call]:
    """(kind, run_id, key) items, one every 1/rate s from half a second from now."""
    t0 = time.monotonic() + 0.5
    return [Call(t0 + i / rate, kind, run_id, key) for i, (kind, run_id, key) in enumerate(items)]


def report(
    label: str,
    calls: list[Call],
    cpu: CpuTimeline,
    window: tuple[int, int],
    client_cpu_s: float,
    workers: int,
) -> dict:
    """Latency per kind, errors, the client's lag and the CPU per request."""
    figures = {}
    rate = (len(calls) - 1) / (calls[-1].at - calls[0].at)
    wall = (max(c.done for c in calls) - calls[0].at) or 1e-9
    say(
        f"{label}: {len(calls):,} requests scheduled at {rate:.0f}/s over"
        f" {len(calls) / rate:.0f} s, all answered after {wall:.1f} s"
        f" ({len(calls) / wall:,.0f}/s achieved)"
        + (
            "; over capacity: the latency below is mostly the queue that built up"
            if len(calls) / wall < 0.9 * rate
            else ""
        )
    )
    for kind in ("start", "complete"):
        mine = [c for c in calls if c.kind == kind]
        if not mine:
            continue
        lat = [c.latency_ms for c in mine]
        bad: dict[int, int] = {}
        for c in mine:
            if c.status != 200:
                bad[c.status] = bad.get(c.status, 0) + 1
        errors = ", ".join(f"{n} x {s}" for s, n in sorted(bad.items())) or "none"
        say(f"{label}:   {kind:8s} {len(mine):,}: {describe(lat)}; not 200: {errors}")
        figures[kind] = (percentile(lat, 50), percentile(lat, 99))
    figures["achieved"] = len(calls) / wall
    figures["load"] = os.getloadavg()[0]  # the shared machine, beside the figure
    lag = [(c.sent - c.at) * 1000 for c in calls]
    say(f"{label}:   client lag, scheduled -> sent: {describe(lag)}")
    say(f"{label}:   CPU: {cpu.share(*window)}")
    say(
        f"{label}:   CPU ms per request: {cpu.per_unit(*window, len(calls))}"
        f" (bench = this process: the client plus the CPU sampler);"
        f" the client's own thread {1000 * client_cpu_s / len(calls):.3f}"
    )
    _wall, used = cpu.used(*window)
    if used.get("gateway"):
        per = used["gateway"] / len(calls)
        say(
            f"{label}:   {workers} gateway process(es) (one GIL each) at {1000 * per:.2f} ms of"
            f" CPU per request in all top out near {workers / per:,.0f} requests/s with"
            f" {workers} core(s) to themselves"
        )
    return figures


def make_runs(conn, tenants: list[dict], topics: Topics, per_tenant: int) -> list[tuple[str, str]]:
    """(run_id, api key) of PENDING runs, tenants interleaved."""
    jobs = Jobs(topics)
    lists = []
    for t in tenants:
        job = jobs.create(conn, t, JOB, now_ms())
        template = jobs.trigger(conn, t, job["job_id"], now_ms() - 60_000)["run_id"]
        with conn.transaction():
            ids = [
                r[0]
                for r in conn.execute(
                    _BULK_RUNS,
                    {"seed": uuid.uuid4().hex, "n": per_tenant, "template": template},
                )
            ]
        lists.append([(run_id, t["api_key"]) for run_id in ids])
    return [pair for group in zip(*lists, strict=True) for pair in group]


def round_trips(url: str, topics: Topics, runs: list[tuple[str, str]]) -> dict[str, float]:
    """Database round trips per StartRun / Heartbeat / CompleteRun, counted on the
    wire: the gateway's code in this process over a pool of one connection, whose
    libpq trace is read (each run of client messages followed by server messages
    is one round trip). Uses the runs it is given."""
    from services.gateway.app import create_app
    from services.gateway.service import GatewayService

    service_url = config.role_url(url, config.PG_PLATFORM_USER)  # the gateway's role from it
    app = create_app(service_url, topics, config.kafka_bootstrap(), "cwop_rt", pool_max=1)
    counts: dict[str, list[int]] = {"start": [], "heartbeat": [], "complete": []}
    stop = threading.Event()
    svc = GatewayService(app, "127.0.0.1", 0, "warning")
    thread = threading.Thread(target=svc.run, args=(stop,), daemon=True)
    thread.start()
    try:
        with httpx.Client(base_url=svc.url, timeout=10) as client:
            for _ in range(50):  # until the server answers
                with contextlib.suppress(httpx.HTTPError):
                    client.get("/healthz")
                    break
                time.sleep(0.05)
            for run_id, key in runs:
                headers = {"Authorization": f"Bearer {key}"}
                got = {}
                for kind in ("start", "heartbeat", "complete"):
                    fd, path = tempfile.mkstemp(suffix=".trace")
                    with app.state.gateway.pool.connection() as conn:
                        conn.pgconn.trace(fd)  # libpq owns fd; untrace closes it
                        conn.pgconn.set_trace_flags(psycopg.pq.Trace.SUPPRESS_TIMESTAMPS)
                    if kind == "start":
                        body = {"worker_id": "rt"}
                    else:
                        body = {"attempt": 1, "start_token": got["start_token"]}
                        if kind == "complete":
                            body["outcome"] = "SUCCEEDED"
                    r = client.post(f"/v1/runs/{run_id}/{kind}", json=body, headers=headers)
                    assert r.status_code == 200, r.text
                    got.update(r.json())
                    with app.state.gateway.pool.connection() as conn:
                        conn.pgconn.untrace()
                    with open(path) as f:
                        sides = [line.split("\t", 1)[0] for line in f if line.strip()]
                    os.unlink(path)
                    counts[kind].append(
                        sum(
                            1
                            for a, b in zip(sides, sides[1:], strict=False)
                            if (a, b) == ("F", "B")
                        )
                    )
    finally:
        stop.set()
        thread.join(10)
        app.state.gateway.close()
    return {k: sum(v) / len(v) for k, v in counts.items() if v}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--profile", action="store_true", help="cProfile the gateway process")
    parser.add_argument(
        "--rate", type=int, default=RATE, help=f"requests/s of the main phases ({RATE})"
    )
    parser.add_argument(
        "--workers",
        type=int,
        help=f"gateway worker processes ({WORKERS}; default: the gateway's own default)",
    )
    parser.add_argument(
        "--connections",
        type=int,
        default=CONNECTIONS,
        help=f"the client's persistent connections ({CONNECTIONS})",
    )
    args = parser.parse_args()
    if args.workers is not None:
        os.environ[WORKERS] = str(args.workers)  # the gateway process inherits it
    if args.profile:
        os.environ[WORKERS] = "1"  # Platform does the same: cProfile sees one process
    workers = worker_count()
    rate = args.rate
    header(f"bench_gateway: StartRun and CompleteRun at {rate} requests/s, open loop")
    warm, n_start, n_complete, n_mixed = (rate * s for s in (WARM_S, START_S, COMPLETE_S, MIXED_S))
    n_low = LOW_RATE * LOW_S
    needed = warm + n_start + n_mixed // 2 + n_low // 2
    prefix = f"bench{uuid.uuid4().hex[:8]}"
    topics = Topics(prefix)
    grant(prefix)
    profile = Path(tempfile.mkdtemp(prefix="cw-bench-prof-")) / "gateway.prof"
    servers = [m for m in ("httptools", "uvloop") if importlib.util.find_spec(m)]
    with fresh_database() as url:
        with psycopg.connect(url, autocommit=True) as conn:
            tenants = create_tenants(conn, TENANTS)
            t0 = time.monotonic()
            runs = make_runs(conn, tenants, topics, needed // TENANTS + 6)
            say(
                f"setup: fresh database, {TENANTS} tenants, {len(runs):,} PENDING runs copied by"
                f" SQL from a triggered run in {time.monotonic() - t0:.1f} s, then VACUUM"
                f" ({vacuum_analyze(url):.1f} s); `cronwheel serve gateway` as a process with"
                f" production settings (pool {os.environ.get('CRONWHEEL_GATEWAY_POOL', '10')}"
                f" per process, {workers} worker process(es)"
                f" ({WORKERS}={os.environ.get(WORKERS) or 'unset: one per two CPUs'}),"
                f" worker fast path"
                f" {'off' if os.environ.get('CRONWHEEL_GATEWAY_FASTPATH') == '0' else 'on'},"
                f" uvicorn with"
                f" {', '.join(servers) or 'h11 and asyncio: httptools and uvloop not installed'})"
                f"{', under cProfile' if args.profile else ''}; client: {args.connections}"
                f" keep-alive connections on one {'uvloop' if uvloop else 'asyncio'} event loop"
            )
            trips = round_trips(url, topics, runs[:10])
            runs = runs[10:]
            say(
                "database round trips per request (the gateway's pool connection, libpq trace):"
                + ", ".join(f" {k} {v:.1f}" for k, v in trips.items())
            )
        try:
            with (
                Platform(url, prefix, ("gateway",), profile if args.profile else None) as gw,
                CpuTimeline(gw, every_s=0.5) as cpu,
            ):
                loop = OpenLoop(gw.base, args.connections)
                try:
                    fresh = iter(runs)
                    started: list[tuple[str, str]] = []

                    def starts(n: int) -> list[tuple[str, str, str]]:
                        got = [next(fresh) for _ in range(n)]
                        started.extend(got)
                        return [("start", r, k) for r, k in got]

                    def completes(n: int) -> list[tuple[str, str, str]]:
                        got, started[:n] = started[:n], []
                        return [("complete", r, k) for r, k in got]

                    loop.run(schedule(starts(warm // 2), rate))
                    loop.run(schedule(completes(warm // 2), rate))
                    say(f"warm-up: {warm:,} requests; machine: {machine_load()}")
                    results = {}

                    def mixed(n: int) -> list[tuple[str, str, str]]:
                        pairs = zip(starts(n // 2), completes(n // 2), strict=True)
                        return [x for pair in pairs for x in pair]

                    for label, offered, items in (
                        ("start", rate, lambda: starts(n_start)),
                        ("complete", rate, lambda: completes(n_complete)),
                        ("mixed", rate, lambda: mixed(n_mixed)),
                        (f"mixed@{LOW_RATE}", LOW_RATE, lambda: mixed(n_low)),
                    ):
                        calls = schedule(items(), offered)
                        http0, text0 = http_counts(gw.base), scrape(gw.base)
                        w0 = now_ms()
                        loop.run(calls)
                        w1 = now_ms()
                        results[label] = report(
                            label, calls, cpu, (w0, w1), loop.client_cpu_s, workers
                        )
                        text1 = scrape(gw.base)
                        for kind in sorted({c.kind for c in calls}, reverse=True):
                            say(
                                f"{label}:   {kind} inside the gateway (its histogram, request"
                                f" read -> response started): {server_side(text0, text1, kind)}"
                            )
                        say(f"{label}:   server's count: {http_delta(http0, http_counts(gw.base))}")
                        say(f"{label}: machine after: {machine_load()}")
                finally:
                    loop.close()
            for label, kind in (("start", "start"), ("complete", "complete")):
                p50, p99 = results[label][kind]
                say(
                    f"RESULT gateway {kind} alone at {rate} requests/s ({workers} workers):"
                    f" p50 {p50:.1f} ms, p99 {p99:.1f} ms"
                    f" ({results[label]['achieved']:.0f}/s achieved, load average"
                    f" {results[label]['load']:.1f}; issue 5: report it)"
                )
            for label, offered in (("mixed", rate), (f"mixed@{LOW_RATE}", LOW_RATE)):
                got = results[label]
                say(
                    f"RESULT gateway start+complete mixed at {offered} requests/s"
                    f" ({workers} workers):"
                    f" start p50 {got['start'][0]:.1f} ms, p99 {got['start'][1]:.1f} ms;"
                    f" complete p50 {got['complete'][0]:.1f} ms, p99 {got['complete'][1]:.1f} ms"
                    f" ({got['achieved']:.0f}/s achieved, load average {got['load']:.1f})"
                )
            if args.profile:
                profile_report(profile)
        finally:
            if mine := prefix_topics(prefix):
                delete_topics(mine)
            shutil.rmtree(profile.parent, ignore_errors=True)


if __name__ == "__main__":
    main()
