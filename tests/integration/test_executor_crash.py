"""The executor going away mid-run. Killed with SIGKILL: its sandbox dies with
it, the lease expires, and the run is retried (attempt 2) by the executor that
comes next. Stopped: the command is killed after the grace period and the
attempt completed FAILED retryable, so the retry comes without waiting out the
lease."""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path

import psycopg
import pytest

from cronwheel.core.clock import now_ms
from cronwheel.kafka import Topics
from cronwheel.store.jobs import Jobs, create_tenant
from cronwheel.store.runs_read import get_run
from services.dispatcher.service import Dispatcher
from services.executor.service import Executor
from services.relay.service import Relay
from services.timer.service import TimerService
from tests.support.procs import launcher
from tests.support.running import running
from tests.support.wait import wait_for

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap: make system-deps"),
]

EXECUTOR_ENV = {
    "CRONWHEEL_EXECUTOR_CONCURRENCY": "2",
    "CRONWHEEL_EXECUTOR_SESSION_TIMEOUT_MS": "6000",  # the broker's minimum
    "CRONWHEEL_EXECUTOR_SHUTDOWN_GRACE_MS": "500",
}


def processes_with(args: list[str]) -> list[int]:
    want = "\0".join(args).encode() + b"\0"
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if (entry / "cmdline").read_bytes() == want:
                    found.append(int(entry.name))
    return found


def test_executor_killed_mid_run__lease_expires__attempt_2_completes(
    database_url, kafka_bootstrap, topic_prefix
):
    topics = Topics(topic_prefix)
    sleeper = ["sleep", "41.75"]  # attempt 1 hangs here; no other process uses this argument
    script = 'echo attempt $CRONWHEEL_ATTEMPT; [ "$CRONWHEEL_ATTEMPT" = 1 ] && exec sleep 41.75; echo done'
    with contextlib.ExitStack() as stack:
        conn = stack.enter_context(psycopg.connect(database_url, autocommit=True))
        stack.enter_context(running(Relay(database_url, kafka_bootstrap, idle_ms=100)))
        stack.enter_context(running(Dispatcher(database_url, kafka_bootstrap, topics)))
        stack.enter_context(
            running(TimerService(database_url, topics, lease_ttl_ms=5000, ahead_ms=0))
        )
        launch = stack.enter_context(launcher(database_url, kafka_bootstrap, topic_prefix))

        tenant = create_tenant(conn, "crashy")
        jobs = Jobs(topics)
        job = jobs.create(
            conn,
            tenant,
            {
                "name": "hangs-once",
                "schedule": {"at": "2099-01-01T00:00:00.000Z"},
                "target": {"type": "managed", "command": ["sh", "-c", script]},
                "lease_ms": 1500,
                "retry": {"max_attempts": 3, "initial_backoff_ms": 100, "max_backoff_ms": 100},
            },
            now_ms(),
        )
        first = launch.start("executor", **EXECUTOR_ENV)
        run_id = jobs.trigger(conn, tenant, job["job_id"], now_ms())["run_id"]

        def run() -> dict:
            return get_run(conn, tenant["tenant_id"], run_id)

        wait_for(lambda: processes_with(sleeper), 40, what="attempt 1's command to run")
        held = run()
        assert (held["state"], held["attempt"]) == ("RUNNING", 1)
        assert held["worker_id"].startswith("executor:")

        first.kill()
        wait_for(lambda: not processes_with(sleeper), 5, what="the sandbox to die with it")
        launch.start("executor", **EXECUTOR_ENV)

        done = wait_for(lambda: run()["state"] == "SUCCEEDED" and run(), 60, what="attempt 2")
    assert done["attempt"] == 2
    assert done["result"]["output"] == "attempt 2\ndone\n"
    assert [(a["attempt"], a["outcome"], a["error"]) for a in done["attempts"]] == [
        (1, "TIMED_OUT", "lease expired"),
        (2, "SUCCEEDED", None),
    ]
    assert done["attempts"][0]["worker_id"] != done["attempts"][1]["worker_id"]


def test_executor_stopped_mid_run__command_killed_after_grace__run_retried(
    database_url, kafka_bootstrap, topic_prefix
):
    topics = Topics(topic_prefix)
    sleeper = ["sleep", "43.25"]
    script = 'echo attempt $CRONWHEEL_ATTEMPT; [ "$CRONWHEEL_ATTEMPT" = 1 ] && exec sleep 43.25; echo done'
    with contextlib.ExitStack() as stack:
        conn = stack.enter_context(psycopg.connect(database_url, autocommit=True))
        stack.enter_context(running(Relay(database_url, kafka_bootstrap, idle_ms=100)))
        stack.enter_context(running(Dispatcher(database_url, kafka_bootstrap, topics)))
        stack.enter_context(
            running(TimerService(database_url, topics, lease_ttl_ms=5000, ahead_ms=0))
        )
        tenant = create_tenant(conn, "stopping")
        jobs = Jobs(topics)
        job = jobs.create(
            conn,
            tenant,
            {
                "name": "interrupted-once",
                "schedule": {"at": "2099-01-01T00:00:00.000Z"},
                "target": {"type": "managed", "command": ["sh", "-c", script]},
                "retry": {"max_attempts": 2, "initial_backoff_ms": 100, "max_backoff_ms": 100},
            },
            now_ms(),
        )
        run_id = jobs.trigger(conn, tenant, job["job_id"], now_ms())["run_id"]

        def executor() -> Executor:
            return Executor(database_url, kafka_bootstrap, topics, shutdown_grace_ms=300)

        with running(executor()):
            wait_for(lambda: processes_with(sleeper), 40, what="attempt 1's command to run")
        assert not processes_with(sleeper)  # killed once the grace ran out
        with running(executor()):
            done = wait_for(
                lambda: (
                    (r := get_run(conn, tenant["tenant_id"], run_id))["state"] == "SUCCEEDED" and r
                ),
                40,
                what="attempt 2",
            )
    assert [(a["attempt"], a["outcome"], a["error"]) for a in done["attempts"]] == [
        (1, "FAILED", "interrupted: the executor stopped"),
        (2, "SUCCEEDED", None),
    ]
    assert done["result"]["output"] == "attempt 2\ndone\n"
