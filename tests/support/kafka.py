"""Reading records back from the real broker in tests, as the platform's
observer principal (cronwheel.principals: it reads every topic of a prefix and
writes nothing), and the ACLs of each test's topic prefix."""

from __future__ import annotations

import logging
import time
import uuid

from cronwheel import kafka, principals
from cronwheel.core.avro import default_registry

OBSERVER_GROUPS = "cronwheel-observer."  # the observer's group prefix


def grant(bootstrap: str, prefix: str) -> None:
    """The platform's ACLs for a test's topic prefix, as `cronwheel up` grants
    them for the stack's (the principals exist already). A broker without
    authentication (servers named by KAFKA_BOOTSTRAP) has no ACLs to grant."""
    if "sasl.username" not in kafka.security("admin", bootstrap):
        return
    principals.grant_platform(kafka.admin(bootstrap, principal="admin"), prefix)


def tenant_credentials(bootstrap: str, topics, tenant_id: str) -> kafka.Credentials | None:
    """A tenant's Kafka principal and its ACLs, made as the gateway makes them
    for `POST /v1/tenants` (None on a broker without authentication)."""
    if "sasl.username" not in kafka.security("admin", bootstrap):
        return None
    admin = kafka.admin(bootstrap, principal="admin")
    password = principals.provision_tenant(admin, topics, tenant_id)
    return kafka.Credentials(principals.tenant_username(tenant_id), password)


def tenant_conf(creds: dict | None) -> dict:
    """librdkafka's settings for a tenant's Kafka credentials (the `kafka` of
    `POST /v1/tenants`); none on a broker without authentication."""
    if creds is None:
        return {}
    return {
        "security.protocol": creds["security_protocol"],
        "sasl.mechanism": creds["sasl_mechanism"],
        "sasl.username": creds["username"],
        "sasl.password": creds["password"],
    }


def worker_env(creds: dict | kafka.Credentials | None) -> dict[str, str]:
    """The SDK worker's environment for a tenant's Kafka credentials: the
    `kafka` object of `POST /v1/tenants`, or Credentials (none: nothing)."""
    if creds is None:
        return {}
    if isinstance(creds, kafka.Credentials):
        return {
            "CRONWHEEL_KAFKA_USERNAME": creds.username,
            "CRONWHEEL_KAFKA_PASSWORD": creds.password,
        }
    return {
        "CRONWHEEL_KAFKA_USERNAME": creds["username"],
        "CRONWHEEL_KAFKA_PASSWORD": creds["password"],
        "CRONWHEEL_KAFKA_SECURITY_PROTOCOL": creds["security_protocol"],
        "CRONWHEEL_KAFKA_SASL_MECHANISM": creds["sasl_mechanism"],
    }


def revoke(bootstrap: str, prefixes: list[str]) -> None:
    """The ACLs `grant` made for these prefixes. Best effort, as delete_topics."""
    try:
        principals.delete_acls_on_prefixes(kafka.admin(bootstrap, principal="admin"), prefixes)
    except Exception as exc:  # teardown must not fail a green session
        logging.getLogger("tests").warning("could not delete test ACLs: %s", exc)


def drain(
    bootstrap: str,
    topic_or_pattern: str,
    want: int,
    timeout: float = 30.0,
    group: str | None = None,
) -> list[tuple]:
    """Consume until `want` records arrived or the deadline passed; returns
    (topic, key, record_name, datum, message) for each. Polls, never sleeps."""
    group = group or f"{OBSERVER_GROUPS}test-{uuid.uuid4().hex[:8]}"
    c = kafka.consumer(group, bootstrap, principal="observer")
    c.subscribe([topic_or_pattern])
    out: list[tuple] = []
    deadline = time.monotonic() + timeout
    try:
        while len(out) < want and time.monotonic() < deadline:
            msg = c.poll(0.2)
            if msg is None or msg.error():
                continue
            name, datum = default_registry().decode(msg.value())
            out.append((msg.topic(), msg.key(), name, datum, msg))
    finally:
        c.close()
    return out


def read_all(bootstrap: str, names: list[str], timeout: float = 30.0) -> list:
    """Every record on these topics, duplicates included, read by explicit
    assignment from the start to each partition's high watermark as it is
    now: no group and no pattern subscription, so a topic made a moment ago
    is read like any other. Polls with a deadline."""
    from confluent_kafka import OFFSET_BEGINNING, TopicPartition

    c = kafka.consumer(
        f"{OBSERVER_GROUPS}test-{uuid.uuid4().hex[:8]}", bootstrap, principal="observer"
    )
    try:
        ends: dict[tuple[str, int], int] = {}
        for name in names:
            meta = c.list_topics(name, timeout=10).topics[name]
            for p in meta.partitions:
                _low, high = c.get_watermark_offsets(TopicPartition(name, p), timeout=10)
                if high > 0:
                    ends[(name, p)] = high
        c.assign([TopicPartition(t, p, OFFSET_BEGINNING) for t, p in ends])
        out: list = []
        done: set[tuple[str, int]] = set()
        deadline = time.monotonic() + timeout
        while done != set(ends):
            if time.monotonic() > deadline:
                raise AssertionError(f"read {len(out)} records, not to the end of {names}")
            for m in c.consume(500, timeout=0.2):
                if m.error() is None:
                    out.append(m)
                    if m.offset() + 1 >= ends[(m.topic(), m.partition())]:
                        done.add((m.topic(), m.partition()))
        return out
    finally:
        c.close()


def delete_topics(bootstrap: str, prefixes: list[str], timeout: float = 30.0) -> int:
    """Delete the topics whose names start with one of `prefixes` and a dot;
    returns how many were asked for. Best effort: a failure is only logged."""
    if not prefixes:
        return 0
    starts = tuple(f"{p}." for p in prefixes)
    try:
        admin = kafka.admin(bootstrap, principal="admin")
        names = [t for t in admin.list_topics(timeout=10).topics if t.startswith(starts)]
        for i in range(0, len(names), 500):
            futures = admin.delete_topics(names[i : i + 500], operation_timeout=timeout)
            for fut in futures.values():
                fut.result(timeout)
        return len(names)
    except Exception as exc:  # teardown must not fail a green session
        logging.getLogger("tests").warning("could not delete test topics: %s", exc)
        return 0


def run_topic_and_record(conn, topics, bootstrap: str) -> tuple[str, bytes]:
    """A new tenant's run topic, created, and a RunReady value to write to it
    through the outbox (relay tests)."""
    from cronwheel.core import events
    from cronwheel.store.jobs import create_tenant

    tenant = create_tenant(conn, "acme")
    topic = topics.runs(tenant["tenant_id"])
    kafka.ensure_topics([topic], bootstrap=bootstrap, principal="dispatcher")
    value = events.run_ready(
        run_id="r", tenant_id=tenant["tenant_id"], partition_id=0, attempt=1,
        scheduled_ms=1, created_ms=1, priority="normal",
        target={"type": "queue", "queue": "q"}, payload="{}",
    )  # fmt: skip
    return topic, value
