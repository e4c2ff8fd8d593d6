"""Issue 23, tenant isolation on the broker: a tenant's Kafka credentials, as
`POST /v1/tenants` returns them, read its own queue topics and nothing else,
and write nowhere; without credentials the broker refuses the connection.
Every refusal is the broker's own authorization error (the real broker, SASL
SCRAM and the StandardAuthorizer of `cronwheel up`), not a client's check.
"""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)

from cronwheel import kafka
from cronwheel.core import events
from cronwheel.kafka import Topics
from services.gateway.app import create_app
from tests.support.gateway import served
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration

OPERATOR_KEY = "cwop_" + uuid.uuid4().hex + uuid.uuid4().hex
DENIED = {
    KafkaError.TOPIC_AUTHORIZATION_FAILED,
    KafkaError.GROUP_AUTHORIZATION_FAILED,
    KafkaError.CLUSTER_AUTHORIZATION_FAILED,
}


@pytest.fixture
def platform(database_url, kafka_bootstrap, topic_prefix):
    if "sasl.username" not in kafka.security("admin", kafka_bootstrap):
        pytest.skip("the broker takes clients without authentication (KAFKA_BOOTSTRAP names one)")
    topics = Topics(topic_prefix)
    app = create_app(database_url, topics, kafka_bootstrap, OPERATOR_KEY)
    with served(app) as client:
        yield topics, client


def new_tenant(client, name: str) -> dict:
    r = client.post(
        "/v1/tenants", json={"name": name}, headers={"Authorization": f"Bearer {OPERATOR_KEY}"}
    )
    assert r.status_code == 201, r.text
    return r.json()


def record(tenant_id: str, run_id: str) -> bytes:
    return events.run_ready(
        run_id=run_id, tenant_id=tenant_id, partition_id=0, attempt=1, scheduled_ms=1,
        created_ms=1, priority="normal", target={"type": "queue", "queue": "q"}, payload="{}",
    )  # fmt: skip


def client_conf(creds: dict, **more) -> dict:
    """The tenant's credentials as any librdkafka client takes them."""
    return {
        "bootstrap.servers": creds["bootstrap"],
        "security.protocol": creds["security_protocol"],
        "sasl.mechanism": creds["sasl_mechanism"],
        "sasl.username": creds["username"],
        "sasl.password": creds["password"],
        "log_level": 0,
        **more,
    }


def read(conf: dict, topic: str, group: str, want: int = 1, timeout: float = 20) -> list:
    """Subscribe as a group member and read `want` records; raises the first
    error the broker answers with (an authorization error ends it at once)."""
    c = Consumer({**conf, "group.id": group, "auto.offset.reset": "earliest"})
    got: list = []
    try:
        c.subscribe([topic])

        def done():
            m = c.poll(0.2)
            if m is not None and m.error() is not None:
                raise KafkaException(m.error())
            if m is not None:
                got.append(m)
            return len(got) >= want

        wait_for(done, timeout=timeout, what=f"{want} records of {topic}")
        c.commit(asynchronous=False)
        return got
    finally:
        c.close()


def refused_read(conf: dict, topic: str) -> int:
    """The broker's error for a fetch of `topic` by assignment (no group)."""
    c = Consumer({**conf, "group.id": "unused", "enable.auto.commit": False})
    errors: list[int] = []
    try:
        c.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])

        def answered():
            m = c.poll(0.2)
            if m is not None and m.error() is not None:
                errors.append(m.error().code())
            elif m is not None:
                raise AssertionError(f"read a record of {topic}")
            return errors

        wait_for(answered, timeout=20, what=f"the broker's answer for {topic}")
        return errors[0]
    finally:
        c.close()


def authentication_failed(conf: dict) -> bool:
    """Whether the broker turned these credentials away (librdkafka reports it
    through the error callback, not on a record)."""
    errors: list[int] = []
    c = Consumer({**conf, "group.id": "unused", "error_cb": lambda e: errors.append(e.code())})
    try:

        def answered():
            c.poll(0.2)
            return KafkaError._AUTHENTICATION in errors

        return wait_for(answered, timeout=20, what="the broker's refusal")
    finally:
        c.close()


def refused_produce(conf: dict, topic: str) -> int:
    errors: list = []
    p = Producer({**conf, "message.timeout.ms": 10_000})
    p.produce(topic, value=b"forged", on_delivery=lambda e, _m: errors.append(e))
    p.flush(15)
    assert errors and errors[0] is not None, f"a produce to {topic} was accepted"
    return errors[0].code()


def test_tenant_credentials__own_queue_readable__everything_else_refused_by_the_broker(
    platform, kafka_bootstrap
):
    topics, client = platform
    a, b = new_tenant(client, "alice"), new_tenant(client, "bob")
    ka, kb = a["kafka"], b["kafka"]
    assert ka["username"] != kb["username"] and ka["password"] != kb["password"]
    mine, theirs = topics.queue(a["tenant_id"], "work"), topics.queue(b["tenant_id"], "work")
    runs = topics.runs(a["tenant_id"])
    # The platform makes and fills the topics, with its own principals.
    kafka.ensure_topics([mine, theirs], 1, kafka_bootstrap, principal="dispatcher")
    kafka.ensure_topics([runs], 1, kafka_bootstrap, principal="dispatcher")
    kafka.ensure_topics(
        [topics.run_completed, topics.dead_letter], 1, kafka_bootstrap, principal="workflow"
    )
    dispatcher = kafka.producer(kafka_bootstrap, principal="dispatcher")
    dispatcher.produce(mine, key=b"r-a", value=record(a["tenant_id"], "r-a"))
    dispatcher.produce(theirs, key=b"r-b", value=record(b["tenant_id"], "r-b"))
    assert dispatcher.flush(15) == 0

    # Its own queue topic: read as a group member under its group prefix.
    conf = client_conf(ka)
    [got] = read(conf, mine, ka["group_prefix"] + "workers")
    assert got.key() == b"r-a"
    # Not under another group, not another tenant's queue, not the platform's topics.
    with pytest.raises(KafkaException) as denied:
        read(conf, mine, kb["group_prefix"] + "workers")
    assert denied.value.args[0].code() in DENIED
    for topic in (theirs, runs, topics.run_completed, topics.dead_letter):
        assert refused_read(conf, topic) in DENIED, topic
    # Writes: nowhere, its own queue topic included.
    for topic in (mine, theirs, runs, topics.run_completed, topics.dead_letter):
        assert refused_produce(conf, topic) in DENIED, topic
    # Bob's password does not open Alice's principal.
    assert authentication_failed(client_conf({**ka, "password": kb["password"]}))


def test_no_credentials__the_broker_refuses_the_connection(kafka_bootstrap, topic_prefix):
    if "sasl.username" not in kafka.security("admin", kafka_bootstrap):
        pytest.skip("the broker takes clients without authentication")
    from confluent_kafka.admin import AdminClient

    bare = AdminClient({"bootstrap.servers": kafka_bootstrap, "log_level": 0})
    with pytest.raises(KafkaException) as refused:
        bare.list_topics(timeout=5)
    assert refused.value.args[0].code() == KafkaError._TRANSPORT


def test_rotation__new_password_works__old_one_refused(platform, kafka_bootstrap):
    topics, client = platform
    a = new_tenant(client, "carol")
    old = a["kafka"]
    topic = topics.queue(a["tenant_id"], "work")
    kafka.ensure_topics([topic], 1, kafka_bootstrap, principal="dispatcher")
    p = kafka.producer(kafka_bootstrap, principal="dispatcher")
    p.produce(topic, key=b"r1", value=record(a["tenant_id"], "r1"))
    assert p.flush(15) == 0
    r = client.post(
        f"/v1/tenants/{a['tenant_id']}/kafka-credentials",
        headers={"Authorization": f"Bearer {OPERATOR_KEY}"},
    )
    assert r.status_code == 200, r.text
    new = r.json()["kafka"]
    assert new["username"] == old["username"] and new["password"] != old["password"]
    assert read(client_conf(new), topic, new["group_prefix"] + "w")[0].key() == b"r1"
    assert authentication_failed(client_conf(old))
    # An unknown tenant is a 404, and a tenant key may not rotate.
    r = client.post(
        "/v1/tenants/ten_nope/kafka-credentials",
        headers={"Authorization": f"Bearer {OPERATOR_KEY}"},
    )
    assert r.status_code == 404
    r = client.post(
        f"/v1/tenants/{a['tenant_id']}/kafka-credentials",
        headers={"Authorization": f"Bearer {a['api_key']}"},
    )
    assert r.status_code == 403
