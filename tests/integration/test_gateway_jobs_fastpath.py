"""POST /v1/jobs and /v1/jobs/batch through the gateway's fast path
(services/gateway/fastpath.py) against the same routes through FastAPI: two
gateways on one database, one with the fast path and one without, asked the
same things and compared field by field. A spy behind the fast path records
what reached FastAPI, so a comparison cannot pass by both answers coming from
FastAPI."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import httpx
import psycopg
import pytest
from starlette.middleware import Middleware

from cronwheel.core.ssrf import allowed_networks
from cronwheel.kafka import Topics
from services.gateway import fastpath
from services.gateway.app import create_app
from tests.support.gateway import served

pytestmark = pytest.mark.integration

OPERATOR_KEY = "cwop_jobs_fastpath_operator"
OPERATOR = {"Authorization": f"Bearer {OPERATOR_KEY}"}
JOB = {
    "name": "nightly",
    "schedule": {"cron": "30 2 * * *", "timezone": "Europe/Berlin"},
    "target": {"type": "queue", "queue": "billing"},
    "payload": {"hello": "world"},
}
WEBHOOK_JOB = {**JOB, "name": "hook", "target": {"type": "webhook", "url": "http://127.0.0.1:9/h"}}
# What differs between two creations of the same body.
PER_CREATION = (
    "job_id",
    "created_at",
    "updated_at",
    "last_instant",  # the anchor: when it was created
    "signing_secret",
    "signing_secret_ids",
)
# Headers an answer carries that a client may act on.
HEADERS = ("content-type", "www-authenticate", "retry-after", "allow", "idempotent-replayed")


class Spy:
    """Innermost middleware: the (method, path) of every request that reached
    FastAPI's own exception handling and routing."""

    def __init__(self, app, seen: list):
        self.app = app
        self.seen = seen

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            self.seen.append((scope["method"], scope["path"]))
        await self.app(scope, receive, send)


class Pair:
    """A client of the gateway with the fast path (`fast`), one of the gateway
    without (`slow`), what reached FastAPI in each, and a tenant's key."""

    def __init__(self, fast: httpx.Client, slow: httpx.Client, reached: dict[str, list]):
        self.fast, self.slow, self.reached = fast, slow, reached
        r = fast.post("/v1/tenants", json={"name": "acme"}, headers=OPERATOR)
        assert r.status_code == 201, r.text
        self.tenant_id = r.json()["tenant_id"]
        self.bearer = {"Authorization": f"Bearer {r.json()['api_key']}"}

    def both(self, method: str, path: str, **kwargs) -> tuple[httpx.Response, httpx.Response]:
        """The same request to each gateway: (fast's answer, slow's answer)."""
        return (
            self.fast.request(method, path, **copy.deepcopy(kwargs)),
            self.slow.request(method, path, **copy.deepcopy(kwargs)),
        )


@contextmanager
def pair(database_url, kafka_bootstrap, topic_prefix, **settings) -> Iterator[Pair]:
    reached: dict[str, list] = {"fast": [], "slow": []}
    with ExitStack() as stack:
        clients = {}
        for name, fast in (("fast", True), ("slow", False)):
            app = create_app(
                database_url,
                Topics(topic_prefix),
                kafka_bootstrap,
                OPERATOR_KEY,
                jobs_fastpath=fast,
                webhook_allow=allowed_networks("127.0.0.0/8"),
                **settings,
            )
            app.user_middleware.append(Middleware(Spy, seen=reached[name]))
            clients[name] = stack.enter_context(served(app))
        yield Pair(clients["fast"], clients["slow"], reached)


@pytest.fixture
def gateways(database_url, kafka_bootstrap, topic_prefix) -> Iterator[Pair]:
    with pair(database_url, kafka_bootstrap, topic_prefix) as p:
        yield p


def answer(r: httpx.Response) -> tuple:
    """Status, body (without what differs between two creations) and headers."""
    body = r.json() if r.content else None
    return r.status_code, _strip(body), {h: r.headers.get(h) for h in HEADERS}


def _strip(body):
    if isinstance(body, dict):
        return {k: _strip(v) for k, v in body.items() if k not in PER_CREATION}
    if isinstance(body, list):
        return [_strip(v) for v in body]
    return body


def assert_alike(a: httpx.Response, b: httpx.Response, what) -> None:
    assert answer(a) == answer(b), (what, a.text, b.text)


def jobs_written(database_url) -> int:
    with psycopg.connect(database_url) as conn:
        return conn.execute("SELECT count(*) FROM jobs").fetchone()[0]


def test_create__refusals__same_problems_as_fastapi_and_nothing_written(gateways, database_url):
    g = gateways
    big_payload = {**JOB, "payload": {"blob": "x" * (300 * 1024)}}  # over 256 KiB, under 512
    cases = [
        ({}, JOB),  # no Authorization
        ({"Authorization": "Basic abc"}, JOB),
        ({"Authorization": "Bearer"}, JOB),
        ({"Authorization": "Bearer cw_unknown"}, JOB),
        (OPERATOR, JOB),
        (OPERATOR, b"{not json"),
        (g.bearer, b"{not json"),
        (g.bearer, b'{"name": NaN}'),
        (g.bearer, b'{"name": 1e999}'),
        (g.bearer, b"[1, 2]"),
        (g.bearer, b"null"),
        (g.bearer, b""),
        (g.bearer, b'{"name": "\\ud800"}'),
        (g.bearer, b"x" * (600 * 1024)),
        (g.bearer, {**JOB, "name": "a\u0000b"}),
        (g.bearer, {**JOB, "name": ""}),
        (g.bearer, {"name": "x"}),
        (g.bearer, {**JOB, "surprise": 1}),
        (g.bearer, {**JOB, "schedule": {"cron": "61 * * * *", "timezone": "UTC"}}),
        (g.bearer, {**JOB, "schedule": {"cron": "* * * * *", "timezone": "Mars/Olympus"}}),
        (g.bearer, {**JOB, "schedule": {"every_ms": 0}}),
        (g.bearer, {**JOB, "target": {"type": "queue"}}),
        (g.bearer, {**JOB, "target": {"type": "webhook", "url": "http://10.1.2.3/x"}}),
        (g.bearer, {**JOB, "priority": "critical"}),  # not entitled: 403
        (g.bearer, {**JOB, "retry": {"max_attempts": -1}}),
        (g.bearer, {**JOB, "timeout_ms": 10**30}),
        (g.bearer, big_payload),
        ({**g.bearer, "Idempotency-Key": ""}, JOB),
        ({**g.bearer, "Idempotency-Key": "a b"}, JOB),
        ({**g.bearer, "Idempotency-Key": "k" * 256}, JOB),
    ]
    for headers, body in cases:
        kwargs = {"content": body} if isinstance(body, bytes) else {"json": body}
        a, b = g.both("POST", "/v1/jobs", headers=headers, **kwargs)
        assert_alike(a, b, (headers, str(body)[:80]))
        assert 400 <= a.status_code < 500, a.text
        assert a.headers["content-type"] == "application/problem+json"
        if a.status_code == 422:
            assert a.json()["field"], a.text
    assert jobs_written(database_url) == 0
    assert ("POST", "/v1/jobs") not in g.reached["fast"]
    assert g.reached["slow"].count(("POST", "/v1/jobs")) == len(cases)


def test_create__valid_jobs__same_job_as_fastapi(gateways, database_url):
    g = gateways
    bodies = [
        JOB,
        {**JOB, "schedule": {"cron": "0 0 * * * *", "timezone": "UTC"}, "priority": "high"},
        {**JOB, "schedule": {"at": "2099-01-01T00:00:00.000Z"}, "payload": [1, "two", None]},
        {
            **JOB,
            "retry": {"max_attempts": 5, "initial_backoff_ms": 100},
            "timeout_ms": 30_000,
            "lease_ms": 10_000,
        },
        WEBHOOK_JOB,
        {**JOB, "target": {"type": "managed", "command": ["echo", "hi"]}},
    ]
    for body in bodies:
        a, b = g.both("POST", "/v1/jobs", headers=g.bearer, json=body)
        assert a.status_code == 201, a.text
        assert_alike(a, b, body)
        assert a.json()["job_id"] != b.json()["job_id"]
        # What was stored reads back alike, whichever gateway reads it.
        got = [
            g.slow.get(f"/v1/jobs/{r.json()['job_id']}", headers=g.bearer).json() for r in (a, b)
        ]
        assert _strip(got[0]) == _strip(got[1])
    assert jobs_written(database_url) == 2 * len(bodies)
    with psycopg.connect(database_url) as conn:
        timers = conn.execute("SELECT count(*) FROM timers WHERE kind = 'job'").fetchone()[0]
    assert timers == 2 * len(bodies)
    assert ("POST", "/v1/jobs") not in g.reached["fast"]


def test_create__webhook_job__signing_secret_shown_once_alike(gateways):
    g = gateways
    a, b = g.both("POST", "/v1/jobs", headers=g.bearer, json=WEBHOOK_JOB)
    assert a.status_code == b.status_code == 201, (a.text, b.text)
    for r in (a, b):
        assert r.json()["signing_secret"]["secret"].startswith("whsec_")
        assert len(r.json()["signing_secret_ids"]) == 1
        shown = g.fast.get(f"/v1/jobs/{r.json()['job_id']}", headers=g.bearer).json()
        assert "signing_secret" not in shown and len(shown["signing_secret_ids"]) == 1


def test_create__idempotency_key__replayed_by_either_path(gateways, database_url):
    g = gateways
    for first, then, key in ((g.fast, g.slow, "fast-first"), (g.slow, g.fast, "slow-first")):
        headers = {**g.bearer, "Idempotency-Key": key}
        made = first.post("/v1/jobs", json=JOB, headers=headers)
        assert made.status_code == 201, made.text
        for client in (first, then):
            again = client.post("/v1/jobs", json=JOB, headers=headers)
            assert again.status_code == 201 and again.json() == made.json()
            assert again.headers["Idempotent-Replayed"] == "true"
        # The key with another body is refused alike: the fingerprints agree.
        other = {**JOB, "name": "other"}
        a, b = g.both("POST", "/v1/jobs", json=other, headers=headers)
        assert_alike(a, b, key)
        assert a.status_code == 422 and a.json()["code"] == "IDEMPOTENCY_KEY_REUSED"
        assert a.json()["field"] == "Idempotency-Key"
    # A refusal is recorded and replayed too, by either path.
    headers = {**g.bearer, "Idempotency-Key": "bad-first"}
    refused = g.fast.post("/v1/jobs", json={"name": "x"}, headers=headers)
    replayed = g.slow.post("/v1/jobs", json={"name": "x"}, headers=headers)
    assert refused.status_code == replayed.status_code == 422
    assert replayed.json() == refused.json()
    assert replayed.headers["Idempotent-Replayed"] == "true"
    assert jobs_written(database_url) == 2


def test_create__revoked_key__401_alike_and_nothing_written(gateways, database_url):
    g = gateways
    with psycopg.connect(database_url) as conn:
        conn.execute("UPDATE api_keys SET revoked_at = now()")
    a, b = g.both("POST", "/v1/jobs", json=JOB, headers=g.bearer)
    assert_alike(a, b, "revoked")
    assert a.status_code == 401 and a.json()["code"] == "UNAUTHENTICATED"
    a, b = g.both("POST", "/v1/jobs/batch", json={"jobs": [JOB]}, headers=g.bearer)
    assert_alike(a, b, "revoked batch")
    assert a.status_code == 401
    assert jobs_written(database_url) == 0


def test_batch__envelopes_and_mixed_jobs__same_answers_as_fastapi(gateways, database_url):
    g = gateways
    mixed = [
        JOB,
        {**JOB, "schedule": {"cron": "61 * * * *", "timezone": "UTC"}},
        {"name": 5},
        7,
        {**JOB, "priority": "critical"},
        {**WEBHOOK_JOB, "target": {"type": "webhook", "url": "http://10.1.2.3/x"}},
        WEBHOOK_JOB,
    ]
    cases = [
        ({}, {"jobs": [JOB]}),
        (OPERATOR, {"jobs": [JOB]}),
        (g.bearer, b"{not json"),
        (g.bearer, b"[]"),
        (g.bearer, b""),
        (g.bearer, {}),
        (g.bearer, {"jobs": []}),
        (g.bearer, {"jobs": {"name": "x"}}),
        (g.bearer, {"jobs": [JOB], "extra": 1}),
        (g.bearer, {"jobs": [JOB] * 1001}),
        (g.bearer, {"jobs": mixed}),
        (g.bearer, b" " * (9 * 1024 * 1024)),
    ]
    for headers, body in cases:
        kwargs = {"content": body} if isinstance(body, bytes) else {"json": body}
        a, b = g.both("POST", "/v1/jobs/batch", headers=headers, **kwargs)
        assert_alike(a, b, (headers, str(body)[:80]))
    assert a.status_code == 413  # the last case: over 8 MiB
    a, b = g.both("POST", "/v1/jobs/batch", headers=g.bearer, json={"jobs": mixed})
    assert [x["status"] for x in a.json()["results"]] == [201, 422, 422, 422, 403, 422, 201]
    assert jobs_written(database_url) == 2 * 2 * 2  # two good jobs, two calls, two gateways
    assert ("POST", "/v1/jobs/batch") not in g.reached["fast"]


def test_batch__idempotency_key__replayed_by_either_path(gateways, database_url):
    g = gateways
    headers = {**g.bearer, "Idempotency-Key": "batch-1"}
    body = {"jobs": [{**JOB, "name": f"j{i}"} for i in range(3)]}
    first = g.fast.post("/v1/jobs/batch", json=body, headers=headers)
    assert first.status_code == 200, first.text
    a, b = g.both("POST", "/v1/jobs/batch", json=body, headers=headers)
    assert a.json() == b.json() == first.json()
    assert a.headers["Idempotent-Replayed"] == b.headers["Idempotent-Replayed"] == "true"
    assert jobs_written(database_url) == 3


def test_create__rate_limited__429_alike(database_url, kafka_bootstrap, topic_prefix):
    with pair(database_url, kafka_bootstrap, topic_prefix, rate_per_s=0.01, burst=3) as g:
        # The tenant's creation took one of the operator key's tokens, not the tenant's.
        answers = [
            g.both("POST", "/v1/jobs", json={"name": "x"}, headers=g.bearer) for _ in range(4)
        ]
    for a, b in answers:
        assert_alike(a, b, "rate")
    assert [a.status_code for a, _b in answers] == [422, 422, 422, 429]
    limited = answers[-1][0]
    assert limited.json()["code"] == "RATE_LIMITED" and int(limited.headers["Retry-After"]) >= 1


def test_other_paths_and_methods__left_to_fastapi(gateways):
    g = gateways
    requests = [
        ("POST", "/v1/jobs/"),
        ("POST", "/v1/jobs/batch/"),
        ("POST", "/v1/jobs/batch/x"),
        ("PUT", "/v1/jobs"),
        ("GET", "/v1/jobs/batch"),
        ("GET", "/v1/jobs"),
    ]
    for method, path in requests:
        a, b = g.both(method, path, headers=g.bearer, json=JOB, follow_redirects=False)
        assert a.status_code == b.status_code, (method, path, a.text, b.text)
        if a.headers.get("content-type", "").endswith("json") and method != "GET":
            assert_alike(a, b, (method, path))
        assert (method, path) in g.reached["fast"]


def test_openapi_and_metrics_labels__unchanged(gateways):
    g = gateways
    documented = g.fast.get("/openapi.json").json()
    assert documented == g.slow.get("/openapi.json").json()
    for shortcut in fastpath.WORKER + fastpath.JOBS:
        assert "post" in documented["paths"][shortcut.path], shortcut.path
    g.fast.post("/v1/jobs", json=JOB, headers=g.bearer)
    g.fast.post("/v1/jobs/batch", json={"jobs": [JOB]}, headers=g.bearer)
    g.fast.post("/v1/runs/nope/start", json={"worker_id": "w"}, headers=g.bearer)
    assert [seen for seen in g.reached["fast"] if seen[0] == "POST"] == [("POST", "/v1/tenants")]
    text = g.fast.get("/metrics").text
    assert 'route="/v1/jobs",status="201"' in text
    assert 'route="/v1/jobs/batch",status="200"' in text
