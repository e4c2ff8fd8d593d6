"""Registering jobs over HTTP: POST /v1/jobs one per request, and
POST /v1/jobs/batch with up to 1,000 per request, against `cronwheel serve
gateway` as a process with its production settings.

Phases, one after the other, each on fresh job names:
  single   open loop at --rate requests/s (300) for --seconds (10) over 32
           keep-alive connections (bench_gateway's lean client): the achieved
           rate, latency p50 / p99 (from each request's scheduled send time,
           so a queue that builds up shows) and the answers' status codes
  batch    --batches (10) batches of --batch-size jobs (1,000) over 2
           connections, closed loop: jobs/s from the first send to the last
           answer, per-batch latency, per-job result statuses; with
           --new-queues every job to a queue of its own, whose topic the
           gateway makes before it answers

The jobs are cron jobs (`*/5 * * * *`, UTC) to queue targets, spread over 4
tenants. The gateway's CPU and its PostgreSQL backends' are printed beside
the figures, as shares of a core and as milliseconds per job: on a shared
machine the rate moves with the other load, the CPU per job much less.
CRONWHEEL_GATEWAY_FASTPATH=0 in the environment runs the gateway without its
fast paths (services/gateway/fastpath.py), for comparisons. It prints figures
and asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path

import psycopg
from bench_gateway import Call, OpenLoop
from bench_lifecycle import CpuTimeline, Platform, profile_report
from common import (
    create_tenants,
    delete_topics,
    describe,
    fresh_database,
    grant,
    header,
    machine_load,
    prefix_topics,
    say,
)

from cronwheel.core.clock import now_ms

TENANTS = 4


def job(name: str, queue: str = "reports") -> dict:
    return {
        "name": name,
        "schedule": {"cron": "*/5 * * * *", "timezone": "UTC"},
        "target": {"type": "queue", "queue": queue},
        "payload": {"bench": True},
    }


def _measure(gw: Platform, calls: list[Call], connections: int, units: int) -> tuple[str, str]:
    """Send `calls` over `connections`: the CPU share of each process meanwhile,
    and its CPU milliseconds per unit (a job)."""
    loop = OpenLoop(gw.base, connections)
    start = now_ms()
    try:
        with CpuTimeline(gw, every_s=0.5) as cpu:
            loop.run(calls)
    finally:
        loop.close()
    end = now_ms()
    return cpu.share(start, end), cpu.per_unit(start, end, units)


def single(gw: Platform, keys: list[str], rate: int, seconds: int) -> None:
    n = rate * seconds
    t0 = time.monotonic() + 0.5
    calls = [
        Call(
            t0 + i / rate,
            "post",
            "",
            keys[i % len(keys)],
            path="/v1/jobs",
            body=json.dumps(job(f"single-{i}")).encode(),
        )
        for i in range(n)
    ]
    cpu, per_job = _measure(gw, calls, 32, n)
    took = max(c.done for c in calls) - t0
    statuses = Counter(c.status for c in calls)
    say(f"single: {n} requests scheduled at {rate}/s; answered in {took:.1f} s")
    say(f"single: achieved {n / took:.0f} jobs/s; statuses {dict(statuses)}")
    say(f"single: latency {describe([c.latency_ms for c in calls])}")
    say(f"single: CPU {cpu}")
    say(f"single: CPU ms per job {per_job}")
    say(f"RESULT single job creation {n / took:.0f}/s (target >= 300/s)")


def batch(gw: Platform, keys: list[str], batches: int, size: int, new_queues: bool) -> None:
    """`new_queues`: each job of each batch to a queue of its own, whose topic
    the gateway makes before it answers (services/gateway/topics_ready.py)."""
    calls = []
    for b in range(batches):
        body = {
            "jobs": [
                job(f"batch-{b}-{i}", f"b{b}q{i}" if new_queues else "reports") for i in range(size)
            ]
        }
        calls.append(
            Call(0.0, "post", "", keys[b % len(keys)], path="/v1/jobs/batch",
                 body=json.dumps(body).encode())
        )  # fmt: skip
    t0 = time.monotonic()
    for c in calls:
        c.at = t0  # closed loop: each connection sends the next as soon as it is free
    jobs = batches * size
    cpu, per_job = _measure(gw, calls, 2, jobs)
    took = max(c.done for c in calls) - t0
    statuses = Counter(c.status for c in calls)
    to = f"{batches * size} new queues" if new_queues else "one queue"
    say(
        f"batch: {batches} x {size} jobs to {to} over 2 connections in {took:.1f} s;"
        f" statuses {dict(statuses)}"
    )
    say(f"batch: per request {describe([(c.done - c.sent) * 1000 for c in calls])}")
    say(f"batch: CPU {cpu}")
    say(f"batch: CPU ms per job {per_job}")
    say(f"RESULT batched job creation {jobs / took:.0f}/s (target >= 2,000/s)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    ap.add_argument("--rate", type=int, default=300)
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--batches", type=int, default=10)
    ap.add_argument("--batch-size", type=int, default=1000)
    ap.add_argument("--only", choices=["single", "batch"])
    ap.add_argument(
        "--new-queues",
        action="store_true",
        help="batch: every job to a queue of its own (a topic made per job before the answer)",
    )
    ap.add_argument("--profile", action="store_true", help="cProfile the gateway (one process)")
    args = ap.parse_args()
    if min(args.rate, args.seconds, args.batches) < 1 or not 1 <= args.batch_size <= 1000:
        ap.error("--rate, --seconds, --batches >= 1 and --batch-size 1..1000")
    header("bench_job_create: registering jobs over HTTP")
    prefix = f"bj{uuid.uuid4().hex[:8]}"
    grant(prefix)
    try:
        run(args, prefix)
    finally:
        if mine := prefix_topics(prefix):  # the gateway made the jobs' topics
            delete_topics(mine)


def run(args, prefix: str) -> None:
    with fresh_database() as url:
        with psycopg.connect(url, autocommit=True) as conn:
            tenants = create_tenants(conn, TENANTS)
        keys = [t["api_key"] for t in tenants]
        profile = Path(tempfile.mkdtemp(prefix="cw-bench-prof-")) / "gateway.prof"
        with Platform(url, prefix, ("gateway",), profile if args.profile else None) as gw:
            say(f"load before: {machine_load()}")
            fastpath = os.environ.get("CRONWHEEL_GATEWAY_FASTPATH") != "0"
            say(f"gateway fast path {'on' if fastpath else 'off'} (CRONWHEEL_GATEWAY_FASTPATH)")
            if args.only in (None, "single"):
                single(gw, keys, args.rate, args.seconds)
            if args.only in (None, "batch"):
                batch(gw, keys, args.batches, args.batch_size, args.new_queues)
        if args.profile:
            profile_report(profile)
        shutil.rmtree(profile.parent, ignore_errors=True)


if __name__ == "__main__":
    main()
