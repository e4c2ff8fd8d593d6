"""No run waits forever (docs/pending-deadline.md), through the real firing loop:
a TimerService with its partitions' sweep timers and an injected clock, against
the real PostgreSQL. A RunReady lost after it was written (deleted from the
outbox here) leaves its run PENDING; past its deadline the run is announced
again (the same run id and attempt) and counted on the run, never once it
started, never while a StartRun holds it, and an `overlap: skip` job fires again
once the run ends."""

from __future__ import annotations

from dataclasses import dataclass, field

import psycopg
import pytest

from cronwheel.core.avro import default_registry
from cronwheel.core.clock import to_ms
from cronwheel.kafka import Topics
from cronwheel.store.jobs import Jobs, create_tenant
from cronwheel.store.lifecycle import Lifecycle
from cronwheel.store.pending import SWEEP_GROUPS, next_sweep
from cronwheel.store.runs_read import get_run
from services.timer.service import TimerService
from tests.support.gateway import ManualClock

pytestmark = pytest.mark.integration

T0 = 1_800_000_000_000
SEC = 1000
DEADLINE = 5 * SEC  # every class's, in these tests
SWEEP = SEC


@dataclass
class Fired:
    runs_created: int = 0
    reannounced: dict[str, int] = field(default_factory=dict)


@pytest.fixture
def conn(database_url):
    with psycopg.connect(database_url, autocommit=True) as c:
        yield c


@pytest.fixture
def clock() -> ManualClock:
    clock = ManualClock()
    clock.now = T0
    return clock


@pytest.fixture
def topics(topic_prefix) -> Topics:
    return Topics(topic_prefix)


@pytest.fixture
def service(database_url, topics, clock) -> TimerService:
    return TimerService(
        database_url, topics, lease_ttl_ms=60_000, clock=clock, ahead_ms=0,
        pending_deadlines_ms=(DEADLINE,) * 4, pending_sweep_ms=SWEEP,
    )  # fmt: skip


@pytest.fixture
def tenant(conn) -> dict:
    return create_tenant(conn, "acme")


def fire(service: TimerService, conn, clock: ManualClock, at: int) -> Fired:
    """The service's loop at `at` until nothing due is left: leases (and the
    sweep timers of partitions newly leased), then firings. One instance owns
    all 1024 partitions here, and a clock that jumps finds every group of
    sweeps due at once: more than a batch."""
    clock.now = at
    service.leases.tick(conn, at)
    service.arm_pending_sweeps(conn, at)
    fired = Fired()
    while True:
        report = service.fire_once(conn, at)
        fired.runs_created += report.runs_created
        for priority, n in report.reannounced.items():
            fired.reannounced[priority] = fired.reannounced.get(priority, 0) + n
        if report.timers < service.batch and not service.firing.backlog:
            return fired


def make_job(conn, topics, tenant, priority: str = "normal", **schedule) -> dict:
    body = {
        "name": "tick",
        "schedule": {"every_ms": 60 * SEC, **schedule},
        "target": {"type": "queue", "queue": "q"},
        "priority": priority,
    }
    return Jobs(topics).create(conn, tenant, body, T0)


def lose_records(conn) -> int:
    """The relay never publishes what is in the outbox now."""
    return conn.execute("DELETE FROM outbox").rowcount


def announced(conn) -> list[tuple[str, int]]:
    """(run_id, attempt) of every RunReady in the outbox, oldest first."""
    out = []
    for (value,) in conn.execute("SELECT value FROM outbox ORDER BY id").fetchall():
        name, rec = default_registry().decode(bytes(value))
        if name == "RunReady":
            out.append((rec["run_id"], rec["attempt"]))
    return out


def the_run(conn, job_id: str) -> tuple[str, str, int]:
    return conn.execute(
        "SELECT run_id, state, attempt FROM runs_daily WHERE job_id = %s", [job_id]
    ).fetchone()


def test_next_sweep__every_period_in_its_groups_phase():
    for p in (0, 1, 7, 8, 1023):
        due = next_sweep(p, T0 + 1, SWEEP)
        assert T0 + 1 < due <= T0 + 1 + SWEEP
        assert due % SWEEP == (p % SWEEP_GROUPS) * SWEEP // SWEEP_GROUPS
        assert next_sweep(p, due, SWEEP) == due + SWEEP
    assert len({next_sweep(p, T0, SWEEP) for p in range(1024)}) == SWEEP_GROUPS


def test_lost_record__announced_again_after_the_deadline__same_run_and_attempt(
    conn, topics, tenant, service, clock
):
    job_id = make_job(conn, topics, tenant)["job_id"]
    assert fire(service, conn, clock, T0 + 60 * SEC).runs_created == 1
    run_id, state, attempt = the_run(conn, job_id)
    assert (state, attempt) == ("PENDING", 1)
    assert lose_records(conn) == 1

    # Before the deadline: nothing.
    report = fire(service, conn, clock, T0 + 60 * SEC + DEADLINE - SEC)
    assert report.reannounced == {} and announced(conn) == []

    # Past it (and the partition's next sweep): announced again, once.
    report = fire(service, conn, clock, T0 + 60 * SEC + DEADLINE + SWEEP)
    assert report.reannounced == {"normal": 1}
    assert announced(conn) == [(run_id, 1)]
    assert the_run(conn, job_id) == (run_id, "PENDING", 1)
    shown = get_run(conn, tenant["tenant_id"], run_id)
    assert shown["reannounced"] == 1
    assert shown["last_reannounced_at"] == "2027-01-15T08:01:06.000Z"

    # The next deadline counts from that announcement, doubled: not at +5 s ...
    lose_records(conn)
    at = T0 + 60 * SEC + DEADLINE + SWEEP
    assert fire(service, conn, clock, at + DEADLINE + SWEEP).reannounced == {}
    # ... at +10 s.
    assert fire(service, conn, clock, at + 2 * DEADLINE + SWEEP).reannounced == {"normal": 1}
    assert announced(conn) == [(run_id, 1)]
    assert get_run(conn, tenant["tenant_id"], run_id)["reannounced"] == 2


def test_started_run__never_announced_again(conn, topics, tenant, service, clock):
    job_id = make_job(conn, topics, tenant)["job_id"]
    fire(service, conn, clock, T0 + 60 * SEC)
    run_id, _, _ = the_run(conn, job_id)
    lose_records(conn)
    at = T0 + 60 * SEC + DEADLINE + SWEEP
    Lifecycle(topics).start(conn, tenant["tenant_id"], run_id, "w1", at - 1)
    assert fire(service, conn, clock, at).reannounced == {}
    assert fire(service, conn, clock, at + 4 * DEADLINE).reannounced == {}
    assert announced(conn) == []
    assert get_run(conn, tenant["tenant_id"], run_id)["reannounced"] == 0


def test_run_a_start_holds__skipped__then_started_not_announced(
    conn, database_url, topics, tenant, service, clock
):
    """The fence: a StartRun in flight holds the run's row; the sweep passes it
    by rather than wait, and once the start commits the run is RUNNING and the
    next sweep leaves it alone."""
    job_id = make_job(conn, topics, tenant)["job_id"]
    fire(service, conn, clock, T0 + 60 * SEC)
    run_id, _, _ = the_run(conn, job_id)
    lose_records(conn)
    at = T0 + 60 * SEC + DEADLINE + SWEEP
    with psycopg.connect(database_url) as starter:
        started = Lifecycle(topics).start(starter, tenant["tenant_id"], run_id, "w1", at)
        assert started["attempt"] == 1  # not committed yet: the row is locked
        assert fire(service, conn, clock, at).reannounced == {}
        starter.commit()
    assert fire(service, conn, clock, at + 4 * DEADLINE).reannounced == {}
    assert announced(conn) == []
    assert the_run(conn, job_id) == (run_id, "RUNNING", 1)


def test_forwarded_mark_cleared__the_dispatcher_forwards_the_new_record(
    conn, topics, tenant, service, clock
):
    """A record a dispatcher of v0.3.0 forwarded (its mark is (run_id,
    attempt), dispatch.legacy_message_key) and a worker then lost: the mark
    goes with the re-announcement, or such a dispatcher would skip it. This
    release's dispatcher keys each announcement by its created_at, so the
    re-announcement (made now) is never its mark of the first."""
    job_id = make_job(conn, topics, tenant)["job_id"]
    fire(service, conn, clock, T0 + 60 * SEC)
    run_id, _, _ = the_run(conn, job_id)
    lose_records(conn)
    conn.execute(
        "INSERT INTO processed (consumer, message_key) VALUES ('dispatcher', %s),"
        " ('dispatcher', 'other:1'), ('workflow', %s)",
        [f"{run_id}:1", f"{run_id}:1"],
    )
    fire(service, conn, clock, T0 + 60 * SEC + DEADLINE + SWEEP)
    assert announced(conn) == [(run_id, 1)]
    left = conn.execute("SELECT consumer, message_key FROM processed ORDER BY 1, 2").fetchall()
    assert left == [("dispatcher", "other:1"), ("workflow", f"{run_id}:1")]


def test_deadline_by_class__critical_sooner(conn, database_url, topics, clock):
    service = TimerService(
        database_url, topics, lease_ttl_ms=60_000, clock=clock, ahead_ms=0,
        pending_deadlines_ms=(2 * SEC, 4 * SEC, 8 * SEC, 16 * SEC), pending_sweep_ms=SWEEP,
    )  # fmt: skip
    tenant = create_tenant(conn, "both", priority_classes=["critical", "normal"])
    critical = make_job(conn, topics, tenant, priority="critical")
    make_job(conn, topics, tenant)  # a normal run beside it
    fire(service, conn, clock, T0 + 60 * SEC)
    lose_records(conn)
    report = fire(service, conn, clock, T0 + 60 * SEC + 2 * SEC + SWEEP)
    assert report.reannounced == {"critical": 1}
    assert announced(conn) == [(the_run(conn, critical["job_id"])[0], 1)]
    # At +9 s: the normal run's first (8 s), the critical run's second (3 s + 2 x 2 s).
    report = fire(service, conn, clock, T0 + 60 * SEC + 8 * SEC + SWEEP)
    assert report.reannounced == {"critical": 1, "normal": 1}
    counts = conn.execute(
        "SELECT priority, reannounced FROM runs_daily ORDER BY priority"
    ).fetchall()
    assert counts == [("critical", 2), ("normal", 1)]


def test_overlap_skip__blocked_while_lost__fires_again_once_the_run_ends(
    conn, topics, tenant, service, clock
):
    job_id = make_job(conn, topics, tenant, every_ms=2 * SEC, overlap="skip")["job_id"]
    fire(service, conn, clock, T0 + 2 * SEC)
    run_id, _, _ = the_run(conn, job_id)
    lose_records(conn)
    # The lost run holds the job: its next instants are skipped ...
    fire(service, conn, clock, T0 + 4 * SEC)
    assert conn.execute("SELECT count(*) FROM runs_daily").fetchone()[0] == 1
    # ... until it is announced again, started and finished.
    at = T0 + 2 * SEC + DEADLINE + SWEEP
    fire(service, conn, clock, at)
    assert announced(conn) == [(run_id, 1)]
    life = Lifecycle(topics)
    got = life.start(conn, tenant["tenant_id"], run_id, "w1", at)
    life.complete(conn, tenant["tenant_id"], run_id, 1, got["start_token"], "SUCCEEDED", at)
    fire(service, conn, clock, at + 2 * SEC)
    runs = conn.execute(
        "SELECT scheduled_at, state FROM runs_daily ORDER BY scheduled_at"
    ).fetchall()
    assert [(to_ms(s) - T0, st) for s, st in runs] == [
        (2 * SEC, "SUCCEEDED"),
        (10 * SEC, "PENDING"),
    ]
