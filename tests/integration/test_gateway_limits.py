"""Idempotency-Key replays and the per-key rate limit, over HTTP; the limit
holds across the gateway's worker processes (one shared table of buckets)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

from cronwheel.kafka import Topics
from cronwheel.store.jobs import hash_key
from services.gateway.app import create_app
from services.gateway.ratelimit import SharedRateLimiter, create_table
from services.gateway.service import GatewayService
from tests.support.running import running
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration

OPERATOR_KEY = "cwop_limits_operator"
OP = {"Authorization": f"Bearer {OPERATOR_KEY}"}
JOB = {
    "name": "j",
    "schedule": {"cron": "0 0 1 1 *", "timezone": "UTC"},
    "target": {"type": "queue", "queue": "q"},
}


class Clock:
    now = 1_800_000_000_000

    def __call__(self) -> int:
        return self.now


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def server(database_url, kafka_bootstrap, topic_prefix, clock, request):
    limits = getattr(request, "param", {})
    app = create_app(
        database_url, Topics(topic_prefix), kafka_bootstrap, OPERATOR_KEY, clock=clock, **limits
    )
    try:
        with running(GatewayService(app, "127.0.0.1", 0, "warning")) as svc:
            yield svc
    finally:
        app.state.gateway.close()


@pytest.fixture
def client(server):
    with httpx.Client(base_url=server.url, timeout=10) as c:
        yield c


def tenant(client, name: str = "acme") -> dict:
    key = client.post("/v1/tenants", json={"name": name}, headers=OP).json()["api_key"]
    return {"Authorization": f"Bearer {key}"}


def test_idempotency__replay__first_response_and_nothing_done(client):
    h = tenant(client)
    first = client.post("/v1/jobs", json=JOB, headers={**h, "Idempotency-Key": "create-1"})
    again = client.post("/v1/jobs", json=JOB, headers={**h, "Idempotency-Key": "create-1"})
    assert first.status_code == again.status_code == 201
    assert again.content == first.content
    assert again.headers["idempotent-replayed"] == "true"
    assert len(client.get("/v1/jobs", headers=h).json()["items"]) == 1


def test_idempotency__same_key_other_body__422(client):
    h = tenant(client)
    client.post("/v1/jobs", json=JOB, headers={**h, "Idempotency-Key": "k"})
    r = client.post(
        "/v1/jobs", json={**JOB, "name": "other"}, headers={**h, "Idempotency-Key": "k"}
    )
    assert r.status_code == 422
    assert r.json()["code"] == "IDEMPOTENCY_KEY_REUSED" and r.json()["field"] == "Idempotency-Key"
    assert len(client.get("/v1/jobs", headers=h).json()["items"]) == 1


def test_idempotency__keys_are_per_tenant(client):
    a, b = tenant(client, "a"), tenant(client, "b")
    ra = client.post("/v1/jobs", json=JOB, headers={**a, "Idempotency-Key": "same"})
    rb = client.post("/v1/jobs", json=JOB, headers={**b, "Idempotency-Key": "same"})
    assert ra.status_code == rb.status_code == 201
    assert ra.json()["job_id"] != rb.json()["job_id"]
    assert "idempotent-replayed" not in rb.headers


def test_idempotency__trigger_replay_later__same_run_no_new_one(client, clock):
    h = tenant(client)
    job = client.post("/v1/jobs", json=JOB, headers=h).json()["job_id"]
    first = client.post(f"/v1/jobs/{job}/trigger", headers={**h, "Idempotency-Key": "t"})
    clock.now += 5_000  # without the key this would be a new run
    again = client.post(f"/v1/jobs/{job}/trigger", headers={**h, "Idempotency-Key": "t"})
    assert again.json() == first.json() and again.status_code == first.status_code == 201
    assert len(client.get("/v1/runs", headers=h).json()["items"]) == 1


def test_idempotency__start_replay__same_token_not_already_started(client):
    h = tenant(client)
    job = client.post("/v1/jobs", json=JOB, headers=h).json()["job_id"]
    run = client.post(f"/v1/jobs/{job}/trigger", headers=h).json()["run_id"]
    hk = {**h, "Idempotency-Key": "start-1"}
    first = client.post(f"/v1/runs/{run}/start", json={"worker_id": "w"}, headers=hk)
    again = client.post(f"/v1/runs/{run}/start", json={"worker_id": "w"}, headers=hk)
    assert first.status_code == again.status_code == 200
    assert again.json()["start_token"] == first.json()["start_token"]
    other = client.post(f"/v1/runs/{run}/start", json={"worker_id": "w"}, headers=h)
    assert other.json()["code"] == "ALREADY_STARTED"


def test_idempotency__a_4xx_is_recorded_too(client):
    h = tenant(client)
    hk = {**h, "Idempotency-Key": "bad"}
    first = client.post("/v1/jobs", json={**JOB, "name": ""}, headers=hk)
    again = client.post("/v1/jobs", json={**JOB, "name": ""}, headers=hk)
    assert first.status_code == again.status_code == 422
    assert again.content == first.content and again.headers["idempotent-replayed"] == "true"


def test_idempotency__concurrent_duplicates__one_effect(server):
    with httpx.Client(base_url=server.url, timeout=10) as c:
        h = {**tenant(c), "Idempotency-Key": "race"}
    results: list[httpx.Response] = []

    def send():
        with httpx.Client(base_url=server.url, timeout=10) as c:
            results.append(c.post("/v1/jobs", json=JOB, headers=h))

    threads = [threading.Thread(target=send) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert [r.status_code for r in results] == [201] * 4
    assert len({r.json()["job_id"] for r in results}) == 1


@pytest.mark.parametrize("server", [{"rate_per_s": 1.0, "burst": 3.0}], indirect=True)
def test_rate_limit__over_the_burst__429_with_retry_after_per_key(client):
    a, b = tenant(client, "a"), tenant(client, "b")
    codes = [client.get("/v1/jobs", headers=a).status_code for _ in range(4)]
    assert codes == [200, 200, 200, 429]
    r = client.get("/v1/jobs", headers=a)
    assert r.status_code == 429 and r.json()["code"] == "RATE_LIMITED"
    assert r.headers["content-type"].startswith("application/problem+json")
    assert int(r.headers["retry-after"]) >= 1
    assert client.get("/v1/jobs", headers=b).status_code == 200  # another key: its own bucket


ROOT = Path(__file__).resolve().parents[2]
SLOW = 0.001  # tokens per second: none come back while a test runs


def test_rate_limit__shared_table__one_bucket_for_a_key_across_processes(tmp_path):
    table = str(tmp_path / "rate-limit.table")
    create_table(table)
    key = hash_key("cwk_shared")
    elsewhere = (
        "import sys; from services.gateway.ratelimit import SharedRateLimiter;"
        f" lim = SharedRateLimiter(sys.argv[1], {SLOW}, 3);"
        " print(*(lim.take(bytes.fromhex(sys.argv[2])) == 0 for _ in range(2)))"
    )
    other = subprocess.run(
        [sys.executable, "-c", elsewhere, table, key.hex()],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert other.stdout.split() == ["True", "True"]  # two of the burst of 3, in another process
    here = SharedRateLimiter(table, SLOW, 3)
    try:
        assert here.take(key) == 0  # the third
        assert here.take(key) > 0  # the burst is spent, whichever process asks
        assert here.take(hash_key("cwk_another")) == 0  # another key: its own bucket
    finally:
        here.close()


def test_rate_limit__two_workers__the_burst_is_the_keys_not_each_workers(
    database_url, kafka_bootstrap, topic_prefix
):
    """`serve gateway` with two workers and a burst of 3: requests of one key on
    connections each worker accepted get 3 answers in all, not 3 per worker."""
    port = _free_port()
    operator = "cwop_limits_workers_7f3a9c1e5b2d8046"
    env = {
        **os.environ,
        "DATABASE_URL": database_url,
        "KAFKA_BOOTSTRAP": kafka_bootstrap,
        "CRONWHEEL_TOPIC_PREFIX": topic_prefix,
        "CRONWHEEL_HTTP_ADDR": f"127.0.0.1:{port}",
        "CRONWHEEL_OPERATOR_KEY": operator,
        "CRONWHEEL_GATEWAY_WORKERS": "2",
        "CRONWHEEL_RATE_LIMIT": str(SLOW),
        "CRONWHEEL_RATE_BURST": "3",
        "CRONWHEEL_LOG_LEVEL": "WARNING",
    }
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "services.entrypoints", "serve", "gateway"], env=env
    )
    try:
        workers = wait_for(lambda: _two_children(proc.pid), 60, 0.1, "two workers")
        wait_for(lambda: _healthy(port), 60, 0.1, "the gateway answering")
        served: list[tuple[int, int]] = []  # (worker pid, status) in order
        for _ in range(200):  # new connections until each worker has answered twice
            status, worker = _get_on_new_connection(port, operator, workers)
            served.append((worker, status))
            if len(served) >= 6 and all(sum(w == pid for w, _ in served) >= 2 for pid in workers):
                break
        assert all(sum(w == pid for w, _ in served) >= 2 for pid in workers), served
        # Per-worker buckets would have let at least 4 through (2 + 2).
        assert [status for _, status in served] == [200] * 3 + [429] * (len(served) - 3)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _two_children(pid: int) -> list[int] | None:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            kids = [int(x) for x in f.read().split()]
    except OSError:
        return None
    return kids if len(kids) == 2 else None


def _healthy(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def _get_on_new_connection(port: int, key: str, workers: list[int]) -> tuple[int, int]:
    """(status, pid of the worker that accepted the connection) of one
    GET /v1/tenants on a connection of its own, kept open until the worker
    holding its other end is found."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(
            f"GET /v1/tenants HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: Bearer {key}\r\n\r\n".encode()
        )
        answer = b""
        while b"\r\n\r\n" not in answer:
            chunk = sock.recv(65536)
            assert chunk, f"connection closed after {answer!r}"
            answer += chunk
        status = int(answer.split(b" ", 2)[1])
        mine = sock.getsockname()[1]
        worker = wait_for(lambda: _holder(port, mine, workers), 10, 0.02, "the accepting worker")
        return status, worker


def _holder(port: int, client_port: int, workers: list[int]) -> int | None:
    """The worker with the server end of the connection from `client_port` open."""
    inode = None
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            fields = line.split()
            local, remote = fields[1], fields[2]
            if int(local.rsplit(":", 1)[1], 16) == port and (
                int(remote.rsplit(":", 1)[1], 16) == client_port
            ):
                inode = fields[9]
    if inode is None:
        return None
    target = f"socket:[{inode}]"
    for pid in workers:
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    if os.readlink(f"/proc/{pid}/fd/{fd}") == target:
                        return pid
    return None
