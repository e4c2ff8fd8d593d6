"""A tenant's topics exist when the calls that create the tenant and its jobs
answer (services/gateway/topics_ready.py), so a run due a moment later does
not wait for them; a broker away never costs a job its creation."""

from __future__ import annotations

import pytest
from prometheus_client import REGISTRY

from cronwheel import kafka
from cronwheel.core.ssrf import allowed_networks
from cronwheel.kafka import Topics
from services.gateway.app import create_app
from tests.integration.test_gateway_api import OPERATOR
from tests.support.gateway import served

pytestmark = pytest.mark.integration

OPERATOR_KEY = OPERATOR["Authorization"].removeprefix("Bearer ")
# A loaded machine may take seconds to make topics: the tests that count them
# made wait that long, as CRONWHEEL_GATEWAY_TOPICS_WAIT_MS lets an operator.
SLOW_BROKER_S = 60.0
QUEUE = {"type": "queue", "queue": "reports"}
WEBHOOK = {"type": "webhook", "url": "http://127.0.0.1:9/hook"}  # allowed below
MANAGED = {"type": "managed", "command": ["true"]}


def _job(name: str, target: dict) -> dict:
    return {"name": name, "schedule": {"cron": "0 * * * *"}, "target": target}


def _made(outcome: str) -> float:
    return REGISTRY.get_sample_value("cronwheel_gateway_topics_total", {"outcome": outcome}) or 0.0


def _leaders(bootstrap: str, topic: str) -> int | None:
    """The topic's partition count if the broker's metadata names a leader for
    each, else None: read once, at once (a topic made after the answer is
    not there yet)."""
    admin = kafka.admin(bootstrap, principal="observer")
    meta = admin.list_topics(topic, timeout=10).topics.get(topic)
    if meta is None or meta.error is not None or not meta.partitions:
        return None
    if any(p.leader < 0 for p in meta.partitions.values()):
        return None
    return len(meta.partitions)


def _served(database_url: str, topics: Topics, bootstrap: str):
    """A gateway that makes the topics, waiting as long as the broker takes."""
    app = create_app(
        database_url,
        topics,
        bootstrap,
        OPERATOR_KEY,
        webhook_allow=allowed_networks("127.0.0.0/8"),
        make_topics=True,
        topics_wait_s=SLOW_BROKER_S,
    )
    return served(app)


def test_topics_exist_when_the_calls_answer__tenant_job_batch_and_retarget(
    database_url, kafka_bootstrap, topic_prefix
):
    topics = Topics(topic_prefix)
    with _served(database_url, topics, kafka_bootstrap) as c:
        made_before = _made("made")
        r = c.post("/v1/tenants", json={"name": "acme"}, headers=OPERATOR)
        assert r.status_code == 201, r.text
        tenant, key = r.json()["tenant_id"], r.json()["api_key"]
        assert _leaders(kafka_bootstrap, topics.runs(tenant)) == kafka.RUN_PARTITIONS
        auth = {"Authorization": f"Bearer {key}"}

        r = c.post("/v1/jobs", json=_job("one", QUEUE), headers=auth)
        assert r.status_code == 201, r.text
        assert _leaders(kafka_bootstrap, topics.queue(tenant, "reports")) == 1

        batch = {"jobs": [_job("hook", WEBHOOK), _job("sandboxed", MANAGED), {"name": 1}]}
        r = c.post("/v1/jobs/batch", json=batch, headers=auth)
        assert [x["status"] for x in r.json()["results"]] == [201, 201, 422], r.text
        assert _leaders(kafka_bootstrap, topics.webhook(tenant)) == kafka.CLASS_PARTITIONS
        assert _leaders(kafka_bootstrap, topics.managed(tenant)) == kafka.CLASS_PARTITIONS

        job_id = c.get("/v1/jobs", headers=auth).json()["items"][0]["job_id"]
        moved = {"target": {"type": "queue", "queue": "nightly"}}
        r = c.patch(f"/v1/jobs/{job_id}", json=moved, headers=auth)
        assert r.status_code == 200, r.text
        assert _leaders(kafka_bootstrap, topics.queue(tenant, "nightly")) == 1
        # Five topics, each made once: a second job to a known one asks nothing.
        assert _made("made") - made_before == 5
        r = c.post("/v1/jobs", json=_job("two", QUEUE), headers=auth)
        assert r.status_code == 201 and _made("made") - made_before == 5


def test_a_batch_to_many_new_queues__every_topic_led_when_it_answers(
    database_url, kafka_bootstrap, topic_prefix
):
    """Past kafka.BULK_TOPICS new topics, their leaders are waited for
    through cluster-wide metadata requests rather than one request each."""
    topics = Topics(topic_prefix)
    with _served(database_url, topics, kafka_bootstrap) as c:
        r = c.post("/v1/tenants", json={"name": "acme"}, headers=OPERATOR)
        tenant, key = r.json()["tenant_id"], r.json()["api_key"]
        queues = [f"q{i}" for i in range(kafka.BULK_TOPICS + 8)]
        batch = {"jobs": [_job(q, {"type": "queue", "queue": q}) for q in queues]}
        r = c.post("/v1/jobs/batch", json=batch, headers={"Authorization": f"Bearer {key}"})
        assert {x["status"] for x in r.json()["results"]} == {201}, r.text
        for q in queues:
            assert _leaders(kafka_bootstrap, topics.queue(tenant, q)) == 1, q


def test_broker_away__jobs_created_all_the_same__then_left_to_the_dispatcher_awhile(
    database_url, topic_prefix
):
    away = "127.0.0.1:1"  # nothing listens: every ask of the broker goes unanswered
    app = create_app(
        database_url, Topics(topic_prefix), away, OPERATOR_KEY, make_topics=True, topics_wait_s=0.5
    )
    ready = app.state.gateway.topics_ready
    now = [0.0]
    ready.clock = lambda: now[0]
    with served(app) as c:
        failed_before = _made("failed")
        r = c.post("/v1/tenants", json={"name": "acme"}, headers=OPERATOR)
        assert r.status_code == 201, r.text
        assert _made("failed") - failed_before == 1  # its run topic: not made, not refused
        auth = {"Authorization": f"Bearer {r.json()['api_key']}"}

        # Within the quiet time the broker is not asked again.
        r = c.post("/v1/jobs", json=_job("one", QUEUE), headers=auth)
        assert r.status_code == 201, r.text
        assert _made("failed") - failed_before == 1

        now[0] += ready.quiet_s
        r = c.post("/v1/jobs", json=_job("two", QUEUE), headers=auth)
        assert r.status_code == 201, r.text
        assert _made("failed") - failed_before == 3  # the run topic and the queue's
        assert len(c.get("/v1/jobs", headers=auth).json()["items"]) == 2
