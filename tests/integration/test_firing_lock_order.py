"""What the firing loop holds while an API call or a worker changes the same
thing: neither waits for the other in the opposite order (a deadlock, which
PostgreSQL breaks by failing one side: a 503 to the caller).

A CompleteRun that lands while the firing loop holds the run's lease timer:
the firing loop claims due timers (FOR UPDATE SKIP LOCKED) and then locks
their runs (runs_to_end); a CompleteRun locks the run and then deletes its
lease and timeout timers. Were the completion to wait for the claimed timer,
each would wait for the other: PostgreSQL breaks the deadlock after
deadlock_timeout by failing one of them, and a failed completion is a 503 to
the worker (seen in CI: test_contract_worker, lease 1 s, heartbeats). The
completion leaves a claimed timer to its claimer, which drops it."""

from __future__ import annotations

import threading

import psycopg
import pytest

from cronwheel.kafka import Topics
from cronwheel.store.jobs import Jobs, create_tenant
from cronwheel.store.lifecycle import Lifecycle
from cronwheel.store.timers import FireReport, Timer
from cronwheel.store.workflows import Workflows
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration

T0 = 1_900_000_000_000
PAUSER = "test-pauser"
CLAIM = """SELECT partition_id, timer_id, kind, owner_id, attempt, tenant_id, priority
             FROM timers WHERE owner_id = %s AND kind = %s FOR UPDATE"""


@pytest.fixture
def conn(database_url):
    with psycopg.connect(database_url, autocommit=True) as c:
        yield c


def _running(conn, topic_prefix: str) -> tuple[Lifecycle, str, str, dict]:
    """A RUNNING run with a lease and a timeout timer: (lifecycle, tenant,
    run id, its start)."""
    topics = Topics(topic_prefix)
    tenant = create_tenant(conn, "racer")
    job = Jobs(topics).create(
        conn,
        tenant,
        {"name": "work", "schedule": {"cron": "0 0 1 1 *", "timezone": "UTC"},
         "target": {"type": "queue", "queue": "q"}, "lease_ms": 1000, "timeout_ms": 60_000},
        T0,
    )  # fmt: skip
    run_id = Jobs(topics).trigger(conn, tenant, job["job_id"], T0)["run_id"]
    life = Lifecycle(topics)
    started = life.start(conn, tenant["tenant_id"], run_id, "w1", T0 + 10)
    kinds = conn.execute("SELECT kind FROM timers WHERE owner_id = %s ORDER BY kind", [run_id])
    assert [k for (k,) in kinds] == ["lease", "timeout"]
    return life, tenant["tenant_id"], run_id, started


def _complete_in_thread(life, database_url, tenant_id, run_id, started) -> dict:
    answer: dict = {}

    def complete() -> None:
        with psycopg.connect(database_url, autocommit=True) as c:
            try:
                answer["ok"] = life.complete(
                    c, tenant_id, run_id, 1, started["start_token"], "SUCCEEDED", T0 + 2000
                )
            except Exception as e:  # noqa: BLE001 - what the worker would be answered
                answer["error"] = e

    threading.Thread(target=complete, daemon=True).start()
    return answer


def test_complete__firing_loop_holds_the_lease_timer__answered_at_once__timer_dropped_by_it(
    conn, database_url, topic_prefix
):
    life, tenant_id, run_id, started = _running(conn, topic_prefix)
    with psycopg.connect(database_url) as firing:  # one transaction, as the firing loop's
        claimed = firing.execute(CLAIM, [run_id, "lease"]).fetchone()
        assert claimed is not None

        # Answered while the claim is held: the completion does not wait for it.
        answer = _complete_in_thread(life, database_url, tenant_id, run_id, started)
        wait_for(lambda: answer, 10, 0.02, "the completion to be answered")
        assert answer == {"ok": {"state": "SUCCEEDED", "attempt": 1}}, answer
        left = conn.execute("SELECT kind FROM timers WHERE owner_id = %s", [run_id]).fetchall()
        assert left == [("lease",)], "the free timeout timer went; the claimed lease stays"

        # The firing loop goes on as it would: the run has ended, so the timer goes.
        p, timer_id, kind, owner_id, attempt, tenant, priority = claimed
        timer = Timer(p, timer_id, kind, owner_id, T0 + 1010, attempt, tenant, priority)
        assert life.on_expiry(firing, [timer], T0 + 2100, FireReport()) == []
        firing.commit()

    assert (
        conn.execute("SELECT count(*) FROM timers WHERE owner_id = %s", [run_id]).fetchone()[0] == 0
    )
    state = conn.execute(
        "SELECT state, attempt FROM runs_daily WHERE run_id = %s", [run_id]
    ).fetchone()
    assert state == ("SUCCEEDED", 1)
    ended = conn.execute(
        "SELECT outcome FROM run_attempts_daily WHERE run_id = %s ORDER BY attempt", [run_id]
    ).fetchall()
    assert ended == [("SUCCEEDED",)]


def test_complete__a_claim_that_rolled_back__leaves_a_timer_that_fires_and_is_dropped(
    conn, database_url, topic_prefix
):
    """The claimer died after the completion skipped its timer: the timer is
    still there, fires, and ends nothing (the attempt it names is over)."""
    life, tenant_id, run_id, started = _running(conn, topic_prefix)
    with psycopg.connect(database_url) as firing:
        claimed = firing.execute(CLAIM, [run_id, "lease"]).fetchone()
        answer = _complete_in_thread(life, database_url, tenant_id, run_id, started)
        wait_for(lambda: answer, 10, 0.02, "the completion to be answered")
        firing.rollback()  # the claim is gone, its timer kept
    assert "ok" in answer, answer

    p, timer_id, kind, owner_id, attempt, tenant, priority = claimed
    with psycopg.connect(database_url) as later:
        relocked = later.execute(CLAIM, [run_id, "lease"]).fetchone()
        assert relocked == claimed
        timer = Timer(p, timer_id, kind, owner_id, T0 + 1010, attempt, tenant, priority)
        life.on_expiry(later, [timer], T0 + 5000, FireReport())
        later.commit()
    assert (
        conn.execute("SELECT count(*) FROM timers WHERE owner_id = %s", [run_id]).fetchone()[0] == 0
    )
    assert conn.execute("SELECT state FROM runs_daily WHERE run_id = %s", [run_id]).fetchone() == (
        "SUCCEEDED",
    )


def test_workflow_pause__firing_loop_holds_its_timer__waits_for_it__no_deadlock(
    conn, database_url, topic_prefix
):
    """A pause takes the workflow's timer before its row, as the firing loop
    does (claim the timer, then advance the workflow): while the loop holds
    the timer the pause waits, the loop locks the row and commits, and the
    pause then goes through. In the other order each waited for the other."""
    topics = Topics(topic_prefix)
    tenant = create_tenant(conn, "pauser")
    flows = Workflows(topics)
    node = {"name": "a", "target": {"type": "queue", "queue": "q"}, "depends_on": []}
    wf = flows.create(
        conn, tenant, {"name": "wf", "nodes": [node], "schedule": {"every_ms": 60_000}}, T0
    )
    wf_id = wf["workflow_id"]
    answer: dict = {}
    with psycopg.connect(database_url) as firing:
        claimed = firing.execute(
            "SELECT partition_id FROM timers WHERE timer_id = %s FOR UPDATE", [f"workflow:{wf_id}"]
        ).fetchone()
        assert claimed is not None

        def pause() -> None:
            with psycopg.connect(database_url, autocommit=True, application_name=PAUSER) as c:
                try:
                    answer["ok"] = flows.pause(c, tenant, wf_id, T0 + 1000)
                except Exception as e:  # noqa: BLE001 - what the caller would be answered
                    answer["error"] = e

        threading.Thread(target=pause, daemon=True).start()
        # The pause waits on a lock the firing loop holds (the timer).
        wait_for(
            lambda: conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                " AND application_name = %s",
                [PAUSER],
            ).fetchone()[0],
            10,
            0.02,
            "the pause to wait for the firing loop",
        )
        # The firing loop advances the workflow (advance_workflow locks its row):
        # a pause holding that row while it waited would deadlock here.
        firing.execute(
            "UPDATE workflows SET updated_at = updated_at WHERE partition_id = %s"
            " AND workflow_id = %s",
            [claimed[0], wf_id],
        )
        firing.commit()
    wait_for(lambda: answer, 10, 0.02, "the pause to be answered")
    assert "ok" in answer, answer
    assert answer["ok"]["paused"] is True
    timer = conn.execute("SELECT count(*) FROM timers WHERE timer_id = %s", [f"workflow:{wf_id}"])
    assert timer.fetchone()[0] == 0
