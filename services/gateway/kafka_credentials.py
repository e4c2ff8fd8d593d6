"""A tenant's Kafka principal: made with the tenant, its password shown once,
rotated by the operator (CONTRACT.md, "Tenants' Kafka credentials").

The principal is made inside the request's transaction, before it commits:
when the broker does not answer, the tenant is not created either (503, the
client retries). A commit that fails after the broker made the principal
leaves a principal with no tenant, which can read nothing (no topic of its
prefix exists) and is replaced by the retry's. The password is in the answer
only: the idempotency store blanks `kafka.password` (idempotency.SECRET_PATHS)
and the database never holds it; the broker keeps only its salted SCRAM hash.
That credential (salt, iterations, SaltedPassword, the last sealed) is kept in
the tenant's row too, so a move can make the same one in another cell's broker
(cronwheel/store/tenant_credentials.py).
"""

from __future__ import annotations

from confluent_kafka import KafkaException

from cronwheel import config, kafka, principals
from cronwheel.store import tenant_credentials
from services.gateway.problems import Problem
from services.gateway.transactions import Gateway

KAFKA = {
    "type": ["object", "null"],
    "description": "the tenant's Kafka credentials; the password in this answer only"
    " (null where the broker takes clients without authentication)",
    "properties": {
        "bootstrap": {"type": "string"},
        "security_protocol": {"type": "string"},
        "sasl_mechanism": {"type": "string"},
        "username": {"type": "string"},
        "password": {"type": "string"},
        "group_prefix": {"type": "string"},
        "topic_prefix": {"type": "string"},
    },
}


def enabled(gw: Gateway) -> bool:
    """Tenants get principals where the platform itself authenticates with
    SASL and the operator has not turned it off (CRONWHEEL_KAFKA_TENANTS)."""
    auth = config.load(config.KafkaAuth)
    protocol = kafka.security("gateway", gw.bootstrap).get("security.protocol", "")
    return auth.tenants and protocol.startswith("SASL")


def provision(gw: Gateway, tenant_id: str, conn) -> dict | None:
    """The new tenant's principal and ACLs; its credentials, or None. The
    credential as the broker keeps it goes into the tenant's row, in the
    request's transaction (`conn`)."""
    if not enabled(gw):
        return None
    admin = gw.kafka_admin()
    password, kept = _ask_broker(
        lambda: principals.provision_tenant_kept(admin, gw.topics, tenant_id)
    )
    tenant_credentials.keep(conn, tenant_id, kept)
    return credentials(gw, tenant_id, password)


def rotate(gw: Gateway, tenant_id: str, conn) -> dict:
    """A new password for the tenant's principal (made, with its ACLs, if it
    had none: a tenant created before principals existed gets one here)."""
    if not enabled(gw):
        raise Problem(
            409,
            "CONFLICT",
            "the broker takes clients without authentication: there is no password to rotate",
        )
    return provision(gw, tenant_id, conn)


def credentials(gw: Gateway, tenant_id: str, password: str) -> dict:
    auth = config.load(config.KafkaAuth)
    conf = kafka.security("gateway", gw.bootstrap)
    return {
        "bootstrap": gw.bootstrap,
        "security_protocol": conf["security.protocol"],
        "sasl_mechanism": auth.mechanism,
        "username": principals.tenant_username(tenant_id),
        "password": password,
        "group_prefix": principals.tenant_group_prefix(gw.topics, tenant_id),
        "topic_prefix": principals.tenant_topic_prefix(gw.topics, tenant_id),
    }


def _ask_broker(fn):
    try:
        return fn()
    except (KafkaException, TimeoutError, RuntimeError) as e:
        raise Problem(
            503,
            "UNAVAILABLE",
            f"the broker did not make the tenant's Kafka principal: {e}",
            headers={"Retry-After": "1"},
        ) from e
