"""Webhook targets end to end, in-process: job -> trigger -> outbox -> relay ->
dispatcher -> webhook topic -> the webhook service -> a real local HTTP
receiver -> CompleteRun. Every request the receiver gets is checked with the
`standardwebhooks` package."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import psycopg
import pytest
from confluent_kafka import TopicPartition
from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError

from cronwheel import kafka
from cronwheel.core.clock import now_ms, to_ms
from cronwheel.core.ids import run_id_for_trigger
from cronwheel.kafka import Topics
from cronwheel.store import webhooks
from cronwheel.store.jobs import Jobs, create_tenant
from cronwheel.store.lifecycle import Lifecycle
from services.dispatcher.service import Dispatcher
from services.relay.service import Relay
from services.timer.service import TimerService
from services.webhook import http
from services.webhook.breaker import State
from services.webhook.guard import Guard
from services.webhook.limits import endpoint_of
from services.webhook.service import Settings, WebhookService
from tests.support.kafka import drain
from tests.support.running import running
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration

LOOPBACK = [ipaddress.ip_network("127.0.0.0/8")]


# -- a real HTTP receiver -------------------------------------------------------


@dataclass
class Reply:
    status: int = 200
    headers: dict = field(default_factory=dict)
    body: bytes = b"ok"
    hold: threading.Event | None = None  # answer only once this is set (a slow endpoint)


@dataclass
class Got:
    path: str
    method: str
    headers: dict
    body: bytes
    at: float


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address) -> None:
        """A client that gave up (a timeout test) is expected; anything else is shown."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class Receiver:
    """A threaded HTTP/1.1 server on 127.0.0.1 that answers each path as the test
    says (a list of replies is used in turn, its last one repeating) and records
    every request."""

    def __init__(self) -> None:
        self.routes: dict[str, list[Reply]] = {}
        self.got: list[Got] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            timeout = 60  # an idle keep-alive connection ends its thread (after the test)

            def _any(self) -> None:
                size = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(size) if size else b""
                reply = receiver._record(self, body)
                if reply.hold is not None:
                    reply.hold.wait(30)
                self.send_response(reply.status)
                for k, v in reply.headers.items():
                    self.send_header(k, v)
                self.send_header("content-length", str(len(reply.body)))
                self.end_headers()
                self.wfile.write(reply.body)

            do_POST = do_PUT = do_GET = do_DELETE = do_PATCH = _any

            def log_message(self, *args) -> None:
                pass

        self.server = _Server(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def _record(self, handler, body: bytes) -> Reply:
        path = handler.path
        with self.lock:
            headers = {k.lower(): v for k, v in handler.headers.items()}
            self.got.append(Got(path, handler.command, headers, body, time.monotonic()))
            replies = self.routes.get(path) or [Reply()]
            return replies.pop(0) if len(replies) > 1 else replies[0]

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def answer(self, path: str, *replies: Reply) -> None:
        with self.lock:
            self.routes[path] = list(replies)

    def requests(self, path: str | None = None) -> list[Got]:
        with self.lock:
            return [g for g in self.got if path is None or g.path == path]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# -- fixtures -------------------------------------------------------------------


@pytest.fixture
def conn(database_url):
    with psycopg.connect(database_url, autocommit=True) as c:
        yield c


@pytest.fixture
def topics(topic_prefix) -> Topics:
    return Topics(topic_prefix)


@pytest.fixture
def tenant(conn, topics, kafka_bootstrap) -> dict:
    t = create_tenant(conn, "acme")
    # Created up front so the consumers' pattern subscriptions find them at once.
    kafka.ensure_topics(
        [topics.runs(t["tenant_id"]), topics.webhook(t["tenant_id"])],
        partitions=2,
        bootstrap=kafka_bootstrap,
        principal="dispatcher",
    )
    return t


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


@contextlib.contextmanager
def platform(database_url, kafka_bootstrap, topics, allow=LOOPBACK, **settings):
    """Timer, relay, dispatcher and the webhook service under test, in-process."""
    service = WebhookService(
        database_url,
        kafka_bootstrap,
        topics,
        instance="t1",
        allow=allow,
        settings=Settings(**settings),
    )
    with (
        running(Relay(database_url, kafka_bootstrap, idle_ms=50)),
        running(Dispatcher(database_url, kafka_bootstrap, topics)),
        running(TimerService(database_url, topics, lease_ttl_ms=5000, idle_ms=200, ahead_ms=0)),
        running(service),
    ):
        yield service


def webhook_job(
    conn, topics, tenant, url, *, retry=None, lease_ms=None, **target
) -> tuple[dict, str]:
    """A webhook job (first scheduled fire a day away) and its signing secret."""
    body = {
        "name": f"hook-{time.monotonic_ns()}",
        "schedule": {"every_ms": 86_400_000},
        "target": {"type": "webhook", "url": url, **target},
        "payload": {"hello": "world"},
    }
    if retry:
        body["retry"] = retry
    if lease_ms:
        body["lease_ms"] = lease_ms
    job = Jobs(topics).create(conn, tenant, body, now_ms())
    return job, job["signing_secret"]["secret"]  # issued with the job, shown once


_last_trigger = [0]


def trigger(conn, topics, tenant, job) -> str:
    """A manual run now; each call a millisecond of its own (trigger run ids are
    per job and millisecond)."""
    at = _last_trigger[0] = max(now_ms(), _last_trigger[0] + 1)
    return Jobs(topics).trigger(conn, tenant, job["job_id"], at)["run_id"]


def run_row(conn, run_id) -> dict:
    cur = conn.execute("SELECT * FROM runs_daily WHERE run_id = %s", [run_id])
    return dict(zip([c.name for c in cur.description], cur.fetchone(), strict=True))


def state(conn, run_id) -> str:
    return conn.execute("SELECT state FROM runs_daily WHERE run_id = %s", [run_id]).fetchone()[0]


def states(conn, run_ids) -> dict[str, str]:
    rows = conn.execute(
        "SELECT run_id, state FROM runs_daily WHERE run_id = ANY(%s)", [list(run_ids)]
    ).fetchall()
    return dict(rows)


def verify(got: Got, *secrets: str) -> None:
    """The request verifies with each of `secrets` (Standard Webhooks)."""
    for secret in secrets:
        Webhook(secret).verify(got.body, got.headers, json_parse=False)


# -- tests ----------------------------------------------------------------------


def test_delivery__signed_standard_webhook_with_fencing_headers__run_succeeds_with_result(
    database_url, kafka_bootstrap, topics, conn, tenant, receiver
):
    receiver.answer("/hook", Reply(200, {"content-type": "text/plain"}, b"x" * 10_000))
    job, secret = webhook_job(
        conn, topics, tenant, receiver.url("/hook"),
        headers={"x-team": "blue", "webhook-id": "forged", "Cronwheel-Attempt": "99"},
    )  # fmt: skip
    with platform(database_url, kafka_bootstrap, topics) as service:
        run_id = trigger(conn, topics, tenant, job)
        wait_for(lambda: state(conn, run_id) == "SUCCEEDED", 20, what="the run to succeed")
    [got] = receiver.requests("/hook")
    verify(got, secret)
    with pytest.raises(WebhookVerificationError):
        verify(got, webhooks.new_secret())
    run = run_row(conn, run_id)
    assert got.method == "POST"
    assert json.loads(got.body) == {"hello": "world"}
    assert got.headers["webhook-id"] == run_id
    assert got.headers["cronwheel-run-id"] == run_id
    assert got.headers["cronwheel-attempt"] == "1"
    assert got.headers["traceparent"] == f"00-{run_id}-{1:016x}-00"
    assert got.headers["cronwheel-fencing-token"] == run["start_token"]
    assert got.headers["cronwheel-job-id"] == job["job_id"]
    assert got.headers["x-team"] == "blue"
    assert got.headers["content-type"] == "application/json"
    assert abs(int(got.headers["webhook-timestamp"]) - time.time()) < 60
    assert run["worker_id"] == service.worker_id == "webhook:t1"
    assert run["attempt"] == 1
    result = run["result"]
    assert result["status"] == 200
    assert result["headers"]["content-type"] == "text/plain"
    assert result["body"] == "x" * 4096 and result["body_truncated"] is True


def test_rotation__both_signatures_during_overlap__only_the_new_one_after__no_cookies(
    database_url, kafka_bootstrap, topics, conn, tenant, receiver
):
    # A cookie the endpoint sets is not sent back: the client is shared by tenants.
    receiver.answer("/hook", Reply(200, {"set-cookie": "session=tenant-a; Path=/"}))
    job, old = webhook_job(conn, topics, tenant, receiver.url("/hook"))
    rotated = webhooks.rotate_secret(conn, tenant["tenant_id"], job["job_id"], now_ms())
    new = rotated["secret"]
    with platform(database_url, kafka_bootstrap, topics):
        first = trigger(conn, topics, tenant, job)
        wait_for(lambda: state(conn, first) == "SUCCEEDED", 20, what="the first delivery")
        webhooks.rotate_secret(conn, tenant["tenant_id"], job["job_id"], now_ms(), overlap_ms=0)
        second = trigger(conn, topics, tenant, job)
        wait_for(lambda: state(conn, second) == "SUCCEEDED", 20, what="the second delivery")
    during, after = receiver.requests("/hook")
    assert during.headers["webhook-id"] == first
    assert len(during.headers["webhook-signature"].split(" ")) == 2
    verify(during, old)
    verify(during, new)
    assert len(after.headers["webhook-signature"].split(" ")) == 1
    assert "cookie" not in after.headers
    for retired in (old, new):  # a rotation with no overlap retires every old secret at once
        with pytest.raises(WebhookVerificationError):
            verify(after, retired)
    latest = webhooks.active_secrets(conn, job["job_id"], now_ms())
    verify(after, *latest)


def test_retry__503_with_retry_after__next_attempt_keeps_webhook_id_and_waits(
    database_url, kafka_bootstrap, topics, conn, tenant, receiver
):
    receiver.answer("/flaky", Reply(503, {"retry-after": "2"}, b"busy"), Reply(200))
    job, secret = webhook_job(
        conn, topics, tenant, receiver.url("/flaky"),
        retry={"max_attempts": 3, "initial_backoff_ms": 100, "max_backoff_ms": 100},
    )  # fmt: skip
    with platform(database_url, kafka_bootstrap, topics):
        run_id = trigger(conn, topics, tenant, job)
        wait_for(lambda: state(conn, run_id) == "SUCCEEDED", 30, what="the retry to succeed")
    first, second = receiver.requests("/flaky")
    for got in (first, second):
        verify(got, secret)
        assert got.headers["webhook-id"] == run_id
    assert (first.headers["cronwheel-attempt"], second.headers["cronwheel-attempt"]) == ("1", "2")
    assert first.headers["cronwheel-fencing-token"] != second.headers["cronwheel-fencing-token"]
    # The backoff was 100 ms; Retry-After asked for 2 s, and got it.
    assert second.at - first.at >= 1.9
    attempts = conn.execute(
        "SELECT attempt, outcome, error FROM run_attempts_daily WHERE run_id = %s ORDER BY attempt",
        [run_id],
    ).fetchall()
    assert attempts == [(1, "FAILED", "HTTP 503"), (2, "SUCCEEDED", None)]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_outcomes__classification_table__redirect_not_followed(
    database_url, kafka_bootstrap, topics, conn, tenant, receiver
):
    hold = threading.Event()
    cases = {
        "/ok": (Reply(200), "SUCCEEDED"),
        "/created": (Reply(201), "SUCCEEDED"),
        "/moved": (Reply(302, {"location": "/landing"}), "FAILED"),
        "/gone": (Reply(404), "FAILED"),
        "/unauthorized": (Reply(401), "FAILED"),
        "/request-timeout": (Reply(408), "RETRY_WAIT"),
        "/slow-down": (Reply(429, {"retry-after": "1"}), "RETRY_WAIT"),
        "/boom": (Reply(500), "RETRY_WAIT"),
        "/unavailable": (Reply(503), "RETRY_WAIT"),
        "/too-slow": (Reply(200, hold=hold), "RETRY_WAIT"),
    }
    # Attempts left and a long backoff: a retryable failure waits in RETRY_WAIT.
    retry = {"max_attempts": 2, "initial_backoff_ms": 600_000, "max_backoff_ms": 600_000}
    runs = {}
    for path, (reply, _want) in cases.items():
        receiver.answer(path, reply)
        timeout_ms = 500 if path == "/too-slow" else 10_000
        job, _secret = webhook_job(
            conn, topics, tenant, receiver.url(path), retry=retry, timeout_ms=timeout_ms
        )
        runs[path] = trigger(conn, topics, tenant, job)
    refused_job, _ = webhook_job(
        conn, topics, tenant, f"http://127.0.0.1:{_closed_port()}/x", retry=retry
    )
    runs["connection refused"] = trigger(conn, topics, tenant, refused_job)
    cases["connection refused"] = (None, "RETRY_WAIT")
    want = {path: expected for path, (_r, expected) in cases.items()}
    try:
        with platform(database_url, kafka_bootstrap, topics, breaker_failures=100):
            wait_for(
                lambda: {p: state(conn, r) for p, r in runs.items()} == want,
                30,
                what="every run to reach its state",
            )
    finally:
        hold.set()
    assert not receiver.requests("/landing"), "a redirect was followed"
    errors = dict(
        conn.execute(
            "SELECT run_id, error FROM runs_daily WHERE run_id = ANY(%s)", [list(runs.values())]
        ).fetchall()
    )
    assert errors[runs["/moved"]] == "HTTP 302: redirect not followed"
    assert errors[runs["/gone"]] == "HTTP 404"
    assert "timed out" in errors[runs["/too-slow"]]
    assert "connection failed" in errors[runs["connection refused"]]
    slow_down = run_row(conn, runs["/slow-down"])["result"]
    assert slow_down["status"] == 429 and slow_down["retry_after_ms"] == 1000
    for got in receiver.requests():
        assert got.headers["webhook-id"] == runs[got.path]


def test_refused__host_resolving_to_loopback_or_no_secret__failed_without_request_or_retry(
    database_url, kafka_bootstrap, topics, conn, tenant, receiver
):
    retry = {"max_attempts": 3, "initial_backoff_ms": 100, "max_backoff_ms": 100}
    job, _secret = webhook_job(
        conn, topics, tenant, f"http://localhost:{receiver.port}/hook", retry=retry
    )
    unsigned = Jobs(topics).create(
        conn,
        tenant,
        {
            "name": "unsigned",
            "schedule": {"every_ms": 86_400_000},
            "target": {"type": "webhook", "url": receiver.url("/unsigned")},
            "retry": retry,
        },
        now_ms(),
    )
    # A job whose secret is gone (e.g. removed by hand): it must never go out unsigned.
    conn.execute("DELETE FROM webhook_secrets WHERE owner_id = %s", [unsigned["job_id"]])
    # The store does not check destinations (the gateway does, at creation); a
    # name can resolve elsewhere by delivery time, so the service checks again.
    with platform(database_url, kafka_bootstrap, topics, allow=[]):
        run_id = trigger(conn, topics, tenant, job)
        unsigned_run = trigger(conn, topics, tenant, unsigned)
        wait_for(
            lambda: (
                states(conn, [run_id, unsigned_run]) == {run_id: "FAILED", unsigned_run: "FAILED"}
            ),
            20,
            what="both runs to be refused",
        )
    run = run_row(conn, run_id)
    assert run["attempt"] == 1, "a refused destination is not retried"
    assert run["error"].startswith("destination refused") and "loopback" in run["error"]
    other = run_row(conn, unsigned_run)
    assert other["attempt"] == 1 and other["error"].startswith("no signing secret")
    assert receiver.requests() == []


def test_limits__slow_endpoint_holds_only_its_own_slots__heartbeats_keep_its_lease(
    database_url, kafka_bootstrap, topics, conn, tenant, receiver
):
    other = Receiver()
    hold = threading.Event()
    receiver.answer("/slow", Reply(200, hold=hold))
    slow_job, slow_secret = webhook_job(
        conn, topics, tenant, receiver.url("/slow"), timeout_ms=20_000, lease_ms=1000
    )
    fast_job, fast_secret = webhook_job(conn, topics, tenant, other.url("/fast"))
    try:
        with platform(database_url, kafka_bootstrap, topics, per_endpoint=2):
            slow = [trigger(conn, topics, tenant, slow_job) for _ in range(4)]
            wait_for(lambda: len(receiver.requests("/slow")) == 2, 20, what="2 slow requests")
            fast = [trigger(conn, topics, tenant, fast_job) for _ in range(5)]
            wait_for(
                lambda: set(states(conn, fast).values()) == {"SUCCEEDED"},
                20,
                what="the fast endpoint's runs, while the slow one holds its slots",
            )
            held = states(conn, slow)
            assert sorted(held.values()) == ["PENDING", "PENDING", "RUNNING", "RUNNING"]
            assert len(receiver.requests("/slow")) == 2, "the per-endpoint limit was exceeded"
            # The lease is 1 s and the timer service is running: heartbeats keep
            # the held attempts alive.
            running_ids = [r for r, s in held.items() if s == "RUNNING"]

            def extended():
                rows = conn.execute(
                    "SELECT started_at, lease_expires_at FROM runs_daily WHERE run_id = ANY(%s)",
                    [running_ids],
                ).fetchall()
                return all(
                    lease and to_ms(lease) - to_ms(started) > 2000 for started, lease in rows
                )

            wait_for(extended, 10, what="heartbeats to extend the slow runs' leases")
            assert set(states(conn, running_ids).values()) == {"RUNNING"}
            hold.set()
            wait_for(
                lambda: set(states(conn, slow).values()) == {"SUCCEEDED"},
                20,
                what="the slow runs, once released",
            )
    finally:
        hold.set()
        other.close()
    attempts = conn.execute(
        "SELECT max(attempt) FROM runs_daily WHERE run_id = ANY(%s)", [slow]
    ).fetchone()[0]
    assert attempts == 1
    for got in receiver.requests("/slow"):
        verify(got, slow_secret)
    for got in other.requests("/fast"):
        verify(got, fast_secret)


def test_breaker__opens_after_consecutive_failures__runs_wait_unstarted__probe_recovers(
    database_url, kafka_bootstrap, topics, conn, tenant, receiver
):
    receiver.answer("/down", Reply(503))
    retry = {"max_attempts": 2, "initial_backoff_ms": 600_000, "max_backoff_ms": 600_000}
    job, secret = webhook_job(conn, topics, tenant, receiver.url("/down"), retry=retry)
    endpoint = endpoint_of(receiver.url("/down"))
    settings = {"per_endpoint": 1, "breaker_failures": 3, "breaker_cooldown_ms": 2000}
    with platform(database_url, kafka_bootstrap, topics, **settings) as service:
        runs = [trigger(conn, topics, tenant, job) for _ in range(6)]

        def count(want: str) -> int:
            return sum(1 for s in states(conn, runs).values() if s == want)

        wait_for(lambda: count("RETRY_WAIT") == 3, 20, what="three failures")
        assert service.endpoints.state(endpoint) == State.OPEN
        assert count("PENDING") == 3, "runs behind an open breaker must wait, unstarted"
        unstarted = conn.execute(
            "SELECT count(*) FROM runs_daily r WHERE run_id = ANY(%s) AND NOT EXISTS"
            " (SELECT 1 FROM run_attempts_daily a WHERE a.run_id = r.run_id)",
            [runs],
        ).fetchone()[0]
        assert unstarted == 3, "waiting runs burnt no attempt"
        wait_for(lambda: len(receiver.requests()) == 4, 10, what="the half-open probe")
        receiver.answer("/down", Reply(200))  # the endpoint recovers
        wait_for(lambda: count("SUCCEEDED") == 2, 20, what="the next probe to close it")
        assert service.endpoints.state(endpoint) == State.CLOSED
    got = receiver.requests()
    assert len(got) == 6
    assert got[3].at - got[2].at >= 1.9, "the probe came before the cool-down"
    assert got[4].at - got[3].at >= 1.9, "the second probe came before the cool-down"
    for g in got:
        verify(g, secret)


def test_start__fails_other_than_a_refusal__record_dead_lettered_and_partition_moves_on(
    database_url, kafka_bootstrap, topics, conn, tenant, receiver
):
    """A StartRun that raises (a bug, data the statement cannot pass) must not
    hold back its partition's offsets: the record is set aside on the
    dead-letter topic, the run stays PENDING, the runs behind it go out."""
    receiver.answer("/hook", *[Reply(200)] * 4)
    job, _secret = webhook_job(conn, topics, tenant, receiver.url("/hook"))
    bad: set[str] = set()
    with platform(database_url, kafka_bootstrap, topics) as service:
        real = service._start_many

        def start_many(c, targets):
            if any(t.run_id in bad for t in targets):
                raise psycopg.errors.DataError("injected: this run cannot start")
            return real(c, targets)

        service._start_many = start_many
        at = _last_trigger[0] = max(now_ms(), _last_trigger[0] + 1)
        bad.add(run_id_for_trigger(job["job_id"], at))
        Jobs(topics).trigger(conn, tenant, job["job_id"], at)
        good = [trigger(conn, topics, tenant, job) for _ in range(3)]
        wait_for(
            lambda: set(states(conn, good).values()) == {"SUCCEEDED"}, 20,
            what="the runs behind it to succeed",
        )  # fmt: skip
        [(_t, key, name, letter, _m)] = drain(kafka_bootstrap, topics.dead_letter, want=1)
        assert (name, key) == ("DeadLetter", next(iter(bad)).encode())
        assert letter["consumer"] == "webhook" and letter["source_topic"] == topics.webhook(
            tenant["tenant_id"]
        )
        assert letter["reason"].startswith("StartRun failed: DataError: injected")
        probe = kafka.consumer(service.group_id, kafka_bootstrap, principal="webhook")
        part = TopicPartition(letter["source_topic"], letter["source_partition"])
        try:
            wait_for(
                lambda: probe.committed([part], timeout=5)[0].offset > letter["source_offset"],
                20, what="the committed offset to pass the set-aside record",
            )  # fmt: skip
        finally:
            probe.close()
    assert state(conn, next(iter(bad))) == "PENDING"
    assert len(receiver.requests("/hook")) == 3


def test_start__run_another_worker_holds__refused_in_pipeline_mode_connection_still_usable(
    database_url, topics, conn, tenant, receiver
):
    job, _secret = webhook_job(conn, topics, tenant, receiver.url("/hook"))
    run_id = trigger(conn, topics, tenant, job)
    [target] = webhooks.delivery_targets(conn, [run_id], now_ms()).values()
    Lifecycle(topics).start(conn, tenant["tenant_id"], run_id, "someone-else", now_ms())
    service = WebhookService(database_url, "unused:9092", topics, instance="t1", allow=[])
    with psycopg.connect(database_url, autocommit=True) as c:
        with c.pipeline():  # as the service's database threads call it
            assert service._start(c, target) == "already_started"
        with c.pipeline():
            assert service._start(c, target) == "already_started"
        assert c.execute("SELECT state FROM runs_daily WHERE run_id = %s", [run_id]).fetchone() == (
            "RUNNING",
        )


async def _exchange(serve, paths: list[str]) -> list[int]:
    """POST to each path in turn through the service's client, against `serve`
    (an asyncio connection handler) on a port of its own."""
    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = http.Client(Guard(LOOPBACK))
    try:
        return [
            (await client.request("POST", f"http://127.0.0.1:{port}{p}", {}, b"{}")).status
            for p in paths
        ]
    finally:
        client.close()
        server.close()
        await server.wait_closed()


async def _read_request(reader: asyncio.StreamReader) -> None:
    head = await reader.readuntil(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            await reader.readexactly(int(line.split(b":")[1]))


def test_transport__kept_alive_connection_dropped_by_the_server__request_goes_again_once():
    """The server answers the first request of a connection and drops the second
    without a word (as when its keep-alive timer fires as the request arrives):
    the client sends it again, once, on a new connection."""
    seen = []

    async def answer_once(reader, writer):
        try:
            await _read_request(reader)
            seen.append("answered")
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
            await writer.drain()
            await _read_request(reader)
            seen.append("dropped")
        except asyncio.IncompleteReadError:
            pass
        finally:
            writer.close()

    assert asyncio.run(_exchange(answer_once, ["/a", "/b"])) == [200, 200]
    assert seen == ["answered", "dropped", "answered"]

    async def drop(reader, writer):
        await _read_request(reader)
        writer.close()

    with pytest.raises(http.ReadError):  # a new connection is not tried twice
        asyncio.run(_exchange(drop, ["/a"]))
