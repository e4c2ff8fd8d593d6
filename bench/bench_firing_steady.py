"""Steady: 1k jobs firing every second for 30 s, after 20 s of warm-up (every
topic is new, and fresh partitions stall the broker once, 8-15 s after their
first records: docs/architecture.md, "Fresh partitions stall once").
Lateness is the record's scheduled_at to the wall clock at which a consumer
could read it. Target: p99 at most 25 ms. Two cases, each in a fresh
database: anchors spread over the second (about one job due per millisecond)
and aligned (all 1k due at once).

`--idle-tenants N` adds N more tenants beside the ten busy ones, each with one
queue job every minute (anchors spread over the minute) and its run topic
made up front, as a platform with thousands of mostly idle teams has: the
busy tenants' lateness should not move with N (issue 21's 10-against-3,000
comparison). Each idle run topic gets one record first, and the broker's
one-time stall of fresh partitions is waited out (`PRIME_SETTLE_S`), so the
window measures tenants that are idle, not tenants that all arrived in the
last minute. `--only spread|aligned` runs one case: the topics a case deletes
at its end keep the broker busy for a while, so with thousands of them run
the cases apart.

`--fifo` (root, or CAP_SYS_NICE) puts every thread of the relay, the broker
and this process (the reader) in SCHED_FIFO for the case, ahead of every
thread of the ordinary class, and all of them back in SCHED_OTHER after: the Kafka hop
when the processes on it never wait for a CPU, which tells the path's own
latency from the two shared cores' (docs/architecture.md, "The Kafka hop is
the wait for a CPU"). `--fifo broker` does it to the broker alone.

`--pin` gives the Kafka hop a core of its own: every thread of the broker,
the relay and this process (the reader) on the last CPU, PostgreSQL (the
postmaster, so its sessions to come too) and the timer on the others, for
the case. Compare with `bench_kafka_floor.py --pin`, whose stages and broker
get the same one CPU: the hop against its floor when neither shares its core
with the database's work (docs/architecture.md, "The busy tenants' topics
as the platform lays them out")."""

from __future__ import annotations

import argparse
import contextlib
import os
import time
import uuid

import psycopg
from common import (
    JobBatch,
    Reader,
    Services,
    broker_pause_share,
    broker_pauses,
    bulk_jobs,
    check_like_create,
    create_tenants,
    create_topics,
    delete_topics,
    describe,
    each_thread,
    fresh_database,
    grant,
    header,
    hop_cpu,
    machine_load,
    now_ms,
    percentile,
    pinned,
    postgres_pids,
    prefix_topics,
    say,
    time_of_day,
    vacuum_analyze,
)

from cronwheel import kafka
from cronwheel.kafka import Topics
from cronwheel.store.jobs import create_tenant

JOBS = 1_000
EVERY_MS = 1_000
TENANTS = 10
WARMUP_MS = 20_000  # past fresh partitions' one-time stall (bench_kafka_floor.py)
WINDOW_MS = 30_000
SETTLE_MS = 15_000  # a record not readable this long after the window counts as missing
TARGET_P99_MS = 25


IDLE_EVERY_MS = 60_000
PRIME_SETTLE_S = 20  # past fresh partitions' one-time stall, 8-15 s after their first records


def idle_tenants(conn: psycopg.Connection, topics: Topics, n: int) -> list[str]:
    """`n` tenants with one job a minute each; returns their run topics, made."""
    if not n:
        return []
    idle = [create_tenant(conn, f"idle-{i}") for i in range(n)]
    batch = JobBatch(
        n, now_ms() - IDLE_EVERY_MS, every_ms=IDLE_EVERY_MS, spread_ms=IDLE_EVERY_MS, name="idle"
    )
    bulk_jobs(conn, idle, batch)
    names = [topics.runs(t["tenant_id"]) for t in idle]
    create_topics(names)
    prime(names)
    return names


def prime(names: list[str]) -> None:
    """A record in each topic (nothing in the benchmark reads idle tenants'
    topics), then the stall that follows fresh partitions' first records."""
    producer = kafka.producer(principal="relay")
    for name in names:
        producer.produce(name, key=b"prime", value=b"")
        producer.poll(0)
    left = producer.flush(60)
    assert not left, f"{left} priming records not delivered"
    time.sleep(PRIME_SETTLE_S)


FIFO_PRIORITY = 5  # any real-time priority puts a thread ahead of every SCHED_OTHER one


def set_policy(pids: list[int], policy: int, priority: int) -> int:
    """Every live thread of `pids` to `policy`; returns how many threads."""
    return each_thread(
        pids, lambda tid: os.sched_setscheduler(tid, policy, os.sched_param(priority))
    )


@contextlib.contextmanager
def fifo(services: Services, who: str):
    """The broker, this process and the relay (`who` "hop"), or the broker
    alone ("broker"), in SCHED_FIFO until the end, then back (the shared
    broker first), whatever ended the case."""
    if who == "hop":
        pids = hop_pids(services)
    else:
        broker = services.pids.get("kafka-broker(shared)")
        pids = [broker] if broker else []
    try:
        n = set_policy(pids, os.SCHED_FIFO, FIFO_PRIORITY)
        say(
            f"fifo: {n} threads of {'the relay, the broker and the reader' if who == 'hop' else 'the broker'} in SCHED_FIFO"
        )
        yield
    finally:
        set_policy(pids, os.SCHED_OTHER, 0)


def hop_pids(services: Services) -> list[int]:
    """The processes on the Kafka hop: the broker (if found), the reader (this
    process) and the relay."""
    broker = services.pids.get("kafka-broker(shared)")
    return ([broker] if broker else []) + [services.pids["bench-reader"], services.pids["relay"]]


def pin(services: Services):
    """The hop (broker, relay, reader) on the last CPU; PostgreSQL and the timer
    on the rest."""
    cpus = set(range(os.cpu_count() or 1))
    hop = hop_cpu()
    return pinned(
        {
            "the relay, the broker and the reader": (hop_pids(services), hop),
            "PostgreSQL and the timer": (
                lambda: postgres_pids() + [services.pids["timer"]],
                cpus - hop,
            ),
        }
    )


def worst_seconds(arrivals: list, start: int, pauses: list | None, n: int = 3) -> str:
    """The `n` seconds of the window with the latest p99, each with its p50 and
    p99 lateness, its last produce() (from its instant) and the broker's
    collector pauses that began in it: whether a p99 is one bad second
    (aligned: one herd in 30 is 3% of the records) or spread over the window,
    and whether the broker had stopped then."""
    seconds: dict[int, list] = {}
    for a in arrivals:
        seconds.setdefault((a.scheduled_ms - start) // 1000, []).append(a)
    rows = []
    for second, group in seconds.items():
        late = [a.received_ms - a.scheduled_ms for a in group]
        produced = max(a.produced_ms - a.scheduled_ms for a in group)
        rows.append((percentile(late, 99), percentile(late, 50), produced, second))
    rows.sort(reverse=True)

    def paused(second: int) -> str:
        if pauses is None:
            return ""
        at = start + 1000 * second
        inside = [f"{length:.0f}" for begin, length in pauses if at <= begin < at + 1000]
        return f", broker paused {' + '.join(inside)} ms" if inside else ", broker not paused"

    return "; ".join(
        f"+{second} s ({time_of_day(start + 1000 * second)})"
        f" p50 {p50:.0f} p99 {p99:.0f} ms, last produce() {produced} ms{paused(second)}"
        for p99, p50, produced, second in rows[:n]
    )


def case(
    label: str, spread_ms: int, idle: int, realtime: str | None = None, pinning: bool = False
) -> float:
    prefix = f"bench{uuid.uuid4().hex[:8]}"
    topics = Topics(prefix)
    grant(prefix)
    with fresh_database() as url:
        with psycopg.connect(url, autocommit=True) as conn:
            tenants = create_tenants(conn, TENANTS)
            t0 = time.monotonic()
            idle_names = idle_tenants(conn, topics, idle)
        if idle:
            say(
                f"{label}: {idle} idle tenants, their jobs and run topics made and"
                f" primed in {time.monotonic() - t0:.0f} s"
            )
        names = [topics.runs(t["tenant_id"]) for t in tenants]
        try:
            with (
                Reader(names, decode=True) as reader,
                Services(url, prefix) as services,
                fifo(services, realtime) if realtime else contextlib.nullcontext(),
                pin(services) if pinning else contextlib.nullcontext(),
            ):
                with psycopg.connect(url, autocommit=True) as conn:
                    # Created over the last second (spread) or at one instant (aligned).
                    batch = JobBatch(
                        JOBS, now_ms() - EVERY_MS, every_ms=EVERY_MS, spread_ms=spread_ms
                    )
                    seed = bulk_jobs(conn, tenants, batch)
                    check_like_create(conn, topics, tenants, batch, seed)
                vacuum_analyze(url)
                # With idle tenants, a whole idle period too: every idle topic
                # then has had a record from this relay before the window, as on
                # a platform that has run for a while (a relay's first record to
                # a topic waits for the topic's metadata; bench_tenants.py's
                # first-run case measures that).
                start = now_ms() + WARMUP_MS + (IDLE_EVERY_MS if idle else 0)
                end = start + WINDOW_MS
                expected = JOBS * WINDOW_MS // EVERY_MS
                while now_ms() < start:
                    time.sleep(0.01)
                cpu0 = services.cpu()
                while now_ms() < end:
                    services.check_alive()
                    time.sleep(0.1)
                cpu1 = services.cpu()
                while True:  # the window's last records, up to SETTLE_MS after it
                    arrivals = [a for a in reader.snapshot() if start <= a.scheduled_ms < end]
                    if len(arrivals) >= expected or now_ms() > end + SETTLE_MS:
                        break
                    time.sleep(0.05)
                duplicates = reader.duplicates
                collections = reader.gc_pauses.describe(since_ms=start)
                pauses = broker_pauses(start, end)  # for the worst seconds, all in the window
        finally:
            # The prefix's every topic: the relay made its wake topic too.
            delete_topics(sorted(set(names + idle_names + prefix_topics(prefix))))
    # An instant whose record never became readable counts as infinitely late.
    missing = [float("inf")] * (expected - len(arrivals))
    late = [a.received_ms - a.scheduled_ms for a in arrivals] + missing
    pickup = [a.created_ms - a.scheduled_ms for a in arrivals]
    rest = [a.received_ms - a.created_ms for a in arrivals]
    # The relay's produce() call (the record's timestamp) splits the rest: with
    # firing ahead, created_at is before the instant and the relay holds the row.
    to_produce = [a.produced_ms - a.scheduled_ms for a in arrivals]
    to_read = [a.received_ms - a.produced_ms for a in arrivals]
    cpu = ", ".join(f"{n} {100 * (cpu1[n] - cpu0[n]) / (WINDOW_MS / 1000):.0f}%" for n in cpu1)
    say(
        f"{label}: {JOBS} jobs every {EVERY_MS} ms, anchors spread over {spread_ms} ms,"
        f" {TENANTS} busy tenants and {idle} idle ones;"
        f" {len(arrivals):,} of {expected:,} instants of a {WINDOW_MS // 1000} s window"
        f" readable by {SETTLE_MS} ms after it, {duplicates} duplicate records"
    )
    say(f"{label}: lateness scheduled_at -> readable by a consumer: {describe(late)}")
    say(f"{label}:   of which scheduled_at -> timer loop's now (created_at): {describe(pickup)}")
    say(f"{label}:   of which created_at -> readable (txn, relay, Kafka): {describe(rest)}")
    say(f"{label}:   scheduled_at -> the relay's produce():                {describe(to_produce)}")
    say(f"{label}:   the relay's produce() -> readable (Kafka):           {describe(to_read)}")
    say(f"{label}:   the window's worst seconds: {worst_seconds(arrivals, start, pauses)}")
    in_flight = [(a.received_ms - a.scheduled_ms, a.produced_ms, a.received_ms) for a in arrivals]
    say(
        f"{label}:   the broker's collector over the window:"
        f" {broker_pause_share(in_flight, start, end)}"
    )
    say(f"{label}:   the reader's process's garbage collections: {collections}")
    say(f"{label}:   CPU share of one core over the window: {cpu}")
    say(f"{label}: machine after: {machine_load()}")
    return percentile(late, 99)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--idle-tenants", type=int, default=0, help="idle tenants beside (0)")
    parser.add_argument("--only", choices=["spread", "aligned"], help="one case")
    parser.add_argument(
        "--fifo",
        nargs="?",
        const="hop",
        choices=["hop", "broker"],
        help="the relay, broker and reader (hop), or the broker alone, in SCHED_FIFO (root)",
    )
    parser.add_argument(
        "--pin",
        action="store_true",
        help="the relay, broker and reader on the last CPU; PostgreSQL and the timer on the rest",
    )
    args = parser.parse_args()
    header("bench_firing_steady: 1k jobs every second, lateness to a consumer")
    say(
        f"setup: per case a fresh database, {TENANTS} tenants, `cronwheel serve timer` and"
        " `cronwheel serve relay` as processes, a confluent-kafka reader (poll) in this"
        f" process; the first {WARMUP_MS} ms are warm-up and not counted"
        f" (with idle tenants, {WARMUP_MS + IDLE_EVERY_MS} ms)"
    )
    cases = {"spread": EVERY_MS, "aligned": 1}
    results = {
        label: case(label, spread_ms, args.idle_tenants, args.fifo, args.pin)
        for label, spread_ms in cases.items()
        if args.only in (None, label)
    }
    for label, p99 in results.items():
        say(
            f"RESULT steady {label}: p99 lateness {p99:.1f} ms"
            f" (target <= {TARGET_P99_MS} ms: {'met' if p99 <= TARGET_P99_MS else 'MISSED'})"
        )


if __name__ == "__main__":
    main()
