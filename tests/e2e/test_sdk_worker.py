"""The Python SDK against the platform running as processes: outcomes, retries,
SIGTERM drain, and kill -9 of the dispatcher and the worker during a stream."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import time
import uuid

import httpx
import psycopg
import pytest

from tests.support.kafka import worker_env
from tests.support.procs import PYTHON, ROOT, launcher
from tests.support.wait import wait_for

pytestmark = pytest.mark.e2e

OPERATOR_KEY = "cwop_test_" + uuid.uuid4().hex
TERMINAL = ("SUCCEEDED", "FAILED", "TIMED_OUT", "CANCELLED", "SKIPPED")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def platform(database_url, kafka_bootstrap, topic_prefix):
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE sdk_effects (run_id text PRIMARY KEY)")
        conn.execute(
            "CREATE TABLE sdk_executions (run_id text, attempt int, at timestamptz DEFAULT now())"
        )
    port = _free_port()
    env = {"CRONWHEEL_HTTP_ADDR": f"127.0.0.1:{port}", "CRONWHEEL_OPERATOR_KEY": OPERATOR_KEY}
    with launcher(database_url, kafka_bootstrap, topic_prefix, lease_ttl_ms=3000) as launch:
        for name in ("gateway", "timer", "relay", "dispatcher"):
            launch.start(name, **env)
        base = f"http://127.0.0.1:{port}"

        def ready():
            try:
                return httpx.get(f"{base}/readyz", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(ready, timeout=60, interval=0.2, what="gateway ready")
        tenant = httpx.post(
            f"{base}/v1/tenants",
            json={"name": "sdk"},
            headers={"Authorization": f"Bearer {OPERATOR_KEY}"},
        ).json()
        with httpx.Client(
            base_url=base, headers={"Authorization": f"Bearer {tenant['api_key']}"}
        ) as api:
            yield launch, api, env, base, tenant


class WorkerProc:
    """The SDK worker as a tenant runs it: its API key and Kafka credentials."""

    def __init__(self, topic, base, tenant, database_url, kafka_bootstrap, **extra):
        env = {**os.environ, "CRONWHEEL_URL": base, "CRONWHEEL_API_KEY": tenant["api_key"],
               "KAFKA_BOOTSTRAP": kafka_bootstrap, "EFFECTS_DSN": database_url,
               **worker_env(tenant["kafka"]), **extra}  # fmt: skip
        self.proc = subprocess.Popen(
            [PYTHON, "-m", "tests.support.sdk_worker", topic], env=env, cwd=ROOT,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip

    def kill(self):
        self.proc.kill()
        self.proc.wait(10)

    def term(self, timeout=30) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)


def _job(api, payload, every_ms=86_400_000, **extra) -> dict:
    body = {
        "name": f"j-{uuid.uuid4().hex[:6]}", "schedule": {"every_ms": every_ms},
        "target": {"type": "queue", "queue": "sdk"}, "payload": payload, "lease_ms": 1000,
        "retry": {"max_attempts": 10, "initial_backoff_ms": 50, "max_backoff_ms": 200}, **extra,
    }  # fmt: skip
    r = api.post("/v1/jobs", json=body)
    assert r.status_code == 201, r.text
    return r.json()


def _runs(database_url, job_id):
    with psycopg.connect(database_url) as conn:
        return conn.execute(
            "SELECT run_id, state, attempt FROM runs_daily WHERE job_id = %s", [job_id]
        ).fetchall()


def test_sdk__outcomes__success_retry_and_fatal(platform, database_url, kafka_bootstrap):
    launch, api, env, base, tenant = platform
    ok, flaky, fatal = (
        _job(api, {"n": 1}),
        _job(api, {"fail": "retry"}),
        _job(api, {"fail": "fatal"}),
    )
    worker = WorkerProc(ok["topic"], base, tenant, database_url, kafka_bootstrap)
    try:
        ids = [
            api.post(f"/v1/jobs/{j['job_id']}/trigger").json()["run_id"] for j in (ok, flaky, fatal)
        ]

        def states():
            got = [api.get(f"/v1/runs/{i}").json() for i in ids]
            return got if all(r["state"] in TERMINAL for r in got) else None

        done = wait_for(states, timeout=60, interval=0.2, what="three runs terminal")
        assert [r["state"] for r in done] == ["SUCCEEDED", "SUCCEEDED", "FAILED"]
        assert [r["attempt"] for r in done] == [1, 2, 1]
        assert done[1]["result"] == {"attempt": 2}
        assert "refused by the handler" in (done[2]["error"] or "")
    finally:
        assert worker.term() == 0


def test_sdk__sigterm__finishes_the_run_it_holds(platform, database_url, kafka_bootstrap):
    launch, api, env, base, tenant = platform
    job = _job(api, {"sleep_s": 2})
    worker = WorkerProc(job["topic"], base, tenant, database_url, kafka_bootstrap)
    run_id = api.post(f"/v1/jobs/{job['job_id']}/trigger").json()["run_id"]
    wait_for(
        lambda: api.get(f"/v1/runs/{run_id}").json()["state"] == "RUNNING",
        timeout=30,
        what="run started",
    )
    assert worker.term(timeout=30) == 0
    run = api.get(f"/v1/runs/{run_id}").json()
    assert run["state"] == "SUCCEEDED" and run["attempt"] == 1


def test_sdk__kill_dispatcher_and_worker_repeatedly__every_run_terminal_once(
    platform, database_url, kafka_bootstrap
):
    launch, api, env, base, tenant = platform
    job = _job(api, {"sleep_s": 0.15}, every_ms=250)
    rnd = random.Random(7)
    worker = WorkerProc(job["topic"], base, tenant, database_url, kafka_bootstrap)
    dispatcher = next(p for p in launch.started if p.name == "dispatcher")
    kills = 0
    try:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            time.sleep(rnd.uniform(0.5, 2.0))  # the fault schedule: random gaps between kills
            if rnd.random() < 0.5:
                worker.kill()
                worker = WorkerProc(job["topic"], base, tenant, database_url, kafka_bootstrap)
            else:
                dispatcher.kill()
                dispatcher = launch.start("dispatcher", **env)
            kills += 1
        assert api.post(f"/v1/jobs/{job['job_id']}/pause").status_code == 200

        last: list = []

        def all_terminal():
            runs = last[:] = _runs(database_url, job["job_id"])
            return runs if runs and all(r[1] in TERMINAL for r in runs) else None

        try:
            runs = wait_for(all_terminal, timeout=90, interval=0.5, what="every run terminal")
        except AssertionError:
            stuck = [r for r in last if r[1] not in TERMINAL]
            raise AssertionError(
                f"{len(stuck)} of {len(last)} runs not terminal: {stuck[:5]}"
            ) from None
    finally:
        worker.term()
    assert kills >= 8
    assert {r[1] for r in runs} == {"SUCCEEDED"}
    with psycopg.connect(database_url) as conn:
        effects = {r[0] for r in conn.execute("SELECT run_id FROM sdk_effects")}
        executions = conn.execute("SELECT count(*) FROM sdk_executions").fetchone()[0]
        completed = conn.execute(
            "SELECT count(*) FROM run_attempts_daily a"
            " JOIN runs_daily r USING (partition_id, run_id, scheduled_at)"
            " WHERE r.job_id = %s AND a.outcome = 'SUCCEEDED'", [job["job_id"]]
        ).fetchone()[0]  # fmt: skip
    assert effects == {r[0] for r in runs}  # every run's effect, once (keyed by run_id)
    assert completed == len(runs)  # exactly one successful attempt per run
    print(f"{len(runs)} runs, {kills} kills, {executions} handler executions")
