"""A tenant's Kafka credential made again from what the platform keeps of it
(cronwheel/scram.py: salt, iterations, SaltedPassword; never the password),
as a move makes it on the target cell's broker: the tenant's password logs in
there as before. Against the real broker (SASL SCRAM-SHA-512)."""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from cronwheel import kafka, principals, scram
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration


def _logs_in(bootstrap: str, user: str, password: str) -> bool:
    client = AdminClient({
        "bootstrap.servers": bootstrap, "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": principals.MECHANISM, "sasl.username": user,
        "sasl.password": password, "log_level": 0,
    })  # fmt: skip
    try:
        client.list_topics(timeout=3)
        return True
    except KafkaException:
        return False


def test_carried_credential__deleted_then_made_from_what_is_kept__the_same_password_logs_in(
    kafka_bootstrap, topic_prefix
):
    if "sasl.username" not in kafka.security("gateway", kafka_bootstrap):
        pytest.skip("the broker takes clients without authentication")
    admin = kafka.admin(kafka_bootstrap, principal="gateway")
    tenant_id = f"ten_{uuid.uuid4().hex[:8]}"
    user = principals.tenant_username(tenant_id)
    password, kept = principals.provision_tenant_kept(admin, kafka.Topics(topic_prefix), tenant_id)
    try:
        assert password.encode() not in (kept.salt, kept.salted_password)
        assert (kept.mechanism, kept.iterations) == (principals.MECHANISM, 8192)
        assert _logs_in(kafka_bootstrap, user, password)

        # As a cell that never had it (the broker applies a change a moment
        # after it answers, as for ACLs: polled).
        principals.delete_users(admin, [user])
        wait_for(lambda: not _logs_in(kafka_bootstrap, user, password), 30, 0.2, "refused")

        conf = {"bootstrap.servers": kafka_bootstrap, **kafka.security("gateway", kafka_bootstrap)}
        scram.upsert(conf, user, kept)
        wait_for(lambda: _logs_in(kafka_bootstrap, user, password), 30, 0.2, "a login again")
        assert not _logs_in(kafka_bootstrap, user, password + "x")
    finally:
        principals.remove_tenant(admin, tenant_id)
