"""A webhook URL's DNS lookup happens before the request's transaction, within
a timeout (services/gateway/destinations.py). The gateway is served in-process
over real HTTP and a real database; the resolver is the test's (DNS is not a
part of the platform): it answers names under `slow.` only when the test says.
While it waits, PostgreSQL shows no session of the gateway inside a
transaction; a lookup past the timeout is a 503 naming `target.url`."""

from __future__ import annotations

import socket
import threading

import psycopg
import pytest

from cronwheel.core.ssrf import allowed_networks
from cronwheel.kafka import Topics
from services.gateway.app import create_app
from services.gateway.destinations import DestinationCheck
from tests.support.gateway import tenant_client
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration

OPERATOR_KEY = "cwop_dns_check_operator_key"
LOOPBACK = allowed_networks("127.0.0.0/8")
QUEUE = {"type": "queue", "queue": "q"}


class Resolver:
    """127.0.0.1 for every name (allowed here); names under `slow.` first wait
    until `release` is set. `waiting` counts the lookups waiting now."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.waiting = 0
        self.lock = threading.Lock()

    def __call__(self, host, port, *args, **kwargs):
        if host.startswith("slow."):
            with self.lock:
                self.waiting += 1
            try:
                self.release.wait(30)
            finally:
                with self.lock:
                    self.waiting -= 1
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port))]


@pytest.fixture
def resolver():
    r = Resolver()
    yield r
    r.release.set()  # no lookup thread outlives the test


def gateway(database_url, kafka_bootstrap, topic_prefix, resolver, timeout_s: float):
    app = create_app(
        database_url, Topics(topic_prefix), kafka_bootstrap, OPERATOR_KEY, webhook_allow=LOOPBACK
    )
    app.state.gateway.destinations = DestinationCheck(LOOPBACK, timeout_s, resolver)
    return app


def job(url: str, name: str = "hook") -> dict:
    return {
        "name": name,
        "schedule": {"every_ms": 86_400_000},
        "target": {"type": "webhook", "url": url},
    }


def open_transactions(conn) -> list[tuple]:
    """Sessions of this test's database, other than `conn`'s, inside a transaction."""
    return conn.execute(
        "SELECT pid, usename, state FROM pg_stat_activity"
        " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        " AND (xact_start IS NOT NULL OR state LIKE 'idle in transaction%%')"
    ).fetchall()


def gateway_sessions(conn) -> int:
    return conn.execute(
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE datname = current_database() AND pid <> pg_backend_pid()"
    ).fetchone()[0]


def test_dns__lookup_waits__no_gateway_session_in_a_transaction__then_created(
    database_url, admin_database_url, kafka_bootstrap, topic_prefix, resolver
):
    app = gateway(database_url, kafka_bootstrap, topic_prefix, resolver, timeout_s=30)
    with (
        tenant_client(app, OPERATOR_KEY) as client,
        psycopg.connect(admin_database_url, autocommit=True) as watch,
    ):
        queue_job = client.post("/v1/jobs", json={**job("x"), "target": QUEUE})
        assert queue_job.status_code == 201, queue_job.text
        job_id = queue_job.json()["job_id"]
        answers: dict[str, object] = {}

        def call(name: str, method: str, path: str, body: dict) -> None:
            answers[name] = client.request(method, path, json=body)

        calls = [
            threading.Thread(target=call, args=("create", "POST", "/v1/jobs", job("http://slow.create.test/h"))),
            threading.Thread(
                target=call,
                args=("update", "PATCH", f"/v1/jobs/{job_id}", {"target": {"type": "webhook", "url": "http://slow.update.test/h"}}),
            ),
        ]  # fmt: skip
        for t in calls:
            t.start()
        try:
            wait_for(lambda: resolver.waiting == 2, 10, what="both lookups to be waiting")
            assert gateway_sessions(watch) >= 1, "the gateway's pool should have a session"
            assert open_transactions(watch) == [], "a transaction is open while DNS is waited for"
            assert not answers
        finally:
            resolver.release.set()
            for t in calls:
                t.join(20)
        assert answers["create"].status_code == 201, answers["create"].text
        assert answers["update"].status_code == 200, answers["update"].text
        assert answers["update"].json()["target"]["url"] == "http://slow.update.test/h"


def test_dns__lookup_times_out__503_naming_target_url__nothing_written_nothing_recorded(
    database_url, kafka_bootstrap, topic_prefix, resolver
):
    app = gateway(database_url, kafka_bootstrap, topic_prefix, resolver, timeout_s=0.3)
    with tenant_client(app, OPERATOR_KEY) as client:
        slow = job("http://slow.timeout.test/h")
        keyed = {"Idempotency-Key": "dns-timeout-1"}
        r = client.post("/v1/jobs", json=slow, headers=keyed)
        assert r.status_code == 503, r.text
        assert r.headers["content-type"] == "application/problem+json"
        assert r.headers["retry-after"] == "1"
        doc = r.json()
        assert (doc["code"], doc["field"]) == ("DNS_TIMEOUT", "target.url")
        assert client.get("/v1/jobs").json()["items"] == []

        made = client.post("/v1/jobs", json=job("http://fast.test/h", "made"))
        assert made.status_code == 201, made.text
        p = client.patch(
            f"/v1/jobs/{made.json()['job_id']}",
            json={"target": {"type": "webhook", "url": "http://slow.patch.test/h"}},
        )
        assert (p.status_code, p.json()["field"]) == (503, "target.url")

        # A batch: the slow job gets the 503 in its own slot, the others go in.
        batch = client.post(
            "/v1/jobs/batch",
            json={"jobs": [job("http://fast.test/a", "a"), slow, job("http://fast.test/b", "b")]},
        )
        assert batch.status_code == 200, batch.text
        results = batch.json()["results"]
        assert [x["status"] for x in results] == [201, 503, 201]
        assert (results[1]["problem"]["code"], results[1]["problem"]["field"]) == (
            "DNS_TIMEOUT",
            "target.url",
        )

        wf = client.post(
            "/v1/workflows",
            json={"name": "wf", "nodes": [{"name": "n", "target": slow["target"]}]},
        )
        assert (wf.status_code, wf.json()["field"]) == (503, "target.url")

        # The 503 was not recorded against the Idempotency-Key: once DNS
        # answers, the same key creates the job.
        resolver.release.set()
        again = client.post("/v1/jobs", json=slow, headers=keyed)
        assert again.status_code == 201, again.text
        assert "Idempotent-Replayed" not in again.headers
        names = sorted(j["name"] for j in client.get("/v1/jobs").json()["items"])
        assert names == ["a", "b", "hook", "made"]
