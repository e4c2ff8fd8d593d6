"""GET /v1/system against the real database and broker: the operator's figures
of the platform's health (docs/api.md, "The platform's health").

A poison record that the real dispatcher dead-letters is counted and shown
with its reason; consumer lag is the dispatcher group's committed offsets
against the end of its run topics; lateness p50/p99 comes from runs of known
instants and creation times; backlogs, overdue timers and leases from rows
written as the platform writes them; a tenant key gets 403."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import psycopg
import pytest

from cronwheel import kafka
from cronwheel.core import events
from cronwheel.kafka import Topics
from cronwheel.store import system as store_system
from services.dispatcher.service import Dispatcher
from services.gateway.app import create_app
from services.gateway.system import SystemHealth
from tests.support import platform_state
from tests.support.gateway import served
from tests.support.running import running
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration

OPERATOR_KEY = "cwop_system_health_operator_key_0123456789"
OP = {"Authorization": f"Bearer {OPERATOR_KEY}"}


@pytest.fixture
def topics(topic_prefix) -> Topics:
    return Topics(topic_prefix)


@pytest.fixture
def api(database_url, kafka_bootstrap, topics) -> Iterator[httpx.Client]:
    """A served gateway whose /v1/system caches nothing, so a test reads each
    change at once (the cache itself: tests/unit/test_system_health.py)."""
    app = create_app(database_url, topics, kafka_bootstrap, OPERATOR_KEY)
    app.state.system_health = SystemHealth(app.state.gateway, ttl_s=0)
    with served(app) as client:
        yield client


def new_tenant(api: httpx.Client, name: str) -> tuple[str, dict]:
    r = api.post("/v1/tenants", json={"name": name}, headers=OP)
    assert r.status_code == 201, r.text
    return r.json()["tenant_id"], {"Authorization": f"Bearer {r.json()['api_key']}"}


def system(api: httpx.Client, **params) -> dict:
    r = api.get("/v1/system", headers=OP, params=params)
    assert r.status_code == 200, r.text
    return r.json()


def test_system__operator_only__tenant_key_403__bad_window_422_naming_it(api):
    _tid, tenant = new_tenant(api, "acme")
    r = api.get("/v1/system", headers=tenant)
    assert r.status_code == 403 and r.json()["code"] == "FORBIDDEN", r.text
    assert api.get("/v1/system").status_code == 401
    r = api.get("/v1/system", headers=OP, params={"minutes": 0})
    assert r.status_code == 422 and r.json()["field"] == "minutes", r.text
    assert "/v1/system" in api.get("/openapi.json").json()["paths"]


def test_system__cell_asked__its_own_answers__another_421__a_bad_name_422(api):
    """One cell, no directory: the gateway's cell is `local` (config.cell())."""
    assert system(api, cell="local")["cell"] == "local"
    r = api.get("/v1/system", headers=OP, params={"cell": "eu"})
    assert r.status_code == 421 and r.json()["code"] == "MISDIRECTED", r.text
    assert r.json()["cell"] == "eu"
    r = api.get("/v1/system", headers=OP, params={"cell": "Not A Cell"})
    assert r.status_code == 422 and r.json()["field"] == "cell", r.text


def test_system__lateness_from_known_runs__backlogs__leases(api, database_url):
    tid, _ = new_tenant(api, "acme")
    expected = platform_state.known_runs(database_url, tid)
    platform_state.backlog(database_url, ready=3, held=2, overdue=4)
    platform_state.leases(database_url, live="timer", lapsed="relay")

    s = system(api)
    late = s["lateness"]
    assert late["window_ms"] == 5 * 60_000 and late["measured_from"] == "scheduled_at"
    assert late["sampled"] is False  # one tenant, 100 runs: within its share
    assert late["fired"] == expected["fired"], late
    assert late["started"] == expected["started"], late

    assert s["outbox"]["ready"] == 3 and s["outbox"]["held"] == 2, s["outbox"]
    assert not s["outbox"]["capped"] and s["outbox"]["oldest_ready_age_ms"] >= 0
    assert s["timers"]["overdue"] == 4 and s["timers"]["oldest_due_at"], s["timers"]
    runs = s["runs"]
    assert runs["pending"] == expected["pending"] and runs["running"] == 0, runs
    assert runs["reannounced_waiting"] == 1 and runs["reannounced_recently"] == 1, runs

    services = {x["kind"]: x for x in s["services"]["items"]}
    assert services["timer"]["ready"] and services["timer"]["instances"] == 1, services
    assert services["timer"]["partitions_leased"] == 1024
    assert not services["relay"]["ready"] and services["relay"]["instances"] == 0, services

    # A one-minute window holds the instants of its last minute only.
    assert system(api, minutes=1)["lateness"]["fired"]["runs"] <= expected["fired"]["runs"]


def test_system__lateness_sample__each_tenants_newest_share__says_sampled(
    api, database_url, monkeypatch
):
    tid, _ = new_tenant(api, "acme")
    platform_state.known_runs(database_url, tid)
    monkeypatch.setattr(store_system, "SAMPLE", 10)
    monkeypatch.setattr(store_system, "MIN_SHARE", 10)
    late = system(api)["lateness"]
    # The newest 10 by creation: lateness 90..99 ms (created last).
    assert late["sampled"] is True and late["fired"]["runs"] == 10, late
    assert (late["fired"]["p50_ms"], late["fired"]["max_ms"]) == (94, 99), late


def test_system__a_section_it_cannot_read__said_in_words__the_others_answer(
    api, admin_database_url
):
    # As on a database not yet migrated to 0024: the operator may not read the leases.
    with psycopg.connect(admin_database_url, autocommit=True) as conn:
        conn.execute("REVOKE SELECT ON partition_leases FROM cronwheel_operator")
    s = system(api)
    assert s["services"] == {
        "error": "InsufficientPrivilege: permission denied for table partition_leases"
    }, s["services"]
    assert s["outbox"]["ready"] == 0 and s["lateness"]["fired"]["runs"] == 0
    assert "items" in s["consumers"] and "count" in s["dead_letters"]


def test_system__dead_lettered_record_counted_and_shown__lag_from_committed_offsets(
    api, database_url, kafka_bootstrap, topics
):
    tid, _ = new_tenant(api, "acme")
    runs = topics.runs(tid)
    kafka.ensure_topics([runs], bootstrap=kafka_bootstrap, principal="dispatcher")
    relay = kafka.producer(kafka_bootstrap, principal="relay")  # run topics are the relay's

    def produce(records: list[tuple[bytes, bytes]]) -> None:
        errors: list = []
        for key, value in records:
            relay.produce(
                runs, key=key, value=value, partition=0,
                on_delivery=lambda e, _m: e and errors.append(e),
            )  # fmt: skip
        assert relay.flush(30) == 0 and errors == [], errors

    before = system(api)["dead_letters"]
    assert before.get("count", 0) == 0, before

    produce([(b"garbage", b"not avro at all")])
    with running(Dispatcher(database_url, kafka_bootstrap, topics)):
        letters = wait_for(
            lambda: (d := system(api)["dead_letters"]).get("count") == 1 and d,
            timeout=60,
            what="the dead letter counted",
        )
        wait_for(
            lambda: consumer(system(api), "dispatcher").get("committed_partitions") == 1,
            timeout=30,
            what="the dispatcher's offset committed",
        )
    [letter] = letters["recent"]
    assert letter["consumer"] == "dispatcher" and letter["reason"] == "not single-object encoded"
    assert (letter["source_topic"], letter["source_partition"]) == (runs, 0)
    assert letter["source_offset"] == 0 and letter["key"] == "garbage"
    assert "value" not in letter  # a record's bytes are never shown

    # The dispatcher stopped (its last offsets committed): what arrives now is lag.
    produce(
        [
            (
                f"r{i}".encode(),
                events.run_ready(
                    run_id=f"r{i}",
                    tenant_id=tid,
                    partition_id=0,
                    attempt=1,
                    scheduled_ms=1,
                    created_ms=1,
                    priority="normal",
                    target={"type": "queue", "queue": "q"},
                    payload="{}",
                ),
            )  # fmt: skip
            for i in range(3)
        ]
    )
    s = system(api)
    dispatcher = consumer(s, "dispatcher")
    assert dispatcher["lag"] == 3 and dispatcher["partitions"] >= 1, dispatcher
    assert {c["consumer"] for c in s["consumers"]["items"]} == {
        "dispatcher", "workflow", "webhook", "executor",
    }  # fmt: skip
    assert s["dead_letters"]["count"] == 1


def consumer(s: dict, kind: str) -> dict:
    assert "items" in s["consumers"], s["consumers"]
    return next(c for c in s["consumers"]["items"] if c["consumer"] == kind)


def test_system__a_run_topic_grown_since_it_was_read__its_new_partitions_counted(
    api, kafka_bootstrap, topics
):
    """The gateway's offsets client learned the run topic with its partitions
    then; the partitions added since (a tenant's topic grows online) are
    answered too, not "no offsets" for the quarter hour its metadata cache
    would have kept the old count."""
    tid, _ = new_tenant(api, "acme")
    runs = topics.runs(tid)
    kafka.ensure_topics([runs], partitions=1, bootstrap=kafka_bootstrap, principal="dispatcher")
    before = consumer(system(api), "dispatcher")
    relay = kafka.admin(kafka_bootstrap, principal="relay")  # the relay grows run topics
    have = len(relay.list_topics(runs, timeout=10).topics[runs].partitions)
    kafka.grow_topic(runs, have + 2, relay)

    def led() -> bool:
        parts = relay.list_topics(runs, timeout=10).topics[runs].partitions
        return len(parts) == have + 2 and all(p.leader >= 0 for p in parts.values())

    wait_for(led, timeout=30, what="the new partitions led")
    after = consumer(system(api), "dispatcher")
    assert after["partitions"] == before["partitions"] + 2, after
    assert after["lag"] == before["lag"]
