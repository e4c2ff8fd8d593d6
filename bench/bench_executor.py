"""Managed execution: how many runs of `true` per second the executor completes
end to end, and what the sandbox adds to starting a process (p50 of `true` in
the full sandbox, limits and all, against a plain `true`)."""

from __future__ import annotations

import os
import statistics
import subprocess
import time
import uuid

import psycopg
from common import (
    Services,
    completions_topic,
    delete_topics,
    fresh_database,
    grant,
    header,
    machine_load,
    percentile,
    say,
)

from cronwheel.core.clock import now_ms, to_ms
from cronwheel.kafka import Topics
from cronwheel.store.jobs import Jobs, create_tenant
from services.executor.sandbox import Policy, Sandbox, command_env

STARTS = 200  # sandbox start samples
TENANTS = 4
RUNS = 400
CONCURRENCY = 8


def start_overhead() -> None:
    policy = Policy()
    sandbox = Sandbox(policy, slots=1)
    limits, env = policy.limits_for({}), command_env({}, {})
    plain, boxed = [], []
    try:
        for _ in range(STARTS):
            t = time.perf_counter()
            subprocess.run(["true"], check=True)
            plain.append((time.perf_counter() - t) * 1000)
            t = time.perf_counter()
            got = sandbox.run(["true"], env, limits, payload="null", deadline=time.monotonic() + 30)
            boxed.append((time.perf_counter() - t) * 1000)
            if got.code != 0:
                raise RuntimeError(f"sandboxed true failed: {got}")
    finally:
        sandbox.close()
    p_plain, p_boxed = percentile(plain, 50), percentile(boxed, 50)
    say(f"start: limits enforced by {sandbox.mode}")
    say(
        f"start: plain `true` p50 {p_plain:.2f} ms (p99 {percentile(plain, 99):.2f});"
        f" sandboxed `true` p50 {p_boxed:.2f} ms (p99 {percentile(boxed, 99):.2f}),"
        f" {STARTS} each"
    )
    say(f"RESULT sandbox start overhead p50: {p_boxed - p_plain:.1f} ms")


class ManagedServices(Services):
    """relay, dispatcher and executor as processes; ready when the relay leases
    every partition (the other two lease none)."""

    def _wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        with psycopg.connect(self.url, autocommit=True) as conn:
            while (
                conn.execute(
                    "SELECT count(*) FROM partition_leases WHERE service = 'relay'"
                    " AND owner IS NOT NULL AND expires_at > now()"
                ).fetchone()[0]
                < 1024
            ):
                self.check_alive()
                if time.monotonic() > deadline:
                    raise RuntimeError("the relay did not lease its partitions")
                time.sleep(0.05)


def trigger_all(conn, jobs: Jobs, targets: list[tuple[dict, str]], n: int) -> None:
    """`n` runs, round-robin over the tenants' jobs, each at its own past instant."""
    base = now_ms() - 10_000
    with conn.transaction():
        for i in range(n):
            tenant, job_id = targets[i % len(targets)]
            jobs.trigger(conn, tenant, job_id, base - i)


def finished(conn) -> int:
    return conn.execute("SELECT count(*) FROM runs_daily WHERE state = 'SUCCEEDED'").fetchone()[0]


def throughput() -> None:
    prefix = f"bench{uuid.uuid4().hex[:8]}"
    topics = Topics(prefix)
    grant(prefix)
    completions_topic(topics)  # no workflow service here to create it
    names: list[str] = [topics.run_completed]
    with fresh_database() as url:
        os.environ.update(  # read by the executor process
            CRONWHEEL_EXECUTOR_CONCURRENCY=str(CONCURRENCY),
            CRONWHEEL_EXECUTOR_TENANT_CONCURRENCY=str(CONCURRENCY),
        )
        conn = psycopg.connect(url, autocommit=True)
        jobs = Jobs(topics)
        targets = []
        for i in range(TENANTS):
            tenant = create_tenant(conn, f"bench-{i}")
            job = jobs.create(
                conn,
                tenant,
                {
                    "name": "true",
                    "schedule": {"at": "2099-01-01T00:00:00.000Z"},
                    "target": {"type": "managed", "command": ["true"]},
                },
                now_ms(),
            )
            targets.append((tenant, job["job_id"]))
            names += [topics.runs(tenant["tenant_id"]), topics.managed(tenant["tenant_id"])]
        say(
            f"runs: fresh database, {TENANTS} tenants, `cronwheel serve relay dispatcher"
            f" executor` as processes, executor concurrency {CONCURRENCY}"
        )
        try:
            with ManagedServices(url, prefix, ("relay", "dispatcher", "executor")) as services:
                # Warm-up: one run per tenant creates and subscribes its topics.
                trigger_all(conn, jobs, targets, TENANTS)
                deadline = time.monotonic() + 90
                while finished(conn) < TENANTS:
                    if time.monotonic() > deadline:
                        raise RuntimeError("warm-up runs did not finish")
                    time.sleep(0.05)
                cpu0 = services.cpu()
                t0, t0_ms = time.monotonic(), now_ms()
                trigger_all(conn, jobs, targets, RUNS)
                deadline = time.monotonic() + 300
                while finished(conn) < TENANTS + RUNS:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"only {finished(conn) - TENANTS}/{RUNS} finished")
                    time.sleep(0.02)
                wall = time.monotonic() - t0
                cpu1 = services.cpu()
                rows = conn.execute(
                    "SELECT started_at, finished_at FROM runs_daily ORDER BY finished_at DESC LIMIT %s",
                    [RUNS],
                ).fetchall()
            held = [to_ms(f) - to_ms(s) for s, f in rows]
            first = min(to_ms(f) for _s, f in rows) - t0_ms
            say(
                f"runs: {RUNS} runs of `true` triggered in one transaction, all SUCCEEDED in"
                f" {wall:.2f} s (first +{first} ms); StartRun -> CompleteRun p50"
                f" {percentile(held, 50):.0f} ms, mean {statistics.fmean(held):.0f} ms"
            )
            per_run = ", ".join(
                f"{n} {(cpu1[n] - cpu0[n]) * 1000 / RUNS:.1f}" for n in cpu1 if n != "bench-reader"
            )
            say(f"runs: CPU ms per run (sandboxed processes not included): {per_run}")
            say(f"RESULT managed runs per second (`true`): {RUNS / wall:.1f}")
        finally:
            conn.close()
            delete_topics(names)


def main() -> None:
    header("bench_executor: managed runs in the bubblewrap sandbox")
    start_overhead()
    throughput()
    say(f"machine after: {machine_load()}")


if __name__ == "__main__":
    main()
