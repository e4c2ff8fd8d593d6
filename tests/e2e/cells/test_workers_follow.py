"""Workers follow a moved tenant (issue 24, step 5 and 6; docs/cells.md
"Workers follow", docs/workers.md "When the tenant moves"): two real cells,
each its own PostgreSQL and Kafka with its services (conftest.py), the
router running the move; the tenant (a 150 ms every_ms job, a cron job every
2 s, a workflow of two steps every 3 s, all on one queue) is moved while
they fire; its worker is the SDK's, in a thread of this process, with an
effect log that records every execution (duplicates included).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from datetime import datetime

import httpx
import psycopg
import pytest

from cronwheel import principals
from cronwheel.core.clock import to_ms
from cronwheel.sdk import Worker
from tests.e2e.cells.test_move import _as, _tenant, _two_steps
from tests.support.cell_runs import RunsSeen, assert_each_instant_once, runs_of
from tests.support.cells import OPERATOR_KEY, ROUTER
from tests.support.wait import wait_for

pytestmark = pytest.mark.e2e

OPERATOR = {"Authorization": f"Bearer {OPERATOR_KEY}"}
EVERY_MS = 150
CRON, CRON_EVERY_MS = "*/2 * * * * *", 2000
WORKFLOW_CRON, WORKFLOW_EVERY_MS = "*/3 * * * * *", 3000


def _workflow_runs(url: str, workflow_id: str) -> dict[str, tuple[str, int]]:
    """workflow_run_id -> (state, scheduled ms) of the workflow's runs."""
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT workflow_run_id, state, scheduled_at FROM workflow_runs"
            " WHERE workflow_id = %s", [workflow_id],
        ).fetchall()  # fmt: skip
    return {r[0]: (r[1], to_ms(r[2])) for r in rows}


def _steps(url: str, workflow_run_ids: list[str]) -> dict[str, dict[str, str]]:
    """workflow_run_id -> {node: run_id} of the succeeded node runs."""
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT workflow_run_id, node, run_id FROM runs_daily"
            " WHERE workflow_run_id = ANY(%s) AND state = 'SUCCEEDED'", [workflow_run_ids],
        ).fetchall()  # fmt: skip
    out: dict[str, dict[str, str]] = {}
    for wfr, node, run_id in rows:
        out.setdefault(wfr, {})[node] = run_id
    return out


def _states(url: str, job_id: str) -> dict[str, str]:
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute("SELECT run_id, state FROM runs_daily WHERE job_id = %s", [job_id])
        return {r[0]: r[1] for r in rows.fetchall()}


def test_move__a_worker_follows_to_eu__each_instant_one_run__each_run_once__us_left_clean(cells):
    us_db, eu_db = cells.cell("us")["admin_database_url"], cells.cell("eu")["admin_database_url"]
    tenant = _tenant("us")
    tid, key, kafka = tenant["tenant_id"], _as(tenant["api_key"]), tenant["kafka"]
    body = {
        "name": "tick",
        "schedule": {"every_ms": EVERY_MS},
        "target": {"type": "queue", "queue": "work"},
    }
    made = httpx.post(f"{ROUTER}/v1/jobs", json=body, headers=key, timeout=30)
    assert made.status_code == 201, made.text
    job_id, topic = made.json()["job_id"], made.json()["topic"]
    assert made.json()["kafka_bootstrap"] == cells.cell("us")["kafka_bootstrap"]
    # Beside it, on the same queue: a cron job, and a workflow of two steps on
    # a cron schedule, whose runs are under way when the move comes.
    cron = {**body, "name": "every-2s", "schedule": {"cron": CRON, "timezone": "UTC"}}
    made = httpx.post(f"{ROUTER}/v1/jobs", json=cron, headers=key, timeout=30)
    assert made.status_code == 201, made.text
    cron_id = made.json()["job_id"]
    workflow_id = _two_steps(key, "work", {"cron": WORKFLOW_CRON, "timezone": "UTC"})

    effects: list[str] = []  # every execution, duplicates included
    lock = threading.Lock()

    def handle(run) -> dict:
        with lock:
            effects.append(run.run_id)
        return {"ok": True}

    # As a tenant's worker is configured: the router's address, its key, and
    # the credentials and broker POST /v1/tenants gave.
    worker = Worker(
        topic, handle, api_url=ROUTER, api_key=tenant["api_key"],
        bootstrap=kafka["bootstrap"], kafka_username=kafka["username"],
        kafka_password=kafka["password"], concurrency=4, follow_every_s=0.5,
    )  # fmt: skip
    # What each cell held at any time (the source's rows go at the cleanup).
    running = threading.Thread(target=worker.run, daemon=True, name="sdk-worker")
    urls = {"us": us_db, "eu": eu_db}
    with RunsSeen(urls, job_id) as watch, RunsSeen(urls, cron_id) as cron_watch:
        running.start()
        try:
            wait_for(lambda: len(effects) >= 10, 60, what="the worker to run the job in us")
            wait_for(lambda: len(runs_of(us_db, cron_id)) >= 2, 30, what="the cron job in us")
            wait_for(lambda: _workflow_runs(us_db, workflow_id), 30, what="the workflow in us")
            assert worker.cell == "us"
            assert cells.kafka_of("eu", tid)["topics"] == []  # nothing of it in eu before

            started = httpx.post(
                f"{ROUTER}/v1/tenants/{tid}/move", json={"cell": "eu"}, headers=OPERATOR, timeout=30
            )
            assert started.status_code == 202, started.text

            def ended() -> dict | None:
                got = httpx.get(f"{ROUTER}/v1/tenants/{tid}/move", headers=OPERATOR, timeout=10)
                doc = got.json()
                return doc if doc["state"] in ("done", "failed", "rolled_back") else None

            move = wait_for(ended, 180, 0.2, "the move to end")
            assert move["state"] == "done", move
            done_at = time.monotonic()
            wait_for(lambda: worker.cell == "eu", 60, what="the worker to consume in eu")
            print(
                f"move {move['started_at']} -> {move['finished_at']}, frozen {move['frozen_ms']} ms;"
                f" the worker on eu's broker {time.monotonic() - done_at:.1f} s after `done` was seen"
            )
            assert worker.bootstrap == cells.cell("eu")["kafka_bootstrap"]
            # Runs fired in eu reach the worker through eu's broker.
            after = len(effects)
            wait_for(lambda: len(effects) >= after + 10, 60, what="the worker to run on from eu")
            # The cron job and the workflow fire on in eu: two instants each.
            moved = to_ms(datetime.fromisoformat(move["finished_at"]))

            def fired_in_eu(instants) -> bool:
                return sum(at > moved for at in instants) >= 2

            wait_for(
                lambda: fired_in_eu(at for at, _ in runs_of(eu_db, cron_id).values()),
                30, what="the cron job to fire on in eu",
            )  # fmt: skip
            wait_for(
                lambda: fired_in_eu(at for _, at in _workflow_runs(eu_db, workflow_id).values()),
                30, what="the workflow to fire on in eu",
            )  # fmt: skip

            for path in (f"jobs/{job_id}", f"jobs/{cron_id}", f"workflows/{workflow_id}"):
                paused = httpx.post(f"{ROUTER}/v1/{path}/pause", headers=key, timeout=30)
                assert paused.status_code == 200, paused.text

            def all_terminal() -> dict | None:
                states = {**_states(eu_db, job_id), **_states(eu_db, cron_id)}
                flows = _workflow_runs(eu_db, workflow_id)
                done = set(states.values()) == {"SUCCEEDED"} and flows
                return states if done and {s for s, _ in flows.values()} == {"SUCCEEDED"} else None

            states = wait_for(all_terminal, 90, 0.2, "every run and workflow run to succeed")
        finally:
            worker.stop()
            running.join(60)
    assert not running.is_alive()

    # Every instant exactly one run across both cells, none missing: the
    # every_ms job's, the cron job's, the workflow's (one workflow run each).
    runs = {**watch.seen["us"], **runs_of(eu_db, job_id)}
    assert_each_instant_once(runs, EVERY_MS)
    cron_runs = {**cron_watch.seen["us"], **runs_of(eu_db, cron_id)}
    assert len(cron_runs) >= 4, cron_runs  # two fired in us, two in eu at least
    assert_each_instant_once(cron_runs, CRON_EVERY_MS)
    flows = _workflow_runs(eu_db, workflow_id)
    assert len(flows) >= 3, flows
    assert_each_instant_once({w: (at, 0) for w, (_, at) in flows.items()}, WORKFLOW_EVERY_MS)
    # Each workflow run ran both steps, in order, once each.
    steps = _steps(eu_db, list(flows))
    assert {len(nodes) for nodes in steps.values()} == {2}, steps
    step_runs = {run_id for nodes in steps.values() for run_id in nodes.values()}
    # Every run terminal (in eu, which holds them all now), and the worker ran
    # each once: none lost on the way from us's broker to eu's, none twice.
    assert set(states) == set(runs) | set(cron_runs)
    ran = Counter(effects)
    assert [r for r, n in ran.items() if n > 1] == [], "a run was executed twice"
    assert set(ran) == set(runs) | set(cron_runs) | step_runs, "a run was never executed"
    assert _states(us_db, job_id) == {} and _states(us_db, cron_id) == {}

    # Nothing of the tenant left on us's broker; its topic and principal in eu.
    def us_clean() -> dict | None:
        left = cells.kafka_of("us", tid)
        return left if left == {"topics": [], "credentials": [], "acls": 0} else None

    wait_for(us_clean, 30, 0.5, "the tenant's topics and principal to leave us")
    in_eu = cells.kafka_of("eu", tid)
    assert topic in in_eu["topics"]
    assert in_eu["credentials"] == [principals.tenant_username(tid)] and in_eu["acls"] > 0
