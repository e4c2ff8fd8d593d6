"""The roles services log in as, and row-level security that fails closed
(migration 0018, docs/tenancy.md "Roles").

Two tenants are given a row in every table the gateway reaches, through the
gateway's own API. Then, for every table the catalog lists (so a table added
later is checked too): the gateway's role with no tenant scope reads no row,
or may not read the table at all; scoped to a tenant it reads that tenant's
rows and no other's; the platform's role and the operator's read them all.
And a service whose login could bypass the policies does not start."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from cronwheel import config
from cronwheel.core.ssrf import allowed_networks
from cronwheel.kafka import Topics
from cronwheel.stack.postgres import LocalPostgres
from cronwheel.store import roles
from cronwheel.store.db import UnsafeRole, refuse_unsafe_role
from cronwheel.store.jobs import hash_key
from services.gateway.app import create_app
from tests.support.gateway import served

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
OPERATOR_KEY = "cwop_db_roles_operator_key_0123456789abcdef"
TABLES = """
SELECT c.relname FROM pg_class c
 WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'p')
 ORDER BY c.relname
"""


def _job(name: str, target: dict) -> dict:
    return {"name": name, "schedule": {"every_ms": 60_000}, "target": target}


def _tenant_world(client, name: str) -> dict:
    """A tenant with a second key, object and rate quotas, a queue job (its run
    started), a webhook job (its signing secret), a workflow run, and an
    Idempotency-Key: a row in every table the gateway reaches."""
    op = {"Authorization": f"Bearer {OPERATOR_KEY}"}
    r = client.post("/v1/tenants", json={"name": name}, headers=op)
    assert r.status_code == 201, r.text
    tid, key = r.json()["tenant_id"], r.json()["api_key"]
    me = {"Authorization": f"Bearer {key}"}
    quotas = {"fire": {"rate_per_s": 100}, "dispatch": {"rate_per_s": 100}}
    assert client.put(f"/v1/tenants/{tid}/quotas", json=quotas, headers=op).status_code == 200
    limits = {"jobs": 50}
    r = client.put(f"/v1/tenants/{tid}/quotas/objects", json=limits, headers=op)
    assert r.status_code == 200, r.text
    assert client.post("/v1/keys", json={"label": "second"}, headers=me).status_code == 201
    queue = _job("q", {"type": "queue", "queue": "work"})
    r = client.post("/v1/jobs", json=queue, headers={**me, "Idempotency-Key": f"{name}-q"})
    assert r.status_code == 201, r.text
    run = client.post(f"/v1/jobs/{r.json()['job_id']}/trigger", headers=me).json()["run_id"]
    r = client.post(f"/v1/runs/{run}/start", json={"worker_id": "w"}, headers=me)
    assert r.status_code == 200, r.text
    hook = _job("h", {"type": "webhook", "url": "http://127.0.0.1:9/hook"})
    assert client.post("/v1/jobs", json=hook, headers=me).status_code == 201
    wf = {"name": "wf", "nodes": [{"name": "a", "target": {"type": "queue", "queue": "w"}}]}
    r = client.post("/v1/workflows", json=wf, headers=me)
    assert r.status_code == 201, r.text
    r = client.post(f"/v1/workflows/{r.json()['workflow_id']}/trigger", headers=me)
    assert r.status_code in (200, 201), r.text
    return {"tenant_id": tid, "key": key}


@pytest.fixture
def world(database_url, kafka_bootstrap, topic_prefix):
    app = create_app(
        database_url,
        Topics(topic_prefix),
        kafka_bootstrap,
        OPERATOR_KEY,
        webhook_allow=allowed_networks("127.0.0.0/8"),
    )
    with served(app) as client:
        return _tenant_world(client, "roles-a"), _tenant_world(client, "roles-b")


def _tables(conn) -> list[str]:
    return [r[0] for r in conn.execute(TABLES)]


def _gateway_reads(conn) -> list[str]:
    """The tables the gateway's role may read at all."""
    return [
        t
        for t in _tables(conn)
        if conn.execute(
            "SELECT has_table_privilege(%s, %s, 'SELECT')", [roles.GATEWAY, f"public.{t}"]
        ).fetchone()[0]
    ]


def _rows(conn, table: str) -> set[str]:
    return {r[0] for r in conn.execute(f'SELECT t::text FROM public."{table}" AS t')}


def test_gateway_role__no_tenant_scope__reads_no_row_of_any_table(
    world, database_url, gateway_database_url
):
    with psycopg.connect(database_url, autocommit=True) as platform:
        every = _tables(platform)
        readable = _gateway_reads(platform)
        seeded = {t: len(_rows(platform, t)) for t in readable}
    assert set(readable) < set(every)  # the outbox, leases, processed... are not the gateway's
    assert all(seeded.values()), f"seed a row in each table the gateway reads: {seeded}"
    with psycopg.connect(gateway_database_url, autocommit=True) as gw:
        assert gw.execute("SELECT current_user").fetchone()[0] == roles.GATEWAY
        for scope in (None, "", "!none", "ten_nobody"):
            for table in every:
                with gw.transaction():
                    if scope is not None:
                        gw.execute("SELECT set_config('cronwheel.tenant_id', %s, true)", [scope])
                    try:
                        n = gw.execute(f'SELECT count(*) FROM public."{table}"').fetchone()[0]
                    except psycopg.errors.InsufficientPrivilege:
                        assert table not in readable
                        continue
                assert n == 0, (table, scope, n)


def test_gateway_role__scoped_to_a_tenant__reads_its_rows_and_no_others(
    world, database_url, gateway_database_url
):
    a, b = world
    with psycopg.connect(database_url, autocommit=True) as platform:
        readable = _gateway_reads(platform)
        every_row = {t: _rows(platform, t) for t in readable}
    seen = {}
    with psycopg.connect(gateway_database_url, autocommit=True) as gw:
        for who in (a, b):
            with gw.transaction():
                row = gw.execute(
                    "SELECT tenant_id FROM cronwheel_authenticate(%s)", [hash_key(who["key"])]
                ).fetchone()
                assert row == (who["tenant_id"],)
                seen[who["tenant_id"]] = {t: _rows(gw, t) for t in readable}
    for t in readable:
        of_a, of_b = seen[a["tenant_id"]][t], seen[b["tenant_id"]][t]
        assert of_a and of_b, f"each tenant has a row in {t}"
        assert not of_a & of_b, f"{t}: a row seen by both tenants"
        assert of_a | of_b == every_row[t], f"{t}: a tenant's scope hides its own rows"
        assert b["tenant_id"] not in " ".join(of_a) and a["tenant_id"] not in " ".join(of_b)


def test_operator_role__only_after_set_local_role__reads_every_row(
    world, database_url, gateway_database_url
):
    with psycopg.connect(database_url, autocommit=True) as platform:
        readable = _gateway_reads(platform)
        counts = {t: len(_rows(platform, t)) for t in readable}
    with psycopg.connect(gateway_database_url, autocommit=True) as gw:
        with gw.transaction():
            gw.execute("SET LOCAL ROLE cronwheel_operator")
            assert {t: len(_rows(gw, t)) for t in readable} == counts
        # The role ended with the transaction: the gateway again, seeing nothing.
        assert gw.execute("SELECT current_user").fetchone()[0] == roles.GATEWAY
        assert gw.execute("SELECT count(*) FROM tenants").fetchone()[0] == 0


def test_roles__none_can_bypass_row_level_security(database_url):
    with psycopg.connect(database_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT rolname, rolsuper, rolbypassrls, rolinherit FROM pg_roles"
            " WHERE rolname = ANY(%s) ORDER BY rolname",
            [[roles.PLATFORM, roles.GATEWAY, roles.OPERATOR]],
        ).fetchall()
        owners = conn.execute(
            "SELECT DISTINCT pg_get_userbyid(relowner) FROM pg_class"
            " WHERE relnamespace = 'public'::regnamespace AND relrowsecurity"
        ).fetchall()
    # No superuser, no BYPASSRLS; the gateway does not inherit the operator's policies.
    assert rows == [
        (roles.GATEWAY, False, False, False),
        (roles.OPERATOR, False, False, True),
        (roles.PLATFORM, False, False, True),
    ]
    assert {o for (o,) in owners}.isdisjoint({roles.PLATFORM, roles.GATEWAY, roles.OPERATOR})


def test_every_table__the_platforms__and_with_policies_for_all_three_roles(database_url):
    """A migration that adds a table grants it and, with row-level security,
    gives it the gateway's scope and the platform's and operator's policies."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        for table in _tables(conn):
            assert conn.execute(
                "SELECT has_table_privilege(%s, %s, 'SELECT, INSERT, UPDATE, DELETE')",
                [roles.PLATFORM, f"public.{table}"],
            ).fetchone()[0], f"GRANT ... ON {table} TO {roles.PLATFORM}"
        policies = conn.execute(
            "SELECT c.relname, array_agg(p.polname ORDER BY p.polname)"
            "  FROM pg_class c LEFT JOIN pg_policy p ON p.polrelid = c.oid"
            " WHERE c.relnamespace = 'public'::regnamespace AND c.relrowsecurity"
            " GROUP BY c.relname"
        ).fetchall()
    assert policies
    for table, names in policies:
        assert names == ["operator", "platform", "tenant_scope"], table


# -- a service whose login bypasses the policies does not start ---------------------


def _serve_timer(dsn: str) -> subprocess.CompletedProcess:
    """`cronwheel serve timer` as an operator starts it, with DATABASE_URL=dsn."""
    env = {**os.environ, "DATABASE_URL": dsn, "CRONWHEEL_LOG_LEVEL": "INFO"}
    return subprocess.run(
        [sys.executable, "-m", "services.entrypoints", "serve", "timer"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )


def _superuser_url(servers, admin_url: str) -> str:
    """A superuser's URL of the test's database: the local stack's superuser
    over its private socket, or the admin's where that is a superuser."""
    with psycopg.connect(admin_url) as conn:
        if conn.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user").fetchone()[0]:
            return admin_url
    if servers.source != "local stack":
        pytest.skip("no superuser login to this server")
    pg = LocalPostgres(config.project_home())
    name = admin_url.rpartition("/")[2]
    return f"postgresql://postgres@/{name}?host={pg.sock}&port={pg.port}"


def _refused(p: subprocess.CompletedProcess, role: str, why: str) -> None:
    assert p.returncode == 1, p.stderr
    assert p.stderr.count("\n") == 1, p.stderr
    assert p.stderr.startswith(f"cronwheel: refusing to start: database role {role!r} {why}")


def test_serve__superuser_login__exits_1_with_one_line(servers, admin_database_url):
    url = _superuser_url(servers, admin_database_url)
    with psycopg.connect(url) as conn:
        role = conn.execute("SELECT current_user").fetchone()[0]
    _refused(_serve_timer(url), role, "is a superuser")


def test_serve__bypassrls_login__exits_1_with_one_line(servers, admin_database_url):
    superuser = _superuser_url(servers, admin_database_url)
    role, password = f"cw_bypass_{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    with psycopg.connect(superuser, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN BYPASSRLS PASSWORD '{password}'")
        try:
            parts = urlsplit(admin_database_url)
            host = parts.netloc.rpartition("@")[2]
            url = urlunsplit(parts._replace(netloc=f"{role}:{password}@{host}"))
            _refused(_serve_timer(url), role, "has BYPASSRLS")
        finally:
            conn.execute(f"DROP ROLE {role}")


def test_serve__table_owner_login__exits_1_with_one_line(admin_database_url):
    with psycopg.connect(admin_database_url) as conn:
        owner = conn.execute("SELECT current_user").fetchone()[0]
    _refused(_serve_timer(admin_database_url), owner, "owns table api_keys")


def test_refuse_unsafe_role__the_services_roles_pass__the_owner_does_not(
    database_url, gateway_database_url, admin_database_url
):
    refuse_unsafe_role(database_url)
    refuse_unsafe_role(gateway_database_url)
    with pytest.raises(UnsafeRole, match="owns table api_keys"):
        refuse_unsafe_role(admin_database_url)
