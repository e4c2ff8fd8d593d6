"""Job operations (cronwheel.store.jobs.Jobs) against the real PostgreSQL: each
operation changes the job, its timer and its runs together, and tenants never see
each other's jobs.

Time is passed in (`now`), so the tests choose it; where an operation's effect is
what the timer later does, the real TimerService fires at a chosen clock.
"""

from __future__ import annotations

import psycopg
import pytest

from cronwheel.core.avro import default_registry
from cronwheel.core.clock import iso, to_ms
from cronwheel.core.errors import NotFound, ValidationError
from cronwheel.core.ids import partition_of, run_id_for_instant, run_id_for_trigger
from cronwheel.core.schedule import jitter_offset_ms
from cronwheel.kafka import Topics
from cronwheel.store.jobs import Jobs, create_tenant
from cronwheel.store.lifecycle import Lifecycle
from services.timer.service import TimerService

pytestmark = pytest.mark.integration

T0 = 1_800_000_000_000
MIN = 60_000


@pytest.fixture
def conn(database_url):
    with psycopg.connect(database_url, autocommit=True) as c:
        yield c


@pytest.fixture
def topics(topic_prefix) -> Topics:
    return Topics(topic_prefix)


@pytest.fixture
def jobs(topics) -> Jobs:
    return Jobs(topics)


@pytest.fixture
def tenant(conn) -> dict:
    return create_tenant(conn, "acme")


def body(name: str = "tick", **schedule) -> dict:
    return {
        "name": name,
        "schedule": schedule or {"every_ms": MIN},
        "target": {"type": "queue", "queue": "billing"},
        "payload": {"n": 1},
    }


def timer_due(conn, job_id: str) -> int | None:
    row = conn.execute(
        "SELECT due_at FROM timers WHERE kind = 'job' AND owner_id = %s", [job_id]
    ).fetchone()
    return to_ms(row[0]) if row else None


def run_instants(conn, job_id: str) -> list[int]:
    rows = conn.execute(
        "SELECT scheduled_at FROM runs_daily WHERE job_id = %s ORDER BY scheduled_at", [job_id]
    ).fetchall()
    return [to_ms(r[0]) for r in rows]


def fire_at(database_url, topics, conn, now: int):
    """One pass of the real firing loop at the clock `now`."""
    service = TimerService(database_url, topics, lease_ttl_ms=60_000, clock=lambda: now, ahead_ms=0)
    service.leases.tick(conn, now)
    return service.fire_once(conn, now)


def test_create__timer_at_first_instant_with_jitter__returns_next_fire_and_topic(
    conn, jobs, topics, tenant
):
    job = jobs.create(conn, tenant, body(every_ms=MIN, jitter_ms=5000), T0)
    first = T0 + MIN
    due = first + jitter_offset_ms(job["job_id"], first, 5000)
    assert timer_due(conn, job["job_id"]) == due
    assert job["next_fire_at"] == iso(due)
    assert job["topic"] == topics.queue(tenant["tenant_id"], "billing")
    partition = conn.execute(
        "SELECT partition_id FROM timers WHERE owner_id = %s", [job["job_id"]]
    ).fetchone()[0]
    assert partition == partition_of(job["job_id"])
    assert (job["version"], job["paused"], job["payload"]) == (1, False, {"n": 1})
    assert job["schedule"]["jitter_ms"] == 5000
    assert job["schedule"]["catchup"] == {"window_ms": 300_000, "policy": "all", "max_runs": 100}


def test_create__invalid_body__nothing_written(conn, jobs, tenant):
    with pytest.raises(ValidationError):
        jobs.create(conn, tenant, body(every_ms=10), T0)
    assert conn.execute("SELECT count(*) FROM jobs").fetchone()[0] == 0
    assert conn.execute("SELECT count(*) FROM timers").fetchone()[0] == 0


def test_list__pages_of_three__every_job_once_and_no_other_tenant(conn, jobs, tenant):
    other = create_tenant(conn, "globex")
    theirs = {jobs.create(conn, other, body(f"o{i}"), T0)["job_id"] for i in range(2)}
    # Pairs share a creation millisecond, so the cursor's tie-break is exercised.
    mine = [jobs.create(conn, tenant, body(f"m{i}"), T0 + i // 2)["job_id"] for i in range(7)]
    seen: list[str] = []
    cursor = None
    pages = []
    while True:
        page = jobs.list(conn, tenant["tenant_id"], cursor=cursor, limit=3)
        pages.append(len(page["items"]))
        seen += [j["job_id"] for j in page["items"]]
        assert all(j["tenant_id"] == tenant["tenant_id"] for j in page["items"])
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert pages == [3, 3, 1]
    assert sorted(seen) == sorted(mine) and len(seen) == 7
    assert not set(seen) & theirs
    assert {j["job_id"] for j in jobs.list(conn, other["tenant_id"])["items"]} == theirs


def test_list__bad_cursor__validation_error(conn, jobs, tenant):
    with pytest.raises(ValidationError) as err:
        jobs.list(conn, tenant["tenant_id"], cursor="not-a-cursor")
    assert err.value.field == "cursor"


def test_other_tenants_job__get_update_trigger_delete__not_found(conn, jobs, tenant):
    other = create_tenant(conn, "globex")
    job_id = jobs.create(conn, other, body(), T0)["job_id"]
    with pytest.raises(NotFound):
        jobs.get(conn, tenant["tenant_id"], job_id)
    for op in (
        lambda: jobs.update(conn, tenant, job_id, {"name": "mine"}, T0 + 1),
        lambda: jobs.trigger(conn, tenant, job_id, T0 + 1),
        lambda: jobs.delete(conn, tenant, job_id, T0 + 1),
    ):
        with pytest.raises(NotFound):
            op()
    assert jobs.get(conn, other["tenant_id"], job_id)["name"] == "tick"  # untouched
    assert conn.execute("SELECT count(*) FROM runs_daily").fetchone()[0] == 0


def test_update__new_schedule__moves_timer_bumps_version_and_never_back_fires(
    database_url, conn, jobs, topics, tenant
):
    job = jobs.create(conn, tenant, body(every_ms=10 * MIN), T0)
    # 2.5 minutes later, the new schedule's instants at 1 and 2 minutes are past:
    # after the job's last instant, but from before the change.
    now = T0 + 150_000
    new_schedule = {"cron": "* * * * *", "timezone": "UTC"}
    updated = jobs.update(conn, tenant, job["job_id"], {"schedule": new_schedule}, now)
    assert updated["version"] == 2
    assert updated["schedule"]["cron"] == "* * * * *"
    assert updated["next_fire_at"] == iso(T0 + 3 * MIN)
    assert timer_due(conn, job["job_id"]) == T0 + 3 * MIN
    report = fire_at(database_url, topics, conn, T0 + 3 * MIN)
    assert run_instants(conn, job["job_id"]) == [T0 + 3 * MIN]
    assert report.missed == 0
    assert jobs.get(conn, tenant["tenant_id"], job["job_id"])["missed_count"] == 0


def test_update__name_only__keeps_the_timer_and_bumps_version(conn, jobs, tenant):
    job = jobs.create(conn, tenant, body(every_ms=MIN, jitter_ms=5000), T0)
    updated = jobs.update(conn, tenant, job["job_id"], {"name": "renamed"}, T0 + 10_000)
    assert (updated["name"], updated["version"]) == ("renamed", 2)
    assert updated["next_fire_at"] == job["next_fire_at"]
    assert updated["schedule"] == job["schedule"]


def test_pause_then_resume__timer_removed_then_restored_and_missed_instants_catch_up(
    database_url, conn, jobs, topics, tenant
):
    job = jobs.create(conn, tenant, body(every_ms=MIN), T0)
    paused = jobs.pause(conn, tenant, job["job_id"], T0 + 1000)
    assert paused["paused"] is True and paused["next_fire_at"] is None
    assert timer_due(conn, job["job_id"]) is None
    assert paused["version"] == 2
    resumed = jobs.resume(conn, tenant, job["job_id"], T0 + 200_000)
    assert resumed["paused"] is False
    # The timer is back at the first instant not yet handled, so the paused
    # instants (1, 2, 3 minutes) go through the catch-up window like downtime.
    assert timer_due(conn, job["job_id"]) == T0 + MIN
    assert resumed["next_fire_at"] == iso(T0 + MIN)
    fire_at(database_url, topics, conn, T0 + 200_000)
    assert run_instants(conn, job["job_id"]) == [T0 + MIN, T0 + 2 * MIN, T0 + 3 * MIN]


def _outbox(conn, topic: str) -> list[tuple[bytes, str, dict]]:
    rows = conn.execute(
        "SELECT key, value FROM outbox WHERE topic = %s ORDER BY id", [topic]
    ).fetchall()
    return [(bytes(k), *default_registry().decode(bytes(v))) for k, v in rows]


def test_trigger__creates_a_run_and_its_outbox_row__once_per_instant(conn, jobs, topics, tenant):
    job = jobs.create(conn, tenant, body(), T0)
    now = T0 + 12_345
    out = jobs.trigger(conn, tenant, job["job_id"], now)
    assert out == {"run_id": run_id_for_trigger(job["job_id"], now), "created": True}
    state = conn.execute(
        "SELECT state, scheduled_at FROM runs_daily WHERE run_id = %s", [out["run_id"]]
    ).fetchone()
    assert state[0] == "PENDING" and to_ms(state[1]) == now
    records = _outbox(conn, topics.runs(tenant["tenant_id"]))
    assert len(records) == 1
    key, name, datum = records[0]
    assert (key, name) == (out["run_id"].encode(), "RunReady")
    assert (datum["run_id"], datum["job_id"], datum["payload"]) == (
        out["run_id"],
        job["job_id"],
        '{"n":1}',
    )
    again = jobs.trigger(conn, tenant, job["job_id"], now)
    assert again["created"] is False
    assert len(_outbox(conn, topics.runs(tenant["tenant_id"]))) == 1


def test_backfill__range__runs_with_scheduled_ids_and_a_second_backfill_creates_nothing(
    conn, jobs, topics, tenant
):
    job = jobs.create(conn, tenant, body(every_ms=MIN), T0)
    job_id = job["job_id"]
    now = T0 + 10 * MIN
    first = jobs.backfill(conn, tenant, job_id, T0, T0 + 5 * MIN, now)
    assert first == {"instants": 5, "created": 5, "already_existed": 0}
    expected = {run_id_for_instant(job_id, T0 + k * MIN) for k in range(1, 6)}
    ids = {r[0] for r in conn.execute("SELECT run_id FROM runs_daily WHERE job_id = %s", [job_id])}
    assert ids == expected
    # Overlapping range: only the new instants (6 and 7 minutes) are created.
    second = jobs.backfill(conn, tenant, job_id, T0 + 3 * MIN, T0 + 7 * MIN, now)
    assert second == {"instants": 5, "created": 2, "already_existed": 3}
    third = jobs.backfill(conn, tenant, job_id, T0, T0 + 7 * MIN, now)
    assert third == {"instants": 7, "created": 0, "already_existed": 7}
    assert len(_outbox(conn, topics.runs(tenant["tenant_id"]))) == 7


def test_backfill__bad_range__validation_error_on_to(conn, jobs, tenant):
    job_id = jobs.create(conn, tenant, body(), T0)["job_id"]
    for start, end in ((T0 + MIN, T0), (T0, T0 + 2 * MIN)):
        with pytest.raises(ValidationError) as err:
            jobs.backfill(conn, tenant, job_id, start, end, T0 + MIN)
        assert err.value.field == "to"


def test_delete__timer_gone_job_hidden_pending_runs_cancelled_with_run_completed(
    conn, jobs, topics, tenant
):
    job = jobs.create(conn, tenant, body(every_ms=MIN), T0)
    job_id = job["job_id"]
    jobs.backfill(conn, tenant, job_id, T0, T0 + 2 * MIN, T0 + 3 * MIN)
    done, pending = run_id_for_instant(job_id, T0 + MIN), run_id_for_instant(job_id, T0 + 2 * MIN)
    conn.execute(
        "UPDATE runs_daily SET state = 'SUCCEEDED', finished_at = now() WHERE run_id = %s", [done]
    )
    now = T0 + 4 * MIN
    jobs.delete(conn, tenant, job_id, now)

    assert timer_due(conn, job_id) is None
    with pytest.raises(NotFound):
        jobs.get(conn, tenant["tenant_id"], job_id)
    assert jobs.list(conn, tenant["tenant_id"])["items"] == []
    states = dict(conn.execute("SELECT run_id, state FROM runs_daily WHERE job_id = %s", [job_id]))
    assert states == {done: "SUCCEEDED", pending: "CANCELLED"}
    records = _outbox(conn, topics.run_completed)
    assert len(records) == 1
    key, name, datum = records[0]
    assert (key, name) == (pending.encode(), "RunCompleted")
    assert (datum["state"], datum["job_id"], datum["error"]) == ("CANCELLED", job_id, "job deleted")
    assert datum["finished_at"] == now


def test_delete__runs_on_a_later_attempt__announced_with_their_own_attempt(
    database_url, conn, jobs, topics, tenant
):
    """A run retried to attempt 2 (PENDING) and one whose second attempt failed
    (RETRY_WAIT at 2) are announced CANCELLED at attempt 2, the attempt the run
    is at, not 1."""
    yearly = body(cron="0 0 1 1 *", timezone="UTC")
    job = jobs.create(
        conn, tenant, {**yearly, "retry": {"max_attempts": 3, "initial_backoff_ms": 1000}}, T0
    )
    job_id = job["job_id"]
    lifecycle = Lifecycle(topics)
    pending = jobs.trigger(conn, tenant, job_id, T0 + 1)["run_id"]
    waiting = jobs.trigger(conn, tenant, job_id, T0 + 2)["run_id"]
    now = T0 + 10

    def fail_then_retry(run_id: str, now: int) -> int:
        """Start the run's attempt, fail it retryably, fire its retry; the time after."""
        started = lifecycle.start(conn, tenant["tenant_id"], run_id, "w1", now)
        lifecycle.complete(
            conn, tenant["tenant_id"], run_id, started["attempt"], started["start_token"],
            "FAILED", now, error="boom",
        )  # fmt: skip
        now += 2 * MIN  # past any backoff of 1-2 s
        fire_at(database_url, topics, conn, now)
        return now

    now = fail_then_retry(pending, now)
    now = fail_then_retry(waiting, now)
    started = lifecycle.start(conn, tenant["tenant_id"], waiting, "w1", now)
    lifecycle.complete(
        conn, tenant["tenant_id"], waiting, started["attempt"], started["start_token"],
        "FAILED", now, error="boom",
    )  # fmt: skip
    states = {
        run_id: (state, attempt)
        for run_id, state, attempt in conn.execute(
            "SELECT run_id, state, attempt FROM runs_daily WHERE job_id = %s", [job_id]
        )
    }
    assert states == {pending: ("PENDING", 2), waiting: ("RETRY_WAIT", 2)}
    conn.execute("DELETE FROM outbox")

    jobs.delete(conn, tenant, job_id, now + 1)

    announced = {
        datum["run_id"]: (datum["state"], datum["attempt"])
        for _key, _name, datum in _outbox(conn, topics.run_completed)
    }
    assert announced == {pending: ("CANCELLED", 2), waiting: ("CANCELLED", 2)}
