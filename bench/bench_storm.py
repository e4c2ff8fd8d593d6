"""Storm with priorities and tenants: N normal one-off jobs across 50 tenants of
very different sizes (one floods, one has 10 jobs) plus 500 critical ones, all
due at one instant, through timer, relay and dispatcher (processes) to the
workers' queue topics. When a run reached its queue topic is the timestamp the
dispatcher's producer gave its record (the reader may lag on a busy machine).

Figures: time until every run is delivered; critical p99 lateness (target
<= 200 ms while the herd drains); nothing lost; each tenant's p50 lateness,
the smallest tenant's against the median tenant's (target <= 2x).

Then the dispatcher alone, against a backlog of normal records already on a run
topic: how long critical records produced afterwards wait, with the lower
classes' partitions paused under backlog and without (the choice documented
in docs/priority.md).

Usage: bench_storm.py [N]   (default 100000; prints what it ran)
"""

from __future__ import annotations

import statistics
import sys
import threading
import time
import uuid

import psycopg
from common import (
    Services,
    create_tenants,
    delete_topics,
    fresh_database,
    grant,
    header,
    machine_load,
    observer_group,
    percentile,
    say,
    vacuum_analyze,
)
from confluent_kafka import OFFSET_BEGINNING, TopicPartition

from cronwheel import config, kafka
from cronwheel.core import events
from cronwheel.core.avro import default_registry
from cronwheel.core.clock import iso, now_ms, to_dt, to_ms
from cronwheel.core.jobs import parse_job
from cronwheel.core.runs import PRIORITIES, PRIORITY_RANK
from cronwheel.kafka import Topics, class_of_partition
from cronwheel.store.jobs import _spec_columns
from services.dispatcher.service import Dispatcher

TENANTS = 50
CRITICAL = 500
SMALLEST = 10
CRITICAL_P99_TARGET_MS = 200
SPREAD_TARGET = 2.0

# Jobs and timers of one tenant in one statement, with the values Jobs.create
# writes (as common.bulk_jobs, which splits evenly and leaves timers' tenant
# unset); here each tenant gets its own count and its timers their lane.
BULK = """
WITH src AS (
    SELECT g, 'job_' || substr(md5(%(seed)s || g::text), 1, 20) AS job_id
      FROM generate_series(1, %(n)s) AS g
), ins AS (
    INSERT INTO jobs (partition_id, job_id, tenant_id, name, schedule, target, payload,
                      priority, retry, timeout_ms, lease_ms, overlap, catchup, jitter_ms,
                      anchor_at, last_instant, created_at, updated_at)
    SELECT ((get_byte(d, 6) << 8) | get_byte(d, 7)) & 1023, job_id, %(tenant)s,
           %(name)s || '-' || g, %(schedule)s, %(target)s, %(payload)s, %(priority)s,
           %(retry)s, %(timeout_ms)s, %(lease_ms)s, %(overlap)s, %(catchup)s, %(jitter_ms)s,
           %(created)s, %(created)s, %(created)s, %(created)s
      FROM src, LATERAL (SELECT sha256(convert_to(job_id, 'UTF8')) AS d) h
    RETURNING partition_id, job_id
)
INSERT INTO timers (partition_id, timer_id, kind, owner_id, due_at, priority, attempt, tenant_id)
SELECT partition_id, 'job:' || job_id, 'job', job_id, %(due)s, %(prio)s, NULL, %(tenant)s
  FROM ins
"""


def sizes(total: int, n: int = TENANTS) -> list[int]:
    """Tenant sizes falling off as 1/rank (a few big, many small), the last one
    SMALLEST; they add up to `total`."""
    weights = [1 / (i + 1) for i in range(n - 1)]
    rest = total - SMALLEST
    out = [max(SMALLEST, int(rest * w / sum(weights))) for w in weights]
    out[0] += rest - sum(out)
    return [*out, SMALLEST]


def insert(conn, tenant_id: str, n: int, due: int, created: int, priority: str) -> None:
    body = {
        "name": f"storm-{priority}",
        "schedule": {"at": iso(due)},
        "target": {"type": "queue", "queue": "work"},
        "payload": {"bench": True},
        "priority": priority,
    }
    spec = parse_job(body, now_ms=created, allowed_priorities=PRIORITIES)
    with conn.transaction():
        conn.execute(
            BULK,
            {
                **_spec_columns(spec),
                "seed": uuid.uuid4().hex,
                "n": n,
                "tenant": tenant_id,
                "created": to_dt(created),
                "due": to_dt(due),
                "prio": PRIORITY_RANK[priority],
            },
        )
        conn.execute("SELECT pg_notify('cw_timers', %s::text)", [due])


class Arrivals:
    """Every partition of `topics` from the start, in a thread: per run (key),
    the record's timestamp, tenant and class (decode=False: timestamp, topic
    and partition, which for a run topic says the class); duplicates counted."""

    def __init__(self, topics: list[str], decode: bool = True):
        self.decode = decode
        kafka.ensure_topics(topics, principal="dispatcher")  # run or queue topics
        self.c = kafka.consumer(observer_group(), principal="observer")
        deadline = time.monotonic() + 30
        meta = self.c.list_topics(timeout=10).topics
        while not all(t in meta and meta[t].partitions for t in topics):
            if time.monotonic() > deadline:
                raise RuntimeError("the queue topics did not appear in the metadata")
            time.sleep(0.1)  # a new topic reaches the metadata in a moment
            meta = self.c.list_topics(timeout=10).topics
        self.c.assign(
            [TopicPartition(t, p, OFFSET_BEGINNING) for t in topics for p in meta[t].partitions]
        )
        self.seen: dict[bytes, tuple] = {}  # key -> (timestamp, tenant|topic, class|partition, due)
        self.duplicates = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        decode = default_registry().decode
        while not self._stop.is_set():
            for m in self.c.consume(2000, timeout=0.05):
                if m.error() is not None:
                    continue
                if m.key() in self.seen:
                    self.duplicates += 1
                    continue
                if self.decode:
                    _name, d = decode(m.value())
                    self.seen[m.key()] = (
                        m.timestamp()[1],
                        d["tenant_id"],
                        d["priority"],
                        d["scheduled_at"],
                    )
                else:
                    self.seen[m.key()] = (m.timestamp()[1], m.topic(), m.partition(), None)

    def __enter__(self) -> Arrivals:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(10)
        self.c.close()


class StormServices(Services):
    """Timer, relay and dispatcher; ready when the timer and relay lease every
    partition (the dispatcher leases none: Kafka assigns its partitions)."""

    def _wait_ready(self, timeout: float = 60.0) -> None:
        leased = self.names
        self.names = tuple(n for n in leased if n != "dispatcher")
        try:
            super()._wait_ready(timeout)
        finally:
            self.names = leased


def storm(total: int) -> None:
    prefix = f"bench{uuid.uuid4().hex[:8]}"
    topics = Topics(prefix)
    counts = sizes(total)
    grant(prefix)
    with fresh_database() as url:
        with psycopg.connect(url, autocommit=True) as conn:
            tenants = create_tenants(conn, TENANTS)
        ids = [t["tenant_id"] for t in tenants]
        runs_topics = [topics.runs(t) for t in ids]
        queues = [topics.queue(t, "work") for t in ids]
        # The dispatcher finds the run topics at once; the queue topics exist, as
        # they do when workers consume them (else the first forwards wait for
        # their creation, a cold start no storm in production meets).
        kafka.ensure_topics(runs_topics + queues, principal="dispatcher")
        crit_per = CRITICAL // 10  # the 500 critical: 50 each for the 10 largest tenants
        say(
            f"setup: {total:,} normal one-off jobs across {TENANTS} tenants (largest"
            f" {counts[0]:,}, median {sorted(counts)[TENANTS // 2]:,}, smallest {counts[-1]})"
            f" + {CRITICAL} critical ({crit_per} in each of the 10 largest tenants), all due"
            " at one instant; `cronwheel serve timer|relay|dispatcher` as processes with"
            " default settings; lateness = queue-topic record timestamp - due instant"
        )
        try:
            with (
                Arrivals(queues) as got,
                Arrivals(runs_topics, decode=False) as published,
                StormServices(url, prefix, ("timer", "relay", "dispatcher")) as services,
            ):
                # Warm-up: one run per tenant and class through every service, so
                # each has met every topic once (metadata, connections), as in a
                # running system; the storm's figures exclude these runs.
                warm = now_ms() + 3000
                with psycopg.connect(url, autocommit=True) as conn:
                    for tid in ids:
                        insert(conn, tid, 1, warm, now_ms(), "normal")
                    for tid in ids[:10]:
                        insert(conn, tid, 1, warm, now_ms(), "critical")
                deadline = time.monotonic() + 120
                while len(got.seen) < TENANTS + 10 and time.monotonic() < deadline:
                    services.check_alive()
                    time.sleep(0.05)
                start = now_ms()
                due = start + 10_000 + total // 3  # insert (~6-20k jobs/s here) + VACUUM + lead
                with psycopg.connect(url, autocommit=True) as conn:
                    for tid, n in zip(ids, counts, strict=True):
                        insert(conn, tid, n, due, start, "normal")
                    for tid in ids[:10]:
                        insert(conn, tid, crit_per, due, start, "critical")
                inserted = now_ms()
                vacuum_analyze(url)
                say(
                    f"inserted in {(inserted - start) / 1000:.1f} s, VACUUM ANALYZE done"
                    f" {due - now_ms()} ms before the due instant"
                )
                if now_ms() > due - 500:
                    say("warning: the insert ended too close to the due instant; figures suspect")
                want = total + CRITICAL
                deadline = time.monotonic() + 900
                while len(got.seen) < want + TENANTS + 10 and time.monotonic() < deadline:
                    services.check_alive()
                    time.sleep(0.05)
                after = machine_load()
                with psycopg.connect(url, autocommit=True) as conn:
                    n_runs = conn.execute(
                        "SELECT count(*) FROM runs_daily WHERE scheduled_at = %s", [to_dt(due)]
                    ).fetchone()[0]
                    left = conn.execute("SELECT count(*) FROM outbox").fetchone()[0]
                    fired = conn.execute(
                        "SELECT priority, min(created_at), max(created_at) FROM runs_daily"
                        " WHERE scheduled_at = %s GROUP BY 1",
                        [to_dt(due)],
                    ).fetchall()
            report(got, counts, ids, due, want, n_runs, left)
            say(
                "where the time went: the timer created them (runs.created_at - due) "
                + "; ".join(
                    f"{p} +{to_ms(lo) - due} .. +{to_ms(hi) - due} ms" for p, lo, hi in fired
                )
                + stage(published, "the relay published them on run topics", due)
                + stage(got, "the dispatcher on queue topics", due)
            )
            say(f"machine after: {after}")
        finally:
            delete_topics(runs_topics + queues)


def stage(arrivals: Arrivals, what: str, due: int) -> str:
    """Critical and normal records' first and last timestamps on some topics."""
    by: dict[str, list[int]] = {"critical": [], "normal": []}
    for ts, _where, cls, scheduled in arrivals.seen.values():
        if scheduled != due and (scheduled is not None or ts < due - 1000):
            continue  # the warm-up's
        if not arrivals.decode:  # a run topic laid out by class: 0-1 critical, 4-5 normal
            cls = PRIORITIES[class_of_partition(cls, 8) or 0]
        by.setdefault(cls, []).append(ts - due)
    parts = [f"{c} +{min(v)} .. +{max(v)} ms" for c, v in by.items() if v]
    return f"; {what}: " + "; ".join(parts)


def report(got: Arrivals, counts, ids, due, want, n_runs, left) -> None:
    late = {"critical": [], "normal": []}
    per_tenant: dict[str, list[int]] = {t: [] for t in ids}
    for ts, tenant, prio, scheduled in got.seen.values():
        if scheduled != due:
            continue  # the warm-up's
        late[prio].append(ts - due)
        if prio == "normal":
            per_tenant[tenant].append(ts - due)
    delivered = len(late["critical"]) + len(late["normal"])
    everything = max(late["critical"] + late["normal"])
    crit = late["critical"]
    say(
        f"delivered {delivered:,}/{want:,} runs ({n_runs:,} in the database, {left} left in the"
        f" outbox, {got.duplicates} duplicate records read); the last reached its queue"
        f" topic {everything / 1000:.1f} s after the due instant"
        f" (= {delivered / max(everything / 1000, 1e-3):,.0f} runs/s end to end)"
    )
    say(
        f"critical ({len(crit)}): p50 {percentile(crit, 50):.0f} ms, p99"
        f" {percentile(crit, 99):.0f} ms, max {max(crit):.0f} ms;"
        f" normal: p50 {percentile(late['normal'], 50):.0f} ms,"
        f" p99 {percentile(late['normal'], 99):.0f} ms"
    )
    p50 = {t: statistics.median(v) for t, v in per_tenant.items() if v}
    ordered = sorted(p50.values())
    median_tenant = statistics.median(ordered)
    smallest = p50[ids[-1]]
    largest = p50[ids[0]]
    say(
        f"per-tenant p50 lateness: smallest tenant ({counts[-1]} jobs) {smallest:.0f} ms,"
        f" median tenant {median_tenant:.0f} ms, largest tenant ({counts[0]:,} jobs)"
        f" {largest:.0f} ms; tenants' p50 from {ordered[0]:.0f} to {ordered[-1]:.0f} ms"
    )
    spread = smallest / max(median_tenant, 1)
    lost = want - delivered
    say(
        f"RESULT storm {want:,}: critical p99 {percentile(crit, 99):.0f} ms (target <="
        f" {CRITICAL_P99_TARGET_MS}: {'met' if percentile(crit, 99) <= CRITICAL_P99_TARGET_MS else 'MISSED'});"
        f" lost {lost} ({'met' if lost == 0 else 'MISSED'}); smallest/median tenant p50"
        f" {spread:.2f}x (target <= {SPREAD_TARGET}: {'met' if spread <= SPREAD_TARGET else 'MISSED'});"
        f" all delivered in {everything / 1000:.1f} s"
    )


def _ready(run_id: str, priority: str) -> bytes:
    return events.run_ready(
        run_id=run_id,
        tenant_id="acme",
        partition_id=1,
        attempt=1,
        scheduled_ms=now_ms(),
        created_ms=now_ms(),
        priority=priority,
        target={"type": "queue", "queue": "work"},
        payload="null",
    )


def dispatcher_backlog(pausing: bool, backlog: int = 20_000, critical: int = 50) -> None:
    """A backlog of normal records on a run topic (partitions 4-5, as the relay
    lays them out), the dispatcher started, and once it is draining, critical
    records produced to partition 0: how long until they are forwarded."""
    prefix = f"bench{uuid.uuid4().hex[:8]}"
    topics = Topics(prefix)
    source, dest = topics.runs("acme"), topics.queue("acme", "work")
    grant(prefix)
    kafka.ensure_topics([source], principal="dispatcher")
    p = kafka.producer(principal="relay")  # run topics are the relay's to write
    for i in range(backlog):
        p.produce(
            source, key=f"n{i}".encode(), value=_ready(f"n{i}", "normal"), partition=4 + i % 2
        )
    p.flush(60)
    stop = threading.Event()
    try:
        with fresh_database() as url, Arrivals([dest]) as got:
            d = Dispatcher(url, config.kafka_bootstrap(), topics, class_pausing=pausing)
            thread = threading.Thread(target=d.run, args=(stop,), daemon=True)
            thread.start()
            while len(got.seen) < 1000:
                time.sleep(0.01)
            before = len(got.seen)
            sent = now_ms()
            for i in range(critical):
                p.produce(
                    source, key=f"c{i}".encode(), value=_ready(f"c{i}", "critical"), partition=0
                )
            p.flush(30)
            deadline = time.monotonic() + 300
            while len(got.seen) < backlog + critical and time.monotonic() < deadline:
                time.sleep(0.02)
            stop.set()
            thread.join(30)
            rows = sorted(got.seen.values())
            crit = [r[0] - sent for r in rows if r[2] == "critical"]
            last = max(i for i, r in enumerate(rows) if r[2] == "critical")
            drained = rows[-1][0] - sent
            say(
                f"dispatcher backlog, class pausing {'on ' if pausing else 'off'}: {backlog:,}"
                f" normal waiting, {critical} critical produced after {before:,} were"
                f" forwarded: critical forwarded p50 +{percentile(crit, 50):.0f} ms,"
                f" last +{max(crit):.0f} ms, after {last - before - critical + 1:,} more normal"
                f" (backlog drained at +{drained} ms)"
            )
    finally:
        delete_topics([source, dest])


def main() -> None:
    total = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    header("bench_storm: priority classes and tenant fairness in one storm")
    storm(total)
    for pausing in (True, False):
        dispatcher_backlog(pausing)


if __name__ == "__main__":
    main()
