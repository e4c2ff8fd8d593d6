"""The demo tenant, job and workflow that `make run` creates, so a fresh machine
shows the system working: a job firing every 10 seconds onto the `demo` queue and
a four-node diamond workflow every 5 minutes on the same queue."""

from __future__ import annotations

import os
import secrets

import psycopg

from cronwheel import config, kafka, principals
from cronwheel.core.clock import now_ms
from cronwheel.kafka import Topics
from cronwheel.store.jobs import Jobs, create_tenant, hash_key, new_api_key
from cronwheel.store.sql_loader import queries
from cronwheel.store.workflows import Workflows

DEMO_TENANT = "demo"


def operator_key() -> str:
    """CRONWHEEL_OPERATOR_KEY, or a local one kept in the stack's state directory."""
    if key := os.environ.get("CRONWHEEL_OPERATOR_KEY"):
        return key
    path = config.project_home() / "operator-key"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("cwop_" + secrets.token_urlsafe(32) + "\n")
        path.chmod(0o600)
    return path.read_text().strip()


def demo_kafka(bootstrap: str, topics: Topics, tenant_id: str) -> kafka.Credentials | None:
    """The demo tenant's Kafka principal, with a new password each time (as the
    gateway makes one for `POST /v1/tenants`); None on a broker without SASL."""
    if "sasl.username" not in kafka.security("gateway", bootstrap):
        return None
    admin = kafka.admin(bootstrap, principal="gateway")
    password = principals.provision_tenant(admin, topics, tenant_id)
    return kafka.Credentials(principals.tenant_username(tenant_id), password)


def ensure_demo(dsn: str, topics: Topics) -> dict:
    """Create the demo tenant and job once; every call issues a fresh demo key
    (keys are stored hashed, so an old one cannot be shown again)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT tenant_id FROM tenants WHERE name = %s", [DEMO_TENANT]
        ).fetchone()
        if row is None:
            tenant = create_tenant(conn, DEMO_TENANT)
            Jobs(topics).create(
                conn,
                tenant,
                {
                    "name": "demo-every-10s",
                    "schedule": {"cron": "*/10 * * * * *", "timezone": "UTC"},
                    "target": {"type": "queue", "queue": "demo"},
                    "payload": {"hello": "cronwheel"},
                },
                now_ms(),
            )
            q = {"type": "queue", "queue": "demo"}
            Workflows(topics).create(
                conn,
                tenant,
                {
                    "name": "demo-diamond",
                    "schedule": {"cron": "*/5 * * * *", "timezone": "UTC"},
                    "nodes": [
                        {"name": "extract", "target": q},
                        {"name": "clean", "target": q, "depends_on": ["extract"]},
                        {"name": "enrich", "target": q, "depends_on": ["extract"]},
                        {"name": "load", "target": q, "depends_on": ["clean", "enrich"]},
                    ],
                },
                now_ms(),
            )
            return tenant
        key_id, secret = new_api_key(row[0])
        conn.execute(
            queries("jobs")["insert_api_key"],
            {"key_id": key_id, "tenant_id": row[0], "hash": hash_key(secret)},
        )
        return {"tenant_id": row[0], "name": DEMO_TENANT, "api_key": secret}
