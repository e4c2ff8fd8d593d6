"""Known platform state for the system page's tests (GET /v1/system): runs
of known lateness, outbox rows and an overdue timer written as the platform
writes them, partition leases taken by the leases module itself, and a dead
letter on the topic as a consumer sets one aside."""

from __future__ import annotations

import uuid

import psycopg

from cronwheel import kafka
from cronwheel.core.avro import default_registry
from cronwheel.core.clock import now_ms, to_dt
from cronwheel.kafka import Topics
from cronwheel.store.leases import Leases

# Each a run's lateness: percentile_disc over 0..99 makes p50 the 50th value
# (49) and p99 the 99th (98). The 0 is a run created 800 ms ahead of its
# instant (the timer fires ahead; the relay holds it): counted as 0 late.
LATENESS_MS = list(range(100))
AHEAD_MS = 800


def known_runs(database_url: str, tenant_id: str, now: int | None = None) -> dict:
    """Runs of one job of `tenant_id` with instants in the last minute, one
    per value of LATENESS_MS, created that long after the instant; the even
    ones started (first attempt) at twice their lateness, the odd ones still
    PENDING. Beside them, runs the lateness figures leave out: an instant an
    hour ago (one PENDING run the pending sweep announced again a second
    ago), and a workflow node. Returns what the figures must then say."""
    now = now_ms() if now is None else now
    job = f"job_{uuid.uuid4().hex[:20]}"
    rows = []  # (job_id, instant, created, started, state, last re-announced)
    for i, late in enumerate(LATENESS_MS):
        at = now - 60_000 + i * 100
        created = at - AHEAD_MS if late == 0 else at + late
        started = at + 2 * late if i % 2 == 0 else None
        rows.append((job, at, created, started, "SUCCEEDED" if started else "PENDING", None))
    old = now - 3_600_000
    rows.append((job, old, old + 5, None, "PENDING", now - 1_000))
    rows.append((None, now - 20_000, now - 10_000, None, "PENDING", None))  # a workflow node
    with psycopg.connect(database_url, autocommit=True) as conn, conn.transaction():
        for n, (job_id, at, created, started, state, last_re) in enumerate(rows):
            conn.execute(
                "INSERT INTO runs_daily (partition_id, run_id, tenant_id, job_id, workflow_run_id,"
                " node, scheduled_at, spec, state, created_at, started_at, finished_at,"
                " updated_at, reannounced, last_reannounced_at)"
                " VALUES (%s, %s, %s, %s, %s, %s, %s, '{}', %s, %s, %s, %s, %s, %s, %s)",
                [
                    n % 1024, f"run_{uuid.uuid4().hex}", tenant_id, job_id,
                    None if job_id else f"wfr_{uuid.uuid4().hex[:8]}", None if job_id else "a",
                    to_dt(at), state, to_dt(created), to_dt(started) if started else None,
                    to_dt(started + 10) if started else None, to_dt(created),
                    1 if last_re else None, to_dt(last_re) if last_re else None,
                ],
            )  # fmt: skip
    started = sorted(2 * late for i, late in enumerate(LATENESS_MS) if i % 2 == 0)
    return {
        "fired": {"runs": 100, "p50_ms": 49, "p99_ms": 98, "max_ms": 99},
        # 50 values: p50 the 25th, p99 the 50th.
        "started": {
            "runs": 50,
            "p50_ms": started[24],
            "p99_ms": started[49],
            "max_ms": started[49],
        },
        "pending": sum(1 for r in rows if r[4] == "PENDING"),
    }


def backlog(database_url: str, ready: int, held: int, overdue: int) -> None:
    """Outbox rows the relay may publish now and rows held until their
    instant (no relay runs in these tests), and job timers a minute past due
    (no timer runs either)."""
    now = now_ms()
    with psycopg.connect(database_url, autocommit=True) as conn, conn.transaction():
        for i in range(ready + held):
            conn.execute(
                "INSERT INTO outbox (partition_id, topic, key, value, not_before)"
                " VALUES (%s, 'cw.runs.x', %s, '\\x00', %s)",
                [i % 1024, f"r{i}".encode(), to_dt(now + 3_600_000) if i >= ready else None],
            )
        for i in range(overdue):
            conn.execute(
                "INSERT INTO timers (partition_id, timer_id, kind, owner_id, due_at, priority)"
                " VALUES (%s, %s, 'job', %s, %s, 2)",
                [i % 1024, f"job:overdue{i}", f"overdue{i}", to_dt(now - 60_000 - i)],
            )


def leases(database_url: str, live: str = "timer", lapsed: str = "relay") -> None:
    """`live` holds every partition now (one instance, as a lone timer
    does); `lapsed` took them a minute ago and stopped renewing."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        Leases(live).tick(conn)
        Leases(lapsed, ttl_ms=10_000).tick(conn, now_ms() - 60_000)


def dead_letter(bootstrap: str, topics: Topics, reason: str, source_topic: str) -> None:
    """A DeadLetter record on the dead-letter topic, as the dispatcher's
    skeleton sets one aside (cronwheel/consumer.py DeadLetters)."""
    kafka.ensure_topics([topics.dead_letter], bootstrap=bootstrap, principal="dispatcher")
    value = default_registry().encode(
        "DeadLetter",
        {
            "source_topic": source_topic, "source_partition": 0, "source_offset": 7,
            "key": b"run-7", "value": b"not avro", "reason": reason,
            "consumer": "dispatcher", "at": now_ms(),
        },
    )  # fmt: skip
    p = kafka.producer(bootstrap, principal="dispatcher")
    errors: list = []
    p.produce(
        topics.dead_letter, value=value, key=b"run-7",
        headers=[("record", b"DeadLetter")], on_delivery=lambda e, _m: e and errors.append(e),
    )  # fmt: skip
    assert p.flush(30) == 0 and errors == [], errors
