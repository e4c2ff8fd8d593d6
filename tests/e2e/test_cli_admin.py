"""The admin verbs of `cronwheel` against a running gateway, as a person or a
script uses them: tables by default, JSON with --json, one line and exit 1 on error."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import uuid

import httpx
import pytest

from tests.support.procs import ROOT, launcher
from tests.support.wait import wait_for

pytestmark = pytest.mark.e2e
OPERATOR_KEY = "cwop_test_" + uuid.uuid4().hex


@pytest.fixture
def gateway(database_url, kafka_bootstrap, topic_prefix):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with launcher(database_url, kafka_bootstrap, topic_prefix) as launch:
        launch.start(
            "gateway", CRONWHEEL_HTTP_ADDR=f"127.0.0.1:{port}", CRONWHEEL_OPERATOR_KEY=OPERATOR_KEY
        )
        base = f"http://127.0.0.1:{port}"

        def ready():
            try:
                return httpx.get(f"{base}/readyz", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(ready, timeout=60, interval=0.2, what="gateway ready")
        yield base


def cw(base: str, key: str, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "CRONWHEEL_URL": base, "CRONWHEEL_API_KEY": key}
    return subprocess.run(
        [sys.executable, "-m", "services.entrypoints", *args], env=env, cwd=ROOT, input=stdin,
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_cli__tenant_job_run_round_trip(gateway, tmp_path):
    made = cw(gateway, OPERATOR_KEY, "tenants", "create", "acme", "--json")
    assert made.returncode == 0, made.stderr
    key = json.loads(made.stdout)["api_key"]

    job_file = tmp_path / "job.json"
    job_file.write_text(json.dumps({
        "name": "hourly-report", "schedule": {"cron": "0 * * * *", "timezone": "Europe/Berlin"},
        "target": {"type": "queue", "queue": "reports"},
    }))  # fmt: skip
    created = cw(gateway, key, "jobs", "create", "-f", str(job_file), "--json")
    assert created.returncode == 0, created.stderr
    job_id = json.loads(created.stdout)["job_id"]

    table = cw(gateway, key, "jobs", "list")
    assert table.returncode == 0 and job_id in table.stdout and "NEXT_FIRE_AT" in table.stdout

    assert cw(gateway, key, "jobs", "pause", job_id).returncode == 0
    assert json.loads(cw(gateway, key, "jobs", "get", job_id, "--json").stdout)["paused"] is True

    run_id = json.loads(cw(gateway, key, "jobs", "trigger", job_id, "--json").stdout)["run_id"]
    runs = json.loads(cw(gateway, key, "runs", "list", "--job", job_id, "--json").stdout)
    assert [r["run_id"] for r in runs["items"]] == [run_id]
    assert cw(gateway, key, "runs", "cancel", run_id).returncode == 0
    assert (
        json.loads(cw(gateway, key, "runs", "get", run_id, "--json").stdout)["state"] == "CANCELLED"
    )


def test_cli__bad_input__one_line_naming_the_field_and_exit_1(gateway):
    key = json.loads(cw(gateway, OPERATOR_KEY, "tenants", "create", "beta", "--json").stdout)[
        "api_key"
    ]
    bad = json.dumps(
        {"name": "x", "schedule": {"cron": "61 * * * *"}, "target": {"type": "queue", "queue": "q"}}
    )
    result = cw(gateway, key, "jobs", "create", "-f", "-", stdin=bad)
    assert result.returncode == 1
    line = result.stderr.strip()
    assert "\n" not in line and line.startswith("cronwheel: 422") and "schedule.cron" in line
    missing = cw(gateway, key, "jobs", "get", "job_doesnotexist")
    assert missing.returncode == 1 and missing.stderr.startswith("cronwheel: 404")
    assert cw(gateway, "wrong-key", "jobs", "list").stderr.startswith("cronwheel: 401")
