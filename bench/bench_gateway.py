"""StartRun and CompleteRun over HTTP at a steady 500 requests/s against
`cronwheel serve gateway` as a process: latency p50 / p99 of each.

Open loop: every request has a scheduled send time, one every 2 ms, and its
latency is measured from that time, not from when a client thread got round to
sending it, so a slow server cannot hide behind a stalled client (coordinated
omission). 32 client threads share one httpx connection pool; the client's own
lag (scheduled -> sent) is printed beside the figures.

The runs are PENDING rows written by SQL: copies of a run a real trigger made
(same tenant, job and spec; run ids in their partition's range), so start has
work without firing. The jobs lease for 5 minutes and no timer service runs,
so no lease expires during the measurement.

Phases, each at 500 requests/s, one after the other:
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
import contextlib
import importlib.util
import os
import shutil
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

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
    header,
    machine_load,
    percentile,
    say,
    vacuum_analyze,
)

from cronwheel import config, kafka
from cronwheel.core.clock import now_ms
from cronwheel.kafka import Topics
from cronwheel.store.jobs import Jobs

RATE = 500  # requests per second, every phase
THREADS = 32
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

# Copies of one real run: PENDING, due in the past, the partition in the id's
# first three hex digits (as cronwheel.core.ids makes them).
_BULK_RUNS = """
INSERT INTO runs (partition_id, run_id, tenant_id, job_id, scheduled_at, priority, spec,
                  created_at, updated_at)
SELECT g %% 1024, lpad(to_hex(g %% 1024), 3, '0') || substr(md5(%(seed)s || g::text), 1, 29),
       r.tenant_id, r.job_id, r.scheduled_at - interval '1 millisecond' * g, r.priority, r.spec,
       r.created_at, r.created_at
  FROM runs r, generate_series(0, %(n)s - 1) AS g
 WHERE r.run_id = %(template)s
RETURNING run_id
"""


@dataclass
class Call:
    at: float  # scheduled send time (time.monotonic())
    kind: str  # start | complete
    run_id: str
    key: str
    sent: float = 0.0
    done: float = 0.0
    status: int = 0

    @property
    def latency_ms(self) -> float:
        return (self.done - self.at) * 1000


class OpenLoop:
    """Sends each Call at its scheduled time from one of `threads` lanes (call i
    goes to lane i mod threads), over one shared connection pool."""

    def __init__(self, base: str, threads: int = THREADS):
        self.threads = threads
        self.client = httpx.Client(
            base_url=base,
            timeout=30.0,
            limits=httpx.Limits(max_connections=threads, max_keepalive_connections=threads),
        )
        self.tokens: dict[str, str] = {}

    def run(self, calls: list[Call]) -> None:
        lanes = [
            threading.Thread(target=self._lane, args=(calls[i :: self.threads],), daemon=True)
            for i in range(self.threads)
        ]
        for t in lanes:
            t.start()
        for t in lanes:
            t.join()

    def _lane(self, calls: list[Call]) -> None:
        for c in calls:
            delay = c.at - time.monotonic()
            if delay > 0:
                time.sleep(delay)  # the open-loop schedule, not a wait for a condition
            headers = {"Authorization": f"Bearer {c.key}"}
            c.sent = time.monotonic()
            try:
                if c.kind == "start":
                    body = {"worker_id": "bench", "attempt": 1}
                else:
                    token = self.tokens.get(c.run_id, "")
                    body = {"attempt": 1, "start_token": token, "outcome": "SUCCEEDED"}
                resp = self.client.post(f"/v1/runs/{c.run_id}/{c.kind}", json=body, headers=headers)
                c.done = time.monotonic()
                c.status = resp.status_code
                if c.kind == "start" and resp.status_code == 200:
                    self.tokens[c.run_id] = resp.json()["start_token"]
            except httpx.HTTPError:
                c.done = time.monotonic()
                c.status = -1

    def close(self) -> None:
        self.client.close()


def schedule(items: list[tuple[str, str, str]], rate: float = RATE) -> list[Call]:
    """(kind, run_id, key) items, one every 1/rate s from half a second from now."""
    t0 = time.monotonic() + 0.5
    return [Call(t0 + i / rate, kind, run_id, key) for i, (kind, run_id, key) in enumerate(items)]


def report(label: str, calls: list[Call], cpu: CpuTimeline, window: tuple[int, int]) -> dict:
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
    lag = [(c.sent - c.at) * 1000 for c in calls]
    say(f"{label}:   client lag, scheduled -> sent: {describe(lag)}")
    say(f"{label}:   CPU: {cpu.share(*window)}")
    say(f"{label}:   CPU ms per request: {cpu.per_unit(*window, len(calls))}")
    _wall, used = cpu.used(*window)
    if used.get("gateway"):
        per = used["gateway"] / len(calls)
        say(
            f"{label}:   one gateway process (one GIL) at {1000 * per:.2f} ms of CPU per request"
            f" tops out near {1 / per:,.0f} requests/s with a core to itself"
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

    app = create_app(url, topics, config.kafka_bootstrap(), "cwop_rt", pool_max=1)
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
    args = parser.parse_args()
    header("bench_gateway: StartRun and CompleteRun at 500 requests/s, open loop")
    warm, n_start, n_complete, n_mixed = (RATE * s for s in (WARM_S, START_S, COMPLETE_S, MIXED_S))
    n_low = LOW_RATE * LOW_S
    needed = warm + n_start + n_mixed // 2 + n_low // 2
    prefix = f"bench{uuid.uuid4().hex[:8]}"
    topics = Topics(prefix)
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
                f" default settings (pool 10 per process,"
                f" {os.environ.get('CRONWHEEL_GATEWAY_WORKERS') or 'default'} worker processes,"
                f" uvicorn with"
                f" {', '.join(servers) or 'h11 and asyncio: httptools and uvloop not installed'})"
                f"{', under cProfile' if args.profile else ''}; {THREADS} client threads"
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
                loop = OpenLoop(gw.base)
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

                    loop.run(schedule(starts(warm // 2)))
                    loop.run(schedule(completes(warm // 2)))
                    say(f"warm-up: {warm:,} requests; machine: {machine_load()}")
                    results = {}

                    def mixed(n: int) -> list[tuple[str, str, str]]:
                        pairs = zip(starts(n // 2), completes(n // 2), strict=True)
                        return [x for pair in pairs for x in pair]

                    for label, rate, items in (
                        ("start", RATE, lambda: starts(n_start)),
                        ("complete", RATE, lambda: completes(n_complete)),
                        ("mixed", RATE, lambda: mixed(n_mixed)),
                        (f"mixed@{LOW_RATE}", LOW_RATE, lambda: mixed(n_low)),
                    ):
                        calls = schedule(items(), rate)
                        http0, text0 = http_counts(gw.base), scrape(gw.base)
                        w0 = now_ms()
                        loop.run(calls)
                        w1 = now_ms()
                        results[label] = report(label, calls, cpu, (w0, w1))
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
                    f"RESULT gateway {kind} alone at {RATE} requests/s:"
                    f" p50 {p50:.1f} ms, p99 {p99:.1f} ms"
                    f" ({results[label]['achieved']:.0f}/s achieved; issue 5: report it)"
                )
            for label, rate in (("mixed", RATE), (f"mixed@{LOW_RATE}", LOW_RATE)):
                got = results[label]
                say(
                    f"RESULT gateway start+complete mixed at {rate} requests/s:"
                    f" start p50 {got['start'][0]:.1f} ms, p99 {got['start'][1]:.1f} ms;"
                    f" complete p50 {got['complete'][0]:.1f} ms, p99 {got['complete'][1]:.1f} ms"
                    f" ({got['achieved']:.0f}/s achieved)"
                )
            if args.profile:
                profile_report(profile)
        finally:
            names = kafka.admin().list_topics(timeout=10).topics
            if mine := sorted(n for n in names if n.startswith(prefix + ".")):
                delete_topics(mine)
            shutil.rmtree(profile.parent, ignore_errors=True)


if __name__ == "__main__":
    main()
