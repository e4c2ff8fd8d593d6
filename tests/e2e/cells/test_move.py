"""Moving a tenant between two real cells (issue 24; docs/cells.md "Moving a
tenant"): each cell its own PostgreSQL and Kafka with its services, the
router on the public address running the moves (the package's stack,
conftest.py).

The protocol's steps one by one (a mover that dies after the copy, a
rollback) are proved in-process by tests/integration/test_tenant_move.py.
"""

from __future__ import annotations

import os
import signal
import uuid

import httpx
import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from cronwheel.moves import Mover
from cronwheel.store import directory as dirstore
from tests.support.cell_runs import RunsSeen, assert_each_instant_once, runs_of
from tests.support.cells import OPERATOR_KEY, ROUTER, ready, tenant_rows
from tests.support.wait import wait_for

pytestmark = pytest.mark.e2e

OPERATOR = {"Authorization": f"Bearer {OPERATOR_KEY}"}


def _as(key: str) -> dict:
    return {"Authorization": f"Bearer {key}"}


def _tenant(cell: str) -> dict:
    body = {"name": f"mover-{uuid.uuid4().hex[:6]}", "cell": cell}
    answer = httpx.post(f"{ROUTER}/v1/tenants", json=body, headers=OPERATOR, timeout=30)
    assert answer.status_code == 201, answer.text
    return answer.json()


def _two_steps(key: dict, queue: str, schedule: dict | None = None) -> str:
    """A workflow `extract` -> `load`, both on `queue`: its id."""
    step = {"target": {"type": "queue", "queue": queue}}
    dag = {
        "name": "two-steps",
        "nodes": [{"name": "extract", **step}, {"name": "load", **step, "depends_on": ["extract"]}],
        **({"schedule": schedule} if schedule else {}),
    }
    made = httpx.post(f"{ROUTER}/v1/workflows", json=dag, headers=key, timeout=30)
    assert made.status_code == 201, made.text
    return made.json()["workflow_id"]


def _rows(url: str, tenant_id: str) -> dict[str, int]:
    return tenant_rows(url, tenant_id, ("tenants", "api_keys", "jobs", "runs_daily", "timers"))


def test_move__refused__same_cell_422__unknown_tenant_404(cells):
    tenant = _tenant("us")
    same = httpx.post(
        f"{ROUTER}/v1/tenants/{tenant['tenant_id']}/move", json={"cell": "us"}, headers=OPERATOR
    )
    assert same.status_code == 422, same.text
    assert same.json()["field"] == "cell"
    unknown = httpx.post(
        f"{ROUTER}/v1/tenants/t_nobody/move", json={"cell": "eu"}, headers=OPERATOR
    )
    assert unknown.status_code == 404, unknown.text
    none_yet = httpx.get(f"{ROUTER}/v1/tenants/{tenant['tenant_id']}/move", headers=OPERATOR)
    assert none_yet.status_code == 404
    as_tenant = httpx.post(
        f"{ROUTER}/v1/tenants/{tenant['tenant_id']}/move",
        json={"cell": "eu"},
        headers=_as(tenant["api_key"]),
    )
    assert as_tenant.status_code in (401, 403)


def test_move__us_to_eu_while_a_500ms_job_fires__each_instant_once__rows_in_eu_only(cells):
    us, eu = cells.cell("us")["admin_database_url"], cells.cell("eu")["admin_database_url"]
    tenant = _tenant("us")
    tid, key = tenant["tenant_id"], _as(tenant["api_key"])
    body = {
        "name": "tick",
        "schedule": {"every_ms": 500},
        "target": {"type": "queue", "queue": "billing"},
    }
    made = httpx.post(f"{ROUTER}/v1/jobs", json=body, headers=key, timeout=30)
    assert made.status_code == 201, made.text
    job_id = made.json()["job_id"]

    # What each cell held at any time (the source's rows go at the cleanup).
    with RunsSeen({"us": us, "eu": eu}, job_id) as watch:
        seen = watch.seen
        wait_for(lambda: len(seen["us"]) >= 4, 30, what="the job to fire in us")
        started = httpx.post(
            f"{ROUTER}/v1/tenants/{tid}/move", json={"cell": "eu"}, headers=OPERATOR, timeout=30
        )
        assert started.status_code == 202, started.text
        assert started.json()["state"] == "copying"

        def finished() -> dict | None:
            got = httpx.get(f"{ROUTER}/v1/tenants/{tid}/move", headers=OPERATOR, timeout=10)
            assert got.status_code == 200, got.text
            doc = got.json()
            return doc if doc["state"] in ("done", "failed", "rolled_back") else None

        move = wait_for(finished, 120, 0.2, "the move to end")
        assert move["state"] == "done", move
        assert move["frozen_ms"] is not None and move["finished_at"]
        after = len(seen["eu"])
        wait_for(lambda: len(seen["eu"]) >= after + 4, 30, what="the job to fire on in eu")

    assert_each_instant_once({**seen["us"], **runs_of(eu, job_id)}, 500)
    assert set(seen["us"]) <= set(runs_of(eu, job_id)), "a run of the source was not copied"

    assert set(_rows(us, tid).values()) == {0}
    in_eu = _rows(eu, tid)
    assert in_eu["tenants"] == in_eu["jobs"] == 1 and in_eu["api_keys"] >= 1
    # The key works through the router, now served by eu.
    got = wait_for(
        lambda: (
            (r := httpx.get(f"{ROUTER}/v1/tenant", headers=key, timeout=10)).status_code == 200
            and r
        ),
        30,
        0.2,
        "the key to work through the router",
    )
    assert got.json()["cell"] == "eu"
    job = httpx.get(f"{ROUTER}/v1/jobs/{job_id}", headers=key, timeout=10)
    assert job.status_code == 200, job.text


def test_move__mover_stops_after_the_copy__a_new_mover_resumes_and_finishes(cells):
    """The mover is killed after the copy (it stops calling `advance`); a new
    one, knowing only the move's id, finishes it."""
    dsns = {c: cells.cell(c)["admin_database_url"] for c in ("us", "eu")}
    tenant = _tenant("us")
    tid, key = tenant["tenant_id"], _as(tenant["api_key"])
    body = {
        "name": "daily",
        "schedule": {"cron": "0 3 * * *"},
        "target": {"type": "queue", "queue": "q"},
    }
    assert httpx.post(f"{ROUTER}/v1/jobs", json=body, headers=key, timeout=30).status_code == 201
    first = Mover(cells.status["directory_url"], dsns)
    move = first.start(tid, "eu")
    assert first.advance(move.move_id).state == "freezing"  # copied; this mover is gone
    assert _rows(dsns["eu"], tid)["jobs"] == 1
    got = httpx.get(f"{ROUTER}/v1/tenants/{tid}/move", headers=OPERATOR, timeout=10).json()
    assert got["state"] == "freezing" and got["finished_at"] is None

    done = Mover(cells.status["directory_url"], dsns).run(move.move_id)
    assert done.state == "done", done.error
    assert set(_rows(dsns["us"], tid).values()) == {0}
    assert _rows(dsns["eu"], tid)["jobs"] == 1
    wait_for(
        lambda: (
            httpx.get(f"{ROUTER}/v1/tenant", headers=key, timeout=10).json().get("cell") == "eu"
        ),
        30,
        0.2,
        "the key to reach eu through the router",
    )


def test_frozen_tenant__writes_get_503_with_retry_after__reads_go_on(cells):
    tenant = _tenant("eu")
    tid, key = tenant["tenant_id"], _as(tenant["api_key"])

    def body() -> dict:  # a name of its own each time (names are unique per tenant)
        return {
            "name": f"w-{uuid.uuid4().hex[:8]}",
            "schedule": {"cron": "0 3 * * *"},
            "target": {"type": "queue", "queue": "q"},
        }

    with psycopg.connect(cells.status["directory_url"], autocommit=True) as d:
        placed = dirstore.placement(d, tid)
        assert dirstore.compare_and_set(d, tid, placed.epoch, "eu", "frozen") is not None
        try:
            refused = wait_for(
                lambda: (
                    (
                        r := httpx.post(f"{ROUTER}/v1/jobs", json=body(), headers=key, timeout=10)
                    ).status_code
                    == 503
                    and r
                ),
                30,
                0.2,
                "a write to be refused while frozen",
            )
            assert refused.headers["retry-after"] == "1"
            assert refused.json()["code"] == "TENANT_MOVING"
            assert httpx.get(f"{ROUTER}/v1/jobs", headers=key, timeout=10).status_code == 200
        finally:
            dirstore.compare_and_set(d, tid, placed.epoch, "eu", "active")
    wait_for(
        lambda: (
            httpx.post(f"{ROUTER}/v1/jobs", json=body(), headers=key, timeout=10).status_code == 201
        ),
        30,
        0.2,
        "writes to go on once active",
    )


def test_move__router_killed__the_next_router_resumes_the_open_move(cells):
    """A move left open by a mover that died (here: copied, then nobody
    advanced it) is finished by the next router to start, after the running
    one is killed with -9. The next router is configured as a deployment's
    is (CRONWHEEL_CELL_DATABASES, CRONWHEEL_CELL_BROKERS; no cells.json read),
    and it carries the tenant's Kafka side: its principal ends in eu alone."""
    dsns = {c: cells.cell(c)["admin_database_url"] for c in ("us", "eu")}
    tenant = _tenant("us")
    tid = tenant["tenant_id"]
    mover = Mover(cells.status["directory_url"], dsns)
    move = mover.start(tid, "eu")
    assert mover.advance(move.move_id).state == "freezing"
    assert cells.kafka_of("us", tid)["credentials"] and not cells.kafka_of("eu", tid)["credentials"]
    cells.restart_router(cells.deployment_router_env())

    def ended() -> dict | None:
        doc = httpx.get(f"{ROUTER}/v1/tenants/{tid}/move", headers=OPERATOR, timeout=10).json()
        return doc if doc["state"] in ("done", "failed", "rolled_back") else None

    assert wait_for(ended, 60, 0.2, "the new router to finish the move")["state"] == "done"
    assert set(_rows(dsns["us"], tid).values()) == {0}
    assert _rows(dsns["eu"], tid)["tenants"] == 1
    assert cells.kafka_of("eu", tid)["credentials"], "the tenant's principal was not carried to eu"
    wait_for(lambda: not cells.kafka_of("us", tid)["credentials"], 60, 0.5, "us's principal to go")


STALE_ROUTER = "127.0.0.1:28081"
STALE_METRICS_PORT = 28070  # the router's metrics at + 7 (cronwheel/metrics.py)


def _retried(metrics_url: str) -> float:
    """cronwheel_router_misdirected_total{outcome="retried"} as the router exposes it."""
    text = httpx.get(metrics_url, timeout=10).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "cronwheel_router_misdirected_total" and (
                sample.labels.get("outcome") == "retried"
            ):
                return sample.value
    raise AssertionError("the router exposes no cronwheel_router_misdirected_total")


def test_move__a_router_still_routing_to_us__sends_the_421_on_to_eu__the_client_sees_none(cells):
    """A second router whose cache keeps a tenant's cell for ten minutes
    routes it to `us` after the move to `eu`; `us`'s gateway answers 421 (the
    proof that the stale route landed) and the router sends the request, its
    body with it, to `eu`: the client gets `eu`'s answer, never the 421."""
    stale = f"http://{STALE_ROUTER}"
    metrics_url = f"http://127.0.0.1:{STALE_METRICS_PORT + 7}/metrics"
    proc = cells.serve(
        "router",
        env={
            "CRONWHEEL_HTTP_ADDR": STALE_ROUTER,
            "CRONWHEEL_DIRECTORY_TTL_MS": "600000",
            "CRONWHEEL_METRICS_PORT": str(STALE_METRICS_PORT),
        },
    )
    try:
        wait_for(lambda: ready(stale), 60, 0.2, "the second router to be ready")
        tenant = _tenant("us")
        tid, key = tenant["tenant_id"], _as(tenant["api_key"])
        before = httpx.get(f"{stale}/v1/tenant", headers=key, timeout=10)
        assert before.status_code == 200 and before.json()["cell"] == "us", before.text
        retried_before = _retried(metrics_url)

        started = httpx.post(
            f"{ROUTER}/v1/tenants/{tid}/move", json={"cell": "eu"}, headers=OPERATOR, timeout=30
        )
        assert started.status_code == 202, started.text
        wait_for(
            lambda: httpx.get(f"{ROUTER}/v1/tenants/{tid}/move", headers=OPERATOR, timeout=10)
            .json()["state"] == "done",
            120, 0.2, "the move to end",
        )  # fmt: skip
        us_gateway = cells.cell("us")["api_url"]
        wait_for(
            lambda: httpx.get(f"{us_gateway}/v1/tenant", headers=key, timeout=10).status_code
            == 421,
            30, 0.2, "us's gateway to refuse the moved tenant with 421",
        )  # fmt: skip

        body = {"name": "after", "schedule": {"cron": "0 4 * * *"},
                "target": {"type": "queue", "queue": "q"}}  # fmt: skip
        made = httpx.post(f"{stale}/v1/jobs", json=body, headers=key, timeout=30)
        assert made.status_code == 201, made.text
        assert _retried(metrics_url) == retried_before + 1, "the router did not meet a 421"
        eu = cells.cell("eu")["admin_database_url"]
        assert tenant_rows(eu, tid, ("jobs",)) == {"jobs": 1}  # the tenant's one job: this one
        after = httpx.get(f"{stale}/v1/tenant", headers=key, timeout=10)
        assert after.status_code == 200 and after.json()["cell"] == "eu", after.text
    finally:
        os.killpg(proc.pid, 9)
        proc.wait(10)


KEEPING_ROUTER = "127.0.0.1:28082"
KEEPING_METRICS_PORT = 28060


def test_move__source_kept_for_the_retention__listed_once__then_swept(cells):
    """CRONWHEEL_MOVE_SOURCE_RETENTION_S: a router that keeps a moved
    tenant's copy in the cell it left (frozen, its principal and topics
    with it) until its sweep finds the retention passed. Meanwhile the
    tenant is listed once, as its home cell has it."""
    keeping = f"http://{KEEPING_ROUTER}"

    def router(retention_s: str):
        proc = cells.serve(
            "router",
            env={
                "CRONWHEEL_HTTP_ADDR": KEEPING_ROUTER,
                "CRONWHEEL_METRICS_PORT": str(KEEPING_METRICS_PORT),
                "CRONWHEEL_MOVE_SOURCE_RETENTION_S": retention_s,
            },
        )
        wait_for(lambda: ready(keeping), 60, 0.2, "the keeping router to be ready")
        return proc

    def move() -> dict:
        return httpx.get(f"{keeping}/v1/tenants/{tid}/move", headers=OPERATOR, timeout=10).json()

    us = cells.cell("us")["admin_database_url"]
    proc = router("3600")
    try:
        tenant = _tenant("us")
        tid = tenant["tenant_id"]
        started = httpx.post(
            f"{keeping}/v1/tenants/{tid}/move", json={"cell": "eu"}, headers=OPERATOR, timeout=30
        )
        assert started.status_code == 202, started.text
        wait_for(lambda: move()["state"] == "done", 120, 0.2, "the move to end")
        assert move()["source_removed_at"] is None
        assert _rows(us, tid)["tenants"] == 1  # kept in us
        assert cells.kafka_of("us", tid)["credentials"], "us's principal kept with the copy"
        listed = []
        cursor = None
        while True:
            params = {"limit": 50, **({"cursor": cursor} if cursor else {})}
            page = httpx.get(f"{ROUTER}/v1/tenants", params=params, headers=OPERATOR).json()
            listed += [t for t in page["items"] if t["tenant_id"] == tid]
            if not (cursor := page["next_cursor"]):
                break
        assert [t["cell"] for t in listed] == ["eu"], listed
        # The tenant's key works through the router: eu serves it.
        got = httpx.get(f"{ROUTER}/v1/tenant", headers=_as(tenant["api_key"]), timeout=10)
        assert got.status_code == 200 and got.json()["cell"] == "eu", got.text
    finally:
        os.killpg(proc.pid, 9)
        proc.wait(10)

    proc = router("1")  # the hour as good as passed: its sweep, each second, removes the copy
    try:
        wait_for(lambda: move()["source_removed_at"], 60, 0.2, "the sweep to remove us's copy")
        assert set(_rows(us, tid).values()) == {0}
        assert not cells.kafka_of("us", tid)["credentials"], "us's principal removed with it"
        assert _rows(cells.cell("eu")["admin_database_url"], tid)["tenants"] == 1
    finally:
        os.killpg(proc.pid, 9)
        proc.wait(10)


def test_move__a_completion_the_source_has_not_applied__applied_before_the_copy__dag_goes_on(
    cells,
):
    """A workflow node's run completed just before the move, its RunCompleted
    not yet applied by the source's workflow service (stopped with SIGSTOP):
    the freeze waits for it (the move stalls once, counted), and once it is
    applied the copy carries the next node's run to eu. Without the wait the
    move ended first, the completion was applied to the source's copy alone
    and the workflow run never went on in eu."""
    eu = cells.cell("eu")["admin_database_url"]
    tenant = _tenant("us")
    tid, key = tenant["tenant_id"], _as(tenant["api_key"])
    workflow_id = _two_steps(key, "etl")
    fired = httpx.post(f"{ROUTER}/v1/workflows/{workflow_id}/trigger", headers=key, timeout=30)
    assert fired.status_code in (200, 201, 202), fired.text
    wfr = fired.json()["workflow_run_id"]

    def node(name: str) -> dict:
        doc = httpx.get(f"{ROUTER}/v1/workflow-runs/{wfr}", headers=key, timeout=10).json()
        return next(n for n in doc["nodes"] if n["name"] == name)

    first = wait_for(lambda: node("extract").get("run_id"), 30, 0.1, "the first node's run")
    started = httpx.post(
        f"{ROUTER}/v1/runs/{first}/start", json={"worker_id": "w1"}, headers=key, timeout=10
    )
    assert started.status_code == 200, started.text
    fence = {"attempt": started.json()["attempt"], "start_token": started.json()["start_token"]}

    workflow = cells.service_pid("us", "workflow")
    router_log = cells.logs / "router.log"
    seen_before = router_log.read_text().count("stalled")
    os.kill(workflow, signal.SIGSTOP)
    try:
        done = httpx.post(
            f"{ROUTER}/v1/runs/{first}/complete",
            json={**fence, "outcome": "SUCCEEDED"}, headers=key, timeout=10,
        )  # fmt: skip
        assert done.status_code == 200, done.text
        moving = httpx.post(
            f"{ROUTER}/v1/tenants/{tid}/move", json={"cell": "eu"}, headers=OPERATOR, timeout=30
        )
        assert moving.status_code == 202, moving.text
        move_id = moving.json()["move_id"]
        # The fault landed: the freeze waited for the stopped workflow service.
        wait_for(
            lambda: f"move {move_id} stalled" in router_log.read_text(),
            60, 0.2, "the move to stall on the unapplied completion",
        )  # fmt: skip
        assert router_log.read_text().count("stalled") > seen_before
        with psycopg.connect(eu, autocommit=True) as conn:
            placed = conn.execute("SELECT state FROM tenants WHERE tenant_id = %s", [tid])
            assert placed.fetchone()[0] == "standby"  # not switched while it waits
    finally:
        os.kill(workflow, signal.SIGCONT)

    def finished() -> dict | None:
        doc = httpx.get(f"{ROUTER}/v1/tenants/{tid}/move", headers=OPERATOR, timeout=10).json()
        return doc if doc["state"] in ("done", "failed", "rolled_back") else None

    move = wait_for(finished, 120, 0.2, "the move to end")
    assert move["state"] == "done", move
    with psycopg.connect(eu, autocommit=True) as conn:
        nodes = dict(conn.execute(
            "SELECT node, run_id FROM runs_daily WHERE workflow_run_id = %s", [wfr]
        ).fetchall())  # fmt: skip
    assert set(nodes) == {"extract", "load"}, nodes  # the next node's run was copied to eu
    second = wait_for(lambda: node("load").get("run_id"), 30, 0.2, "the second node in eu")
    assert second == nodes["load"]
