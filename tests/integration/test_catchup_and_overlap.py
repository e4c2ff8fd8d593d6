"""Downtime and overlap through the real firing loop: the TimerService's leases and
fire_once against the real PostgreSQL, driven by an injected clock (no threads),
so "the service was down for 10 s" is just a jump of the clock."""

from __future__ import annotations

import psycopg
import pytest

from cronwheel.core.clock import to_ms
from cronwheel.core.ids import run_id_for_instant
from cronwheel.kafka import Topics
from cronwheel.store.jobs import Jobs, create_tenant
from services.timer.service import TimerService

pytestmark = pytest.mark.integration

T0 = 1_800_000_000_000
SEC = 1000


class Clock:
    def __init__(self, now: int):
        self.now = now

    def __call__(self) -> int:
        return self.now


@pytest.fixture
def conn(database_url):
    with psycopg.connect(database_url, autocommit=True) as c:
        yield c


@pytest.fixture
def clock() -> Clock:
    return Clock(T0)


@pytest.fixture
def topics(topic_prefix) -> Topics:
    return Topics(topic_prefix)


@pytest.fixture
def service(database_url, topics, clock) -> TimerService:
    return TimerService(database_url, topics, lease_ttl_ms=5000, clock=clock, ahead_ms=0)


@pytest.fixture
def tenant(conn) -> dict:
    return create_tenant(conn, "acme")


def make_job(conn, topics, tenant, **schedule) -> dict:
    body = {
        "name": "tick",
        "schedule": {"every_ms": SEC, **schedule},
        "target": {"type": "queue", "queue": "q"},
    }
    return Jobs(topics).create(conn, tenant, body, T0)


def fire(service: TimerService, conn, clock: Clock, at: int):
    clock.now = at
    service.leases.tick(conn, at)
    return service.fire_once(conn, at)


def runs_of(conn, job_id: str) -> list[tuple[str, int, list | None]]:
    rows = conn.execute(
        "SELECT run_id, scheduled_at, covers FROM runs_daily WHERE job_id = %s ORDER BY scheduled_at",
        [job_id],
    ).fetchall()
    return [(r[0], to_ms(r[1]), r[2]) for r in rows]


def counters(conn, job_id: str) -> tuple[int, int, int]:
    return conn.execute(
        "SELECT fired_count, missed_count, overlap_skipped FROM jobs WHERE job_id = %s", [job_id]
    ).fetchone()


def test_downtime_longer_than_window__in_window_instants_fire_once_older_ones_counted_missed(
    conn, topics, tenant, service, clock
):
    job_id = make_job(conn, topics, tenant, catchup={"window_ms": 5 * SEC})["job_id"]
    first = fire(service, conn, clock, T0 + SEC)
    assert (first.runs_created, first.missed) == (1, 0)

    # Stopped for 10 s of clock time: instants 2 s .. 11 s come due meanwhile.
    back = T0 + 11 * SEC
    report = fire(service, conn, clock, back)
    assert report.missed == 4  # 2, 3, 4, 5 s: older than the 5 s window
    assert report.runs_created == 6  # 6 .. 11 s
    runs = runs_of(conn, job_id)
    assert [at for _, at, _ in runs] == [T0 + k * SEC for k in (1, 6, 7, 8, 9, 10, 11)]
    assert all(rid == run_id_for_instant(job_id, at) for rid, at, _ in runs)
    assert counters(conn, job_id) == (7, 4, 0)

    # The same clock again: the timer has moved on, nothing fires twice.
    again = fire(service, conn, clock, back)
    assert (again.timers, again.runs_created, again.missed) == (0, 0, 0)
    assert len(runs_of(conn, job_id)) == 7
    assert counters(conn, job_id) == (7, 4, 0)
    assert conn.execute("SELECT count(*) FROM outbox").fetchone()[0] == 7
    due = conn.execute("SELECT due_at FROM timers WHERE owner_id = %s", [job_id]).fetchone()[0]
    assert to_ms(due) == T0 + 12 * SEC


def test_downtime_with_policy_latest__one_run_carrying_the_window(
    conn, topics, tenant, service, clock
):
    job_id = make_job(conn, topics, tenant, catchup={"window_ms": 5 * SEC, "policy": "latest"})[
        "job_id"
    ]
    report = fire(service, conn, clock, T0 + 10 * SEC)
    assert (report.runs_created, report.missed) == (1, 4)
    [(_, at, covers)] = runs_of(conn, job_id)
    assert at == T0 + 10 * SEC
    assert covers == [T0 + k * SEC for k in range(5, 11)]
    assert counters(conn, job_id) == (1, 4, 0)


def test_overlap_skip__active_run__no_new_run_and_counted_skipped(
    conn, topics, tenant, service, clock
):
    jobs = Jobs(topics)
    job_id = make_job(conn, topics, tenant, overlap="skip")["job_id"]
    active = jobs.trigger(conn, tenant, job_id, T0 + 500)["run_id"]  # PENDING

    report = fire(service, conn, clock, T0 + SEC)
    assert (report.timers, report.runs_created) == (1, 0)
    assert [rid for rid, _, _ in runs_of(conn, job_id)] == [active]
    assert counters(conn, job_id) == (0, 0, 1)
    job = jobs.get(conn, tenant["tenant_id"], job_id)
    assert job["overlap_skipped"] == 1

    # Once the active run has ended, the next instant fires again.
    conn.execute(
        "UPDATE runs_daily SET state = 'SUCCEEDED', finished_at = now() WHERE run_id = %s", [active]
    )
    report = fire(service, conn, clock, T0 + 2 * SEC)
    assert report.runs_created == 1
    assert runs_of(conn, job_id)[-1][:2] == (run_id_for_instant(job_id, T0 + 2 * SEC), T0 + 2 * SEC)
    assert counters(conn, job_id) == (1, 0, 1)
