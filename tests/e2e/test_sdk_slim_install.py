"""What a customer's worker installs: `pip install cronwheel`, no extras, brings
the SDK with confluent-kafka and fastavro and nothing of the platform, and
examples/worker.py run from that install completes a run of the platform
running as processes."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e import test_sdk_worker
from tests.support.kafka import worker_env
from tests.support.procs import ROOT
from tests.support.wait import wait_for

pytestmark = pytest.mark.e2e

# The fixture: gateway, timer, relay and dispatcher as processes, and a client
# of a new tenant's.
platform = test_sdk_worker.platform

# The distributions a slim install may hold besides the installer's own.
SDK_DISTRIBUTIONS = {"cronwheel", "confluent-kafka", "fastavro"}
INSTALLER = {"pip", "setuptools", "wheel"}
# The platform's packages (the server extra) and the test extra's: none is there.
PLATFORM_MODULES = ("fastapi", "starlette", "uvicorn", "psycopg", "psycopg_pool", "httpx",
                    "prometheus_client", "croniter", "faust", "aiokafka", "avro")  # fmt: skip


def _clean_env(**extra: str) -> dict[str, str]:
    """The environment with nothing that points into the checkout or its venv."""
    drop = ("PYTHONPATH", "VIRTUAL_ENV", "CRONWHEEL_SCHEMAS", "PIP_NO_CACHE_DIR")
    return {**{k: v for k, v in os.environ.items() if k not in drop}, **extra}


@pytest.fixture(scope="module")
def slim_python(tmp_path_factory) -> Path:
    """A fresh venv holding `pip install <checkout>` and nothing more. The
    checkout is copied first (a build writes build/ and *.egg-info beside its
    sources); wheels come from the pip cache after the first run."""
    tmp = tmp_path_factory.mktemp("slim")
    src = tmp / "src"
    src.mkdir()
    shutil.copy(ROOT / "pyproject.toml", src)
    skip = shutil.ignore_patterns("__pycache__", "*.egg-info", "build")
    for tree in ("cronwheel", "services", "schemas"):
        shutil.copytree(ROOT / tree, src / tree, ignore=skip)
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    python = venv / "bin" / "python"
    cache = Path.home() / ".cache" / "pip"
    install = [python, "-m", "pip", "install", "-q", "--disable-pip-version-check",
               "--cache-dir", cache, src]  # fmt: skip
    done = subprocess.run(install, env=_clean_env(), capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    return python


def _in_venv(python: Path, code: str):
    out = subprocess.run(
        [python, "-c", code], env=_clean_env(), cwd=python.parents[2], capture_output=True,
        text=True, check=True,
    )  # fmt: skip
    return json.loads(out.stdout)


def test_slim_install__holds_the_sdk_and_none_of_the_platform(slim_python):
    dists = _in_venv(
        slim_python,
        "import importlib.metadata as m, json; "
        "print(json.dumps(sorted({d.metadata['Name'].lower() for d in m.distributions()})))",
    )
    assert set(dists) - INSTALLER == SDK_DISTRIBUTIONS
    found = _in_venv(
        slim_python,
        "import importlib.util as u, json; "
        f"print(json.dumps([m for m in {PLATFORM_MODULES!r} if u.find_spec(m)]))",
    )
    assert found == []
    where = _in_venv(
        slim_python, "import cronwheel.sdk, json; print(json.dumps(cronwheel.__file__))"
    )
    assert Path(where).is_relative_to(slim_python.parents[1])  # the venv's copy, not the checkout's


def test_slim_install__the_command_says_what_to_install(slim_python):
    done = subprocess.run(
        [slim_python.parent / "cronwheel", "status"], env=_clean_env(), capture_output=True,
        text=True, cwd=slim_python.parents[2],
    )  # fmt: skip
    assert done.returncode == 1
    assert "pip install 'cronwheel[server]'" in done.stderr


def test_slim_install__example_worker_completes_a_run(slim_python, platform, kafka_bootstrap):
    _launch, api, _env, base, tenant = platform
    job = api.post("/v1/jobs", json={
        "name": "slim", "schedule": {"every_ms": 86_400_000},
        "target": {"type": "queue", "queue": "slim"}, "payload": {"n": 1},
    })  # fmt: skip
    assert job.status_code == 201, job.text
    worker = subprocess.Popen(
        [slim_python, ROOT / "examples" / "worker.py", job.json()["topic"]],
        env=_clean_env(CRONWHEEL_URL=base, CRONWHEEL_API_KEY=tenant["api_key"],
                       KAFKA_BOOTSTRAP=kafka_bootstrap, **worker_env(tenant["kafka"])),
        cwd=slim_python.parents[2], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        run_id = api.post(f"/v1/jobs/{job.json()['job_id']}/trigger").json()["run_id"]

        def finished():
            assert worker.poll() is None, "the example worker exited"
            run = api.get(f"/v1/runs/{run_id}").json()
            return run if run["state"] not in ("PENDING", "RUNNING") else None

        run = wait_for(finished, timeout=60, interval=0.2, what="the run handled")
    finally:
        worker.send_signal(signal.SIGTERM)
        output = worker.communicate(timeout=30)[0].decode(errors="replace")
    assert run["state"] == "SUCCEEDED", output
    assert run["result"] == {"handled_by": "examples/worker.py"}
    assert worker.returncode == 0, output
    assert f"run {run_id} attempt 1" in output
