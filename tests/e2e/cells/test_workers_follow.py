"""Workers follow a moved tenant (issue 24, step 5 and 6; docs/cells.md
"Workers follow", docs/workers.md "When the tenant moves"): two real cells,
each its own PostgreSQL and Kafka with its services (conftest.py), the
router running the move; the tenant's worker is the SDK's, in a thread of
this process, with an effect log that records every execution (duplicates
included).
"""

from __future__ import annotations

import threading
import time
from collections import Counter

import httpx
import psycopg
import pytest

from cronwheel import principals
from cronwheel.sdk import Worker
from tests.e2e.cells.test_move import _as, _tenant
from tests.support.cell_runs import RunsSeen, assert_each_instant_once, runs_of
from tests.support.cells import OPERATOR_KEY, ROUTER
from tests.support.wait import wait_for

pytestmark = pytest.mark.e2e

OPERATOR = {"Authorization": f"Bearer {OPERATOR_KEY}"}
EVERY_MS = 150


def _states(url: str, job_id: str) -> dict[str, str]:
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute("SELECT run_id, state FROM runs WHERE job_id = %s", [job_id])
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
    with RunsSeen({"us": us_db, "eu": eu_db}, job_id) as watch:
        running.start()
        try:
            wait_for(lambda: len(effects) >= 10, 60, what="the worker to run the job in us")
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

            paused = httpx.post(f"{ROUTER}/v1/jobs/{job_id}/pause", headers=key, timeout=30)
            assert paused.status_code == 200, paused.text

            def all_terminal() -> dict | None:
                states = _states(eu_db, job_id)
                return states if set(states.values()) == {"SUCCEEDED"} else None

            states = wait_for(all_terminal, 90, 0.2, "every run of the job to succeed")
        finally:
            worker.stop()
            running.join(60)
    assert not running.is_alive()

    # Every instant exactly one run across both cells, none missing.
    runs = {**watch.seen["us"], **runs_of(eu_db, job_id)}
    assert_each_instant_once(runs, EVERY_MS)
    # Every run terminal (in eu, which holds them all now), and the worker ran
    # each once: none lost on the way from us's broker to eu's, none twice.
    assert set(states) == set(runs)
    ran = Counter(effects)
    assert [r for r, n in ran.items() if n > 1] == [], "a run was executed twice"
    assert set(ran) == set(runs), "a run was never executed"
    assert _states(us_db, job_id) == {}

    # Nothing of the tenant left on us's broker; its topic and principal in eu.
    def us_clean() -> dict | None:
        left = cells.kafka_of("us", tid)
        return left if left == {"topics": [], "credentials": [], "acls": 0} else None

    wait_for(us_clean, 30, 0.5, "the tenant's topics and principal to leave us")
    in_eu = cells.kafka_of("eu", tid)
    assert topic in in_eu["topics"]
    assert in_eu["credentials"] == [principals.tenant_username(tid)] and in_eu["acls"] > 0
