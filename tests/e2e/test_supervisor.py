"""`cronwheel serve A B` (and so `cronwheel dev`) supervises: a service that
dies is started again with a line saying why, the others keep running, and
`cronwheel status` shows the restarts."""

from __future__ import annotations

import json
import os
import signal
import subprocess

import pytest

from cronwheel.supervisor import exit_reason, read_state
from tests.support.procs import PYTHON, ROOT
from tests.support.wait import wait_for

pytestmark = pytest.mark.e2e


@pytest.fixture
def env(database_url, kafka_bootstrap, topic_prefix, tmp_path):
    e = {k: v for k, v in os.environ.items() if k not in ("CRONWHEEL_METRICS_PORT",)}
    e.update(
        DATABASE_URL=database_url,
        KAFKA_BOOTSTRAP=kafka_bootstrap,
        CRONWHEEL_TOPIC_PREFIX=topic_prefix,
        CRONWHEEL_HOME=str(tmp_path / "home"),
        PYTHONUNBUFFERED="1",
    )
    return e


def test_exit_reason__signals_by_name__statuses_by_number():
    assert exit_reason(-6) == "killed by SIGABRT"
    assert exit_reason(-9) == "killed by SIGKILL"
    assert exit_reason(3) == "exit status 3"


def test_service_killed__restarted_with_its_reason__others_untouched__status_shows_restarts(
    env, tmp_path
):
    home = tmp_path / "home"
    log = (tmp_path / "supervisor.log").open("wb")
    sup = subprocess.Popen(
        [PYTHON, "-m", "services.entrypoints", "serve", "dispatcher", "workflow"],
        env=env,
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
    )

    def services():
        st = read_state(home)
        return st["services"] if st else {}

    def running(name):
        s = services().get(name) or {}
        return s.get("pid") if s.get("state") == "running" else None

    try:
        first = wait_for(lambda: running("dispatcher"), timeout=30, what="dispatcher running")
        workflow = wait_for(lambda: running("workflow"), timeout=30, what="workflow running")

        os.kill(first, signal.SIGKILL)
        second = wait_for(
            lambda: (p := running("dispatcher")) and p != first and p,
            timeout=30,
            what="dispatcher started again",
        )
        assert services()["dispatcher"]["restarts"] == 1
        assert services()["dispatcher"]["last_exit"].startswith("killed by SIGKILL")

        os.kill(second, signal.SIGABRT)  # as the confluent-kafka assertion ended it
        wait_for(
            lambda: (p := running("dispatcher")) and p not in (first, second),
            timeout=30,
            what="dispatcher started a third time",
        )
        assert services()["dispatcher"]["restarts"] == 2
        assert services()["dispatcher"]["last_exit"].startswith("killed by SIGABRT")
        assert sup.poll() is None, "the supervisor stopped"
        assert services()["workflow"] == {**services()["workflow"], "pid": workflow, "restarts": 0}

        out = subprocess.run(
            [PYTHON, "-m", "services.entrypoints", "status", "--json"],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        status = json.loads(out.stdout)
        assert status["services"]["dispatcher"]["restarts"] == 2
        assert status["services"]["workflow"]["restarts"] == 0
        text = subprocess.run(
            [PYTHON, "-m", "services.entrypoints", "status"],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout
        assert "restarts 2, last: killed by SIGABRT" in text
    finally:
        sup.send_signal(signal.SIGTERM)
        rc = sup.wait(30)
        log.close()
    said = (tmp_path / "supervisor.log").read_text()
    assert "service dispatcher died after" in said and "(killed by SIGKILL" in said
    assert "(killed by SIGABRT" in said and "restart 2 in" in said
    assert rc == 0
    assert read_state(home) is None  # the supervisor is gone: status shows no services
    for pid in (first, second, workflow):
        wait_for(lambda pid=pid: not _alive(pid), timeout=10, what=f"pid {pid} gone")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie child of the supervisor still answers kill 0 until reaped.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except OSError:
        return False
