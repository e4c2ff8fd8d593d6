"""The worker protocol's lean path: one statement per transition, the key check
and scope in one (cronwheel_authenticate), pipeline mode, no savepoint. What it
must keep: the timers each transition arms or drops, the RunCompleted record,
a buffered instant's release, the refusal codes under a race, and a revoked
key refused at once. Round trips are counted on the wire (libpq's trace), not
timed."""

from __future__ import annotations

import os
import tempfile
import threading

import httpx
import psycopg
import pytest

from cronwheel.core.clock import now_ms
from cronwheel.core.ids import partition_of_run
from cronwheel.kafka import Topics
from services.gateway.app import create_app
from services.gateway.service import GatewayService
from tests.support.gateway import new_run, tenant_client
from tests.support.running import running

pytestmark = pytest.mark.integration

OPERATOR_KEY = "cwop_fastpath_operator_4e8b1d6a9f2c7053"


@pytest.fixture
def gateway(database_url, kafka_bootstrap, topic_prefix):
    """(client, app) over a pool of one connection, so its wire can be traced."""
    app = create_app(database_url, Topics(topic_prefix), kafka_bootstrap, OPERATOR_KEY, pool_max=1)
    with tenant_client(app, OPERATOR_KEY) as c:
        yield c, app


def timers_of(database_url, run_id: str) -> dict[str, tuple]:
    with psycopg.connect(database_url) as conn:
        rows = conn.execute(
            "SELECT kind, attempt, tenant_id, due_at FROM timers WHERE owner_id = %s", (run_id,)
        ).fetchall()
    return {r[0]: r[1:] for r in rows}


class Wire:
    """Round trips of the gateway's one pooled connection, read from libpq's trace
    (written through C stdio, so complete only once the trace is closed): each
    run of client messages followed by server messages is one."""

    def __init__(self, app):
        self.pool = app.state.gateway.pool

    def round_trips(self, request) -> int:
        fd, path = tempfile.mkstemp(suffix=".trace")
        try:
            with self.pool.connection() as conn:
                conn.pgconn.trace(fd)  # libpq owns fd now; untrace closes it
                conn.pgconn.set_trace_flags(psycopg.pq.Trace.SUPPRESS_TIMESTAMPS)
            request()
            with self.pool.connection() as conn:
                conn.pgconn.untrace()
            with open(path) as f:
                sides = [line.split("\t", 1)[0] for line in f if line.strip()]
        finally:
            os.unlink(path)
        return sum(1 for a, b in zip(sides, sides[1:], strict=False) if a == "F" and b == "B")


def test_round_trips__start_heartbeat_complete__three_each(gateway):
    client, app = gateway
    run_id = new_run(client)
    wire = Wire(app)
    got: dict[str, httpx.Response] = {}

    def call(name: str, body: dict) -> None:
        got[name] = client.post(f"/v1/runs/{run_id}/{name}", json=body)
        assert got[name].status_code == 200, got[name].text

    start_trips = wire.round_trips(lambda: call("start", {"worker_id": "w"}))
    fence = {"attempt": 1, "start_token": got["start"].json()["start_token"]}
    beat_trips = wire.round_trips(lambda: call("heartbeat", fence))
    complete_trips = wire.round_trips(lambda: call("complete", {**fence, "outcome": "SUCCEEDED"}))
    # BEGIN + key check, the transition, [the RunCompleted row +] COMMIT.
    assert (start_trips, beat_trips, complete_trips) == (3, 3, 3)


def test_start__arms_lease_and_timeout_timers__complete_drops_them_and_announces(
    gateway, database_url
):
    client, _ = gateway
    run_id = new_run(client, timeout_ms=60_000, priority="high")
    before = now_ms()
    got = client.post(f"/v1/runs/{run_id}/start", json={"worker_id": "w"}).json()
    timers = timers_of(database_url, run_id)
    assert set(timers) == {"lease", "timeout"}
    tenant = timers["lease"][1]
    assert tenant.startswith("ten") and timers["timeout"][1] == tenant
    assert timers["lease"][0] == timers["timeout"][0] == 1
    assert timers["timeout"][2].timestamp() * 1000 >= before + 60_000
    with psycopg.connect(database_url) as conn:
        prio = conn.execute("SELECT priority FROM timers WHERE owner_id = %s", (run_id,)).fetchall()
        assert {p for (p,) in prio} == {1}
        outbox_before = conn.execute("SELECT count(*) FROM outbox").fetchone()[0]
    fence = {"attempt": 1, "start_token": got["start_token"]}
    client.post(f"/v1/runs/{run_id}/complete", json={**fence, "outcome": "SUCCEEDED"})
    assert timers_of(database_url, run_id) == {}
    with psycopg.connect(database_url) as conn:
        rows = conn.execute(
            "SELECT topic, key, priority FROM outbox ORDER BY id OFFSET %s", (outbox_before,)
        ).fetchall()
        attempt = conn.execute(
            "SELECT outcome, finished_at IS NOT NULL FROM run_attempts_daily WHERE run_id = %s",
            (run_id,),
        ).fetchone()
    assert [(r[0].endswith("run-completed"), bytes(r[1]), r[2]) for r in rows] == [
        (True, run_id.encode(), 2)
    ]
    assert attempt == ("SUCCEEDED", True)


def test_retryable_failure__arms_retry_timer_of_the_run_tenant(gateway, database_url):
    client, _ = gateway
    run_id = new_run(client)
    got = client.post(f"/v1/runs/{run_id}/start", json={"worker_id": "w"}).json()
    fence = {"attempt": 1, "start_token": got["start_token"]}
    r = client.post(f"/v1/runs/{run_id}/complete", json={**fence, "outcome": "FAILED"})
    assert r.json()["state"] == "RETRY_WAIT"
    timers = timers_of(database_url, run_id)
    assert set(timers) == {"retry"}
    assert timers["retry"][0] == 1 and timers["retry"][1].startswith("ten")


def test_complete__buffered_instant__released_as_a_new_run(gateway, database_url):
    client, _ = gateway
    r = client.post(
        "/v1/jobs",
        json={
            "name": "buffered",
            "schedule": {"cron": "0 0 1 1 *", "timezone": "UTC", "overlap": "buffer_one"},
            "target": {"type": "queue", "queue": "work"},
        },
    )
    assert r.status_code == 201, r.text
    job_id = r.json()["job_id"]
    run_id = client.post(f"/v1/jobs/{job_id}/trigger").json()["run_id"]
    instant = now_ms() - 60_000
    with psycopg.connect(database_url) as conn:
        conn.execute(
            "UPDATE jobs SET buffered_at = to_timestamp(%s / 1000.0) WHERE job_id = %s",
            (instant, job_id),
        )
    got = client.post(f"/v1/runs/{run_id}/start", json={"worker_id": "w"}).json()
    fence = {"attempt": 1, "start_token": got["start_token"]}
    r = client.post(f"/v1/runs/{run_id}/complete", json={**fence, "outcome": "SUCCEEDED"})
    assert r.json()["state"] == "SUCCEEDED"
    with psycopg.connect(database_url) as conn:
        buffered = conn.execute(
            "SELECT buffered_at FROM jobs WHERE job_id = %s", (job_id,)
        ).fetchone()[0]
        runs = conn.execute(
            "SELECT state, (extract(epoch FROM scheduled_at) * 1000)::bigint FROM runs_daily"
            " WHERE job_id = %s AND run_id <> %s",
            (job_id, run_id),
        ).fetchall()
    assert buffered is None
    assert runs == [("PENDING", instant)]


def test_start__many_workers_race__one_wins_the_rest_already_started(gateway, database_url):
    client, app = gateway
    app.state.gateway.pool.resize(1, 8)
    run_id = new_run(client)
    answers: list[httpx.Response] = []
    lock = threading.Lock()
    go = threading.Barrier(8)

    def worker(i: int) -> None:
        go.wait()
        r = client.post(f"/v1/runs/{run_id}/start", json={"worker_id": f"w{i}"})
        with lock:
            answers.append(r)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    codes = sorted(r.status_code for r in answers)
    assert codes == [200] + [409] * 7
    assert {r.json()["code"] for r in answers if r.status_code == 409} == {"ALREADY_STARTED"}
    with psycopg.connect(database_url) as conn:
        n = conn.execute(
            "SELECT count(*) FROM run_attempts_daily WHERE partition_id = %s AND run_id = %s",
            (partition_of_run(run_id), run_id),
        ).fetchone()[0]
    assert n == 1


def test_revoked_key__worker_routes_401_and_change_nothing(gateway, database_url):
    client, _ = gateway
    run_id = new_run(client)
    with psycopg.connect(database_url) as conn:
        conn.execute("UPDATE api_keys SET revoked_at = now()")
    r = client.post(f"/v1/runs/{run_id}/start", json={"worker_id": "w"})
    assert r.status_code == 401 and r.json()["code"] == "UNAUTHENTICATED"
    assert timers_of(database_url, run_id) == {}
    with psycopg.connect(database_url) as conn:
        state = conn.execute("SELECT state FROM runs_daily WHERE run_id = %s", (run_id,)).fetchone()
    assert state == ("PENDING",)


def test_other_tenant__start_is_404_and_changes_nothing(gateway, database_url):
    client, _ = gateway
    run_id = new_run(client)
    other = client.post(
        "/v1/tenants",
        json={"name": "other"},
        headers={"Authorization": f"Bearer {OPERATOR_KEY}"},
    ).json()["api_key"]
    r = client.post(
        f"/v1/runs/{run_id}/start",
        json={"worker_id": "w"},
        headers={"Authorization": f"Bearer {other}"},
    )
    assert r.status_code == 404 and r.json()["code"] == "NOT_FOUND"
    assert timers_of(database_url, run_id) == {}


@pytest.fixture
def both(database_url, kafka_bootstrap, topic_prefix):
    """Two gateways on one database: the worker fast path on, and off."""
    apps = [
        create_app(
            database_url,
            Topics(topic_prefix),
            kafka_bootstrap,
            OPERATOR_KEY,
            worker_fastpath=fast,
            rate_per_s=1.0,
            burst=40.0,
        )
        for fast in (True, False)
    ]
    try:
        with (
            running(GatewayService(apps[0], "127.0.0.1", 0, "warning")) as fast,
            running(GatewayService(apps[1], "127.0.0.1", 0, "warning")) as slow,
            httpx.Client(base_url=fast.url, timeout=10) as f,
            httpx.Client(base_url=slow.url, timeout=10) as s,
        ):
            r = f.post(
                "/v1/tenants",
                json={"name": "acme"},
                headers={"Authorization": f"Bearer {OPERATOR_KEY}"},
            )
            key = r.json()["api_key"]
            yield f, s, key
    finally:
        for app in apps:
            app.state.gateway.close()


def _same(a: httpx.Response, b: httpx.Response) -> tuple:
    keep = ("content-type", "www-authenticate", "retry-after")
    return a.status_code, a.json() if a.content else None, {h: a.headers.get(h) for h in keep}


def test_fastpath__refusals__same_answers_as_fastapi(both):
    fast, slow, key = both
    run_id = new_run(_authed(fast, key))
    other = new_run(_authed(fast, key))
    del fast.headers["Authorization"]
    bearer = {"Authorization": f"Bearer {key}"}
    cases = [
        ("start", {}, {"worker_id": "w"}),  # no Authorization
        ("start", {"Authorization": f"Basic {key}"}, {"worker_id": "w"}),
        ("start", {"Authorization": "Bearer"}, {"worker_id": "w"}),
        ("start", {"Authorization": "Bearer cw_unknown"}, {"worker_id": "w"}),
        ("start", {"Authorization": f"Bearer {OPERATOR_KEY}"}, {"worker_id": "w"}),
        ("start", bearer, b"{not json"),
        ("start", bearer, b"[1, 2]"),
        ("start", bearer, b""),
        ("start", bearer, {"worker_id": ""}),
        ("start", bearer, {"worker_id": "w", "attempt": 0}),
        ("start", bearer, {"worker_id": "w\u0000"}),
        ("start", bearer, b"x" * (600 * 1024)),
        ("heartbeat", bearer, {"attempt": "1", "start_token": "t"}),
        ("heartbeat", bearer, {"attempt": 1}),
        ("complete", bearer, {"attempt": 1, "start_token": "t", "outcome": "MAYBE"}),
        ("complete", bearer, {"attempt": 1, "start_token": "t", "outcome": "FAILED"}),
    ]
    for verb, headers, body in cases:
        for rid in (run_id, "not-a-run", "../jobs"):
            kwargs = {"content": body} if isinstance(body, bytes) else {"json": body}
            a = fast.post(f"/v1/runs/{rid}/{verb}", headers=headers, **kwargs)
            b = slow.post(f"/v1/runs/{rid}/{verb}", headers=headers, **kwargs)
            assert _same(a, b) == _same(b, a), (verb, headers, body, rid, a.text, b.text)
            assert a.status_code >= 400
    # The run is still startable, and a second start is refused alike.
    assert fast.post(f"/v1/runs/{run_id}/start", headers=bearer, json={"worker_id": "w"}).is_success
    a = fast.post(f"/v1/runs/{run_id}/start", headers=bearer, json={"worker_id": "w"})
    b = slow.post(f"/v1/runs/{run_id}/start", headers=bearer, json={"worker_id": "w"})
    assert _same(a, b) == _same(b, a) and a.json()["code"] == "ALREADY_STARTED"
    assert slow.post(f"/v1/runs/{other}/start", headers=bearer, json={"worker_id": "w"}).is_success


def test_fastpath__rate_limited__429_with_retry_after_alike(both):
    fast, slow, key = both
    bearer = {"Authorization": f"Bearer {key}"}
    for client in (fast, slow):
        answers = [client.post("/v1/runs/x/heartbeat", headers=bearer, json={}) for _ in range(60)]
        limited = [r for r in answers if r.status_code == 429]
        assert limited, [r.status_code for r in answers]
        assert limited[0].json()["code"] == "RATE_LIMITED"
        assert limited[0].headers["Retry-After"]


def test_fastpath__openapi_and_metrics_labels__unchanged(both):
    fast, slow, key = both
    assert fast.get("/openapi.json").json() == slow.get("/openapi.json").json()
    fast.post("/v1/runs/nope/start", headers={"Authorization": f"Bearer {key}"}, json={})
    text = fast.get("/metrics").text
    assert 'route="/v1/runs/{run_id}/start"' in text


def _authed(client: httpx.Client, key: str) -> httpx.Client:
    client.headers["Authorization"] = f"Bearer {key}"
    return client


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def _requests_counted(base: str, route: str) -> float:
    total = 0.0
    for line in httpx.get(f"{base}/metrics", timeout=5).text.splitlines():
        if line.startswith("cronwheel_http_requests_total{") and f'route="{route}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_serve_gateway__two_workers__metrics_merged_worker_restarted_sigterm_stops_all(
    database_url, kafka_bootstrap, topic_prefix
):
    import signal
    import subprocess
    import sys

    from tests.support.wait import wait_for

    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    env = {
        **os.environ,
        "DATABASE_URL": database_url,
        "KAFKA_BOOTSTRAP": kafka_bootstrap,
        "CRONWHEEL_TOPIC_PREFIX": topic_prefix,
        "CRONWHEEL_HTTP_ADDR": f"127.0.0.1:{port}",
        "CRONWHEEL_OPERATOR_KEY": OPERATOR_KEY,
        "CRONWHEEL_GATEWAY_WORKERS": "2",
        "CRONWHEEL_LOG_LEVEL": "WARNING",
    }
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "services.entrypoints", "serve", "gateway"], env=env
    )
    try:

        def healthy() -> bool:
            try:
                return httpx.get(f"{base}/healthz", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(lambda: len(_children(proc.pid)) == 2 and healthy(), 60, 0.1, "two workers")
        before = _requests_counted(base, "/healthz")
        for _ in range(4):  # new connections: whichever worker accepts each
            with httpx.Client(base_url=base, timeout=5) as c:
                for _ in range(10):
                    assert c.get("/healthz").status_code == 200
        assert _requests_counted(base, "/healthz") - before == 40  # every worker's, once

        first = _children(proc.pid)
        os.kill(first[0], signal.SIGKILL)
        wait_for(
            lambda: len(k := _children(proc.pid)) == 2 and first[0] not in k and healthy(),
            60,
            0.1,
            "the killed worker replaced",
        )
        workers = _children(proc.pid)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        wait_for(lambda: not any(os.path.exists(f"/proc/{w}") for w in workers), 30, 0.1, "exit")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)


def test_start_and_complete__idempotency_key__replayed_in_pipeline_mode(gateway):
    client, _ = gateway
    run_id = new_run(client)
    key = {"Idempotency-Key": "start-once"}
    first = client.post(f"/v1/runs/{run_id}/start", json={"worker_id": "w"}, headers=key)
    again = client.post(f"/v1/runs/{run_id}/start", json={"worker_id": "w"}, headers=key)
    assert first.status_code == again.status_code == 200
    assert again.json() == first.json() and again.headers["Idempotent-Replayed"] == "true"
    fence = {"attempt": 1, "start_token": first.json()["start_token"], "outcome": "FAILED"}
    bad = client.post(
        f"/v1/runs/{run_id}/complete",
        json={**fence, "start_token": "x"},
        headers={"Idempotency-Key": "c"},
    )
    assert bad.status_code == 409 and bad.json()["code"] == "STALE_ATTEMPT"
    done = client.post(f"/v1/runs/{run_id}/complete", json=fence, headers={"Idempotency-Key": "d"})
    assert done.json()["state"] == "RETRY_WAIT"
