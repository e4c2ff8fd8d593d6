"""`cronwheel up | down | status` as a user runs them: a second private stack on
ports of its own, so the suite's own stack is untouched."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys

import psycopg
import pytest

from cronwheel.stack.process import pid_alive, port_open

pytestmark = pytest.mark.e2e


def _free_ports(n: int) -> list[int]:
    """Ports free right now, chosen by the kernel. Fixed ones (this test used
    55442) sit in the ephemeral range, where the suite's own client
    connections can hold them as local ports: the cluster then failed to bind."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


PG_PORT, KAFKA_PORT, CONTROLLER_PORT = _free_ports(3)


def _cli(home, *args, env_extra=None, timeout=180):
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "KAFKA_BOOTSTRAP")}
    env.update(
        CRONWHEEL_HOME=str(home),
        CRONWHEEL_PG_PORT=str(PG_PORT),
        CRONWHEEL_KAFKA_PORT=str(KAFKA_PORT),
        CRONWHEEL_KAFKA_CONTROLLER_PORT=str(CONTROLLER_PORT),
        **(env_extra or {}),
    )
    return subprocess.run(
        [sys.executable, "-m", "services.entrypoints", *args],
        env=env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


@pytest.fixture
def home(tmp_path_factory):
    home = tmp_path_factory.mktemp("stack") / ".cronwheel"
    yield home
    _cli(home, "down")
    shutil.rmtree(home, ignore_errors=True)


def _pids(status: dict) -> list[int]:
    return [
        int(v.split("pid ")[1].rstrip(")"))
        for v in (status["postgres"], status["kafka"])
        if "pid" in v
    ]


def test_up_twice_then_down__idempotent_and_leaves_no_process(home):
    first = _cli(home, "up", "--json")
    assert first.returncode == 0, first.stderr
    st = json.loads(first.stdout)
    assert st["database_url"].endswith(f":{PG_PORT}/cronwheel")
    # The services' login beside the owner's (CONTRACT.md): once migrated, each logs in.
    assert st["database_url"].startswith("postgresql://cronwheel_platform:")
    assert st["admin_database_url"].endswith(f":{PG_PORT}/cronwheel")
    migrated = _cli(home, "migrate")
    assert migrated.returncode == 0, migrated.stderr
    logins = ((st["database_url"], "cronwheel_platform"), (st["admin_database_url"], "cronwheel"))
    for url, role in logins:
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT current_user").fetchone()[0] == role
    assert st["kafka_bootstrap"] == f"127.0.0.1:{KAFKA_PORT}"
    pids = _pids(st)
    assert len(pids) == 2 and all(pid_alive(p) for p in pids)

    again = _cli(home, "up", "--json")
    assert again.returncode == 0, again.stderr
    assert _pids(json.loads(again.stdout)) == pids  # nothing new started

    status = json.loads(_cli(home, "status", "--json").stdout)
    assert status["postgres"].startswith("running") and status["kafka"].startswith("running")

    down = _cli(home, "down", "--json")
    assert down.returncode == 0, down.stderr
    assert not any(pid_alive(p) for p in pids)
    assert not port_open(PG_PORT) and not port_open(KAFKA_PORT) and not port_open(CONTROLLER_PORT)
    assert json.loads(_cli(home, "status", "--json").stdout)["kafka"] == "stopped"


def test_up__no_java__one_line_error(home, tmp_path):
    bare = tmp_path / "bin"
    bare.mkdir()
    result = _cli(
        home,
        "up",
        env_extra={"PATH": str(bare), "DATABASE_URL": "postgresql://x@127.0.0.1:1/x"},
        timeout=30,
    )
    assert result.returncode == 1
    assert result.stderr.strip().count("\n") == 0
    assert "java not found" in result.stderr


def test_up__kafka_port_taken__one_line_error(home):
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", KAFKA_PORT))
        squatter.listen()
        result = _cli(
            home, "up", env_extra={"DATABASE_URL": "postgresql://x@127.0.0.1:1/x"}, timeout=60
        )
    assert result.returncode == 1
    assert f"port {KAFKA_PORT} is taken" in result.stderr
    assert result.stderr.strip().count("\n") == 0


def test_status__external_servers__starts_nothing(home):
    env = {
        "DATABASE_URL": "postgresql://u@db.example:5432/x",
        "KAFKA_BOOTSTRAP": "kafka.example:9092",
    }
    result = _cli(home, "up", "--json", env_extra=env, timeout=30)
    assert result.returncode == 0, result.stderr
    st = json.loads(result.stdout)
    assert st["postgres"] == "external" and st["kafka"] == "external"
    assert (
        st["database_url"] == env["DATABASE_URL"]
        and st["kafka_bootstrap"] == env["KAFKA_BOOTSTRAP"]
    )
