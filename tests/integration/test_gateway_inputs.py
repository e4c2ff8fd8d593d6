"""Bad input: each row is a 4xx application/problem+json that names the field,
never a 5xx; webhook destinations are checked against SSRF at creation."""

from __future__ import annotations

import ipaddress
import json

import httpx
import pytest

from cronwheel.core.ssrf import allowed_networks, why_refused
from cronwheel.kafka import Topics
from services.gateway.app import create_app
from services.gateway.service import GatewayService
from tests.support.running import running

pytestmark = pytest.mark.integration

OPERATOR_KEY = "cwop_inputs_operator"
OP = {"Authorization": f"Bearer {OPERATOR_KEY}"}
JOB = {
    "name": "j",
    "schedule": {"cron": "*/5 * * * *", "timezone": "UTC"},
    "target": {"type": "queue", "queue": "q"},
}


def serve(database_url, kafka_bootstrap, topic_prefix, **kw):
    app = create_app(database_url, Topics(topic_prefix), kafka_bootstrap, OPERATOR_KEY, **kw)
    return app, running(GatewayService(app, "127.0.0.1", 0, "warning"))


@pytest.fixture
def client(database_url, kafka_bootstrap, topic_prefix):
    app, server = serve(database_url, kafka_bootstrap, topic_prefix, webhook_allow=[])
    try:
        with server as svc, httpx.Client(base_url=svc.url, timeout=10) as c:
            yield c
    finally:
        app.state.gateway.close()


@pytest.fixture
def ctx(client):
    key = client.post("/v1/tenants", json={"name": "acme"}, headers=OP).json()["api_key"]
    h = {"Authorization": f"Bearer {key}"}
    job = client.post("/v1/jobs", json=JOB, headers=h).json()["job_id"]
    run = client.post(f"/v1/jobs/{job}/trigger", headers=h).json()["run_id"]
    return {"h": h, "job": job, "run": run}


def job_with(**changes) -> dict:
    return {**JOB, **changes}


def webhook(url: str) -> dict:
    return job_with(target={"type": "webhook", "url": url})


# (method, path, body: dict | bytes | None, status, code, field); {job} {run} filled in.
CASES = [
    ("POST", "/v1/jobs", b'{"name":', 400, "MALFORMED_JSON", "body"),
    ("POST", "/v1/jobs", b'{"name": NaN}', 400, "MALFORMED_JSON", "body"),
    ("POST", "/v1/jobs", b'{"n": 1e400}', 400, "MALFORMED_JSON", "body"),
    ("POST", "/v1/jobs", b'{"n": ' + b"9" * 5000 + b"}", 400, "MALFORMED_JSON", "body"),
    ("POST", "/v1/jobs", b"\xff\xfe\x00", 400, "MALFORMED_JSON", "body"),
    ("POST", "/v1/jobs", b"[]", 422, "INVALID_FIELD", "body"),
    ("POST", "/v1/jobs", b"", 422, "INVALID_FIELD", "body"),
    ("POST", "/v1/jobs", job_with(name=5), 422, "INVALID_FIELD", "name"),
    ("POST", "/v1/jobs", job_with(name="a\x00b"), 422, "INVALID_FIELD", "name"),
    ("POST", "/v1/jobs", json.dumps(job_with(payload={"k": "\ud800"})).encode(),
     422, "INVALID_FIELD", "payload.k"),
    ("POST", "/v1/jobs", job_with(colour="red"), 422, "INVALID_FIELD", "colour"),
    ("POST", "/v1/jobs", {"name": "j", "target": JOB["target"]}, 422, "INVALID_FIELD", "schedule"),
    ("POST", "/v1/jobs", job_with(schedule={"cron": "61 * * * *"}), 422, "INVALID_FIELD", "schedule.cron"),
    ("POST", "/v1/jobs", job_with(schedule={"cron": "0 0 30 2 *"}), 422, "INVALID_FIELD", "schedule.cron"),
    ("POST", "/v1/jobs", job_with(schedule={"cron": "* * * * *", "timezone": "Mars/Olympus"}),
     422, "INVALID_FIELD", "schedule.timezone"),
    ("POST", "/v1/jobs", job_with(schedule={"every_ms": 5}), 422, "INVALID_FIELD", "schedule.every_ms"),
    ("POST", "/v1/jobs", job_with(schedule={"every_ms": "fast"}), 422, "INVALID_FIELD", "schedule.every_ms"),
    ("POST", "/v1/jobs", job_with(schedule={"at": "2030-01-01T00:00:00"}), 422, "INVALID_FIELD", "schedule.at"),
    ("POST", "/v1/jobs", job_with(retry={"max_attempts": 0}), 422, "INVALID_FIELD", "retry.max_attempts"),
    ("POST", "/v1/jobs", job_with(lease_ms=10**12), 422, "INVALID_FIELD", "lease_ms"),
    ("POST", "/v1/jobs", job_with(priority="urgent"), 422, "INVALID_FIELD", "priority"),
    ("POST", "/v1/jobs", job_with(priority="critical"), 403, "PRIORITY_NOT_ALLOWED", "priority"),
    ("POST", "/v1/jobs", job_with(target={"type": "ftp"}), 422, "INVALID_FIELD", "target.type"),
    ("POST", "/v1/jobs", job_with(target={"type": "queue", "queue": "a b"}), 422, "INVALID_FIELD", "target.queue"),
    ("POST", "/v1/jobs", webhook("ftp://example.com/x"), 422, "INVALID_FIELD", "target.url"),
    ("POST", "/v1/jobs", webhook("http://:80/x"), 422, "INVALID_FIELD", "target.url"),
    ("POST", "/v1/jobs", job_with(payload="x" * (257 * 1024)), 413, "PAYLOAD_TOO_LARGE", "payload"),
    ("POST", "/v1/jobs", job_with(payload="x" * (600 * 1024)), 413, "PAYLOAD_TOO_LARGE", "body"),
    ("PATCH", "/v1/jobs/{job}", {"schedule": {"cron": "bad"}}, 422, "INVALID_FIELD", "schedule.cron"),
    ("PATCH", "/v1/jobs/{job}", {"target": {"type": "webhook", "url": "http://127.0.0.1/"}},
     422, "DESTINATION_REFUSED", "target.url"),
    ("PATCH", "/v1/jobs/{job}", [1], 422, "INVALID_FIELD", "body"),
    ("POST", "/v1/jobs/{job}/backfill", {"from": "yesterday", "to": "2026-01-01T00:00:00Z"},
     422, "INVALID_FIELD", "from"),
    ("POST", "/v1/jobs/{job}/backfill", {"from": "2026-01-01T00:00:00Z"}, 422, "INVALID_FIELD", "to"),
    ("POST", "/v1/jobs/{job}/backfill", {"from": "0001-01-01T00:00:00Z", "to": "2026-01-01T00:00:00Z"},
     422, "INVALID_FIELD", "from"),
    ("POST", "/v1/jobs/{job}/backfill", {"from": "2026-01-02T00:00:00Z", "to": "2026-01-01T00:00:00Z"},
     422, "INVALID_FIELD", "to"),
    ("POST", "/v1/jobs/{job}/backfill", {"from": "2026-01-01T00:00:00Z", "to": "2999-01-01T00:00:00Z"},
     422, "INVALID_FIELD", "to"),
    ("GET", "/v1/jobs?cursor=garbage", None, 422, "INVALID_FIELD", "cursor"),
    ("GET", "/v1/jobs?cursor=99999999999999999999.job_x", None, 422, "INVALID_FIELD", "cursor"),
    ("GET", "/v1/jobs?limit=0", None, 422, "INVALID_FIELD", "limit"),
    ("GET", "/v1/runs?limit=abc", None, 422, "INVALID_FIELD", "limit"),
    ("GET", "/v1/runs?state=BOGUS", None, 422, "INVALID_FIELD", "state"),
    ("GET", "/v1/runs?cursor=1.2", None, 422, "INVALID_FIELD", "cursor"),
    ("GET", "/v1/runs?job_id=a%00b", None, 422, "INVALID_FIELD", "job_id"),
    ("GET", "/v1/jobs/a%00b", None, 404, "NOT_FOUND", None),
    ("GET", "/v1/runs/not-a-run-id", None, 404, "NOT_FOUND", None),
    ("POST", "/v1/runs/{run}/start", {}, 422, "INVALID_FIELD", "worker_id"),
    ("POST", "/v1/runs/{run}/start", {"worker_id": 5}, 422, "INVALID_FIELD", "worker_id"),
    ("POST", "/v1/runs/{run}/start", {"worker_id": "w", "attempt": "1"}, 422, "INVALID_FIELD", "attempt"),
    ("POST", "/v1/runs/{run}/start", {"worker_id": "w", "attempt": 2**40}, 422, "INVALID_FIELD", "attempt"),
    ("POST", "/v1/runs/{run}/heartbeat", {"attempt": 0, "start_token": "t"}, 422, "INVALID_FIELD", "attempt"),
    ("POST", "/v1/runs/{run}/heartbeat", {"attempt": 1}, 422, "INVALID_FIELD", "start_token"),
    ("POST", "/v1/runs/{run}/complete", {"attempt": 1, "start_token": "t", "outcome": "MAYBE"},
     422, "INVALID_FIELD", "outcome"),
    ("POST", "/v1/runs/{run}/complete",
     {"attempt": 1, "start_token": "t", "outcome": "FAILED", "retryable": "yes"},
     422, "INVALID_FIELD", "retryable"),
    ("POST", "/v1/runs/{run}/complete",
     {"attempt": 1, "start_token": "t", "outcome": "SUCCEEDED", "result": "r" * (65 * 1024)},
     413, "PAYLOAD_TOO_LARGE", "result"),
    ("POST", "/v1/runs/{run}/cancel", {"reason": 7}, 422, "INVALID_FIELD", "reason"),
    ("GET", "/v1/schedules/preview", None, 422, "INVALID_FIELD", "cron"),
    ("GET", "/v1/schedules/preview?cron=bad", None, 422, "INVALID_FIELD", "cron"),
    ("GET", "/v1/schedules/preview?cron=0+0+30+2+*", None, 422, "INVALID_FIELD", "cron"),
    ("GET", "/v1/schedules/preview?cron=*+*+*+*+*&timezone=Nowhere/X", None, 422, "INVALID_FIELD", "timezone"),
    ("GET", "/v1/schedules/preview?cron=*+*+*+*+*&count=0", None, 422, "INVALID_FIELD", "count"),
    ("GET", "/v1/schedules/preview?cron=*+*+*+*+*&count=5000", None, 422, "INVALID_FIELD", "count"),
    ("GET", "/v1/schedules/preview?cron=*+*+*+*+*&from=nope", None, 422, "INVALID_FIELD", "from"),
    ("GET", "/v1/schedules/preview?cron=*+*+*+*+*&from=0001-01-01T00:00:00%2B14:00", None,
     422, "INVALID_FIELD", "from"),
    ("GET", "/v1/schedules/preview?cron=*+*+*+*+*&gap=jump", None, 422, "INVALID_FIELD", "gap"),
    ("POST", "/v1/keys", {"label": 5}, 422, "INVALID_FIELD", "label"),
]  # fmt: skip

OPERATOR_CASES = [
    ("POST", "/v1/tenants", {"name": ""}, 422, "INVALID_FIELD", "name"),
    ("POST", "/v1/tenants", {"name": "x", "priority_classes": "high"}, 422, "INVALID_FIELD", "priority_classes"),
    ("POST", "/v1/tenants", {"name": "x", "priority_classes": ["urgent"]}, 422, "INVALID_FIELD", "priority_classes"),
    ("POST", "/v1/tenants", {"name": "x", "cell": "EU WEST"}, 422, "INVALID_FIELD", "cell"),
    ("POST", "/v1/tenants", {"name": "x", "plan": "gold"}, 422, "INVALID_FIELD", "plan"),
    ("GET", "/v1/tenants?cursor=%00", None, 422, "INVALID_FIELD", "cursor"),
]  # fmt: skip


def _send(client, method, path, body, headers):
    if isinstance(body, bytes):
        return client.request(method, path, content=body, headers=headers)
    return client.request(method, path, json=body, headers=headers)


def _check(r: httpx.Response, status: int, code: str, field: str | None, what) -> None:
    assert r.status_code == status, (what, r.status_code, r.text[:300])
    assert r.headers["content-type"].startswith("application/problem+json"), what
    doc = r.json()
    assert doc["status"] == status and doc["code"] == code, (what, doc)
    assert doc["title"] and doc["type"].startswith("urn:cronwheel:problem:"), what
    if field is not None:
        assert doc.get("field") == field, (what, doc)


def test_bad_inputs__each_a_4xx_problem_naming_the_field(client, ctx):
    for method, path, body, status, code, field in CASES:
        url = path.format(job=ctx["job"], run=ctx["run"])
        _check(_send(client, method, url, body, ctx["h"]), status, code, field, (method, path))
    for method, path, body, status, code, field in OPERATOR_CASES:
        _check(_send(client, method, path, body, OP), status, code, field, (method, path))
    assert client.get("/v1/jobs", headers=ctx["h"]).json()["items"][0]["job_id"] == ctx["job"]
    assert len(client.get("/v1/jobs", headers=ctx["h"]).json()["items"]) == 1  # nothing created


def test_bad_idempotency_key__422_naming_the_header(client, ctx):
    r = client.post("/v1/jobs", json=JOB, headers={**ctx["h"], "Idempotency-Key": "k" * 300})
    _check(r, 422, "INVALID_FIELD", "Idempotency-Key", "long key")


def test_out_of_range_interval__4xx_not_5xx(client, ctx):
    """every_ms beyond the calendar: the core overflows; the gateway still answers 422."""
    r = client.post("/v1/jobs", json=job_with(schedule={"every_ms": 10**18}), headers=ctx["h"])
    assert r.status_code == 422, r.text
    assert r.json()["field"] in ("body", "schedule.every_ms")


# -- webhook destinations (SSRF) -----------------------------------------------------

REFUSED = [
    "http://127.0.0.1/hook",
    "http://localhost:8080/hook",
    "http://10.1.2.3/",
    "http://172.16.0.1/",
    "http://192.168.1.1/",
    "http://169.254.169.254/latest/meta-data",
    "http://100.64.0.1/",
    "http://0.0.0.0/",
    "http://224.0.0.1/",
    "http://240.0.0.1/",
    "http://[::1]/",
    "http://[::ffff:127.0.0.1]/",
    "http://[::ffff:8.8.8.8]/",
    "http://[fe80::1]/",
    "http://[fc00::1]/",
    "http://[2002:7f00:1::]/",
    "http://2130706433/",  # 127.0.0.1 as one decimal number
    "http://no-such-host.invalid/",
]


def test_webhook_to_non_public_address__refused_at_creation(client, ctx):
    for url in REFUSED:
        r = client.post("/v1/jobs", json=webhook(url), headers=ctx["h"])
        _check(r, 422, "DESTINATION_REFUSED", "target.url", url)


def test_webhook_to_public_address__accepted(client, ctx):
    r = client.post("/v1/jobs", json=webhook("https://93.184.215.14/hook"), headers=ctx["h"])
    assert r.status_code == 201, r.text
    assert r.json()["target"]["url"] == "https://93.184.215.14/hook"


def test_webhook_allow_cidrs__operator_allows_loopback(database_url, kafka_bootstrap, topic_prefix):
    allow = allowed_networks("127.0.0.0/8, ::1/128")
    app, server = serve(database_url, kafka_bootstrap, topic_prefix, webhook_allow=allow)
    try:
        with server as svc, httpx.Client(base_url=svc.url, timeout=10) as c:
            key = c.post("/v1/tenants", json={"name": "acme"}, headers=OP).json()["api_key"]
            h = {"Authorization": f"Bearer {key}"}
            assert (
                c.post("/v1/jobs", json=webhook("http://127.0.0.1:9/x"), headers=h).status_code
                == 201
            )
            assert (
                c.post("/v1/jobs", json=webhook("http://[::1]:9/x"), headers=h).status_code == 201
            )
            r = c.post("/v1/jobs", json=webhook("http://10.0.0.1/x"), headers=h)
            assert r.status_code == 422 and r.json()["field"] == "target.url"
    finally:
        app.state.gateway.close()


def test_allow_cidrs__bad_entry__fails_loudly():
    with pytest.raises(ValueError, match="not a CIDR"):
        allowed_networks("10.0.0.0/8,banana")


def test_why_refused__embedded_ipv4_in_an_allowed_range__still_needs_its_own_entry():
    allow = allowed_networks("127.0.0.0/8")
    assert why_refused(ipaddress.ip_address("127.0.0.1"), allow) is None
    assert why_refused(ipaddress.ip_address("::ffff:127.0.0.1"), allow) is not None
    assert why_refused(ipaddress.ip_address("8.8.8.8")) is None
    assert json.dumps(why_refused(ipaddress.ip_address("::"))).count("unspecified") == 1
