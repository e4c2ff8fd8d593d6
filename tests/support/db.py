"""One database per test, cloned from a migrated template (fast: a file copy).

The template is made and migrated by the owner (the admin URL); a test hands
its services the URL of the role they log in as in production: the platform's
for the internal services (and the tests' own reads and writes), the gateway's
for a gateway (migration 0018, docs/tenancy.md "Roles")."""

from __future__ import annotations

import hashlib
import time
import uuid
from urllib.parse import urlsplit, urlunsplit

import psycopg

from cronwheel import config
from cronwheel.store import roles
from cronwheel.store.migrate import MIGRATIONS_DIR, migrate


def with_dbname(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + name))


def platform_url(url: str) -> str:
    return config.role_url(url, roles.PLATFORM)


def gateway_url(url: str) -> str:
    return config.role_url(url, roles.GATEWAY)


def lock_waits(conn: psycopg.Connection, application: str | None = None) -> list[str]:
    """The statements that sessions of this database (of `application`, when
    given) are waiting in for a lock now, by pg_stat_activity: how a test
    proves a service reached the lock it holds for it."""
    sql = (
        "SELECT query FROM pg_stat_activity"
        " WHERE datname = current_database() AND wait_event_type = 'Lock'"
    )
    if application is None:
        return [q for (q,) in conn.execute(sql).fetchall()]
    return [q for (q,) in conn.execute(sql + " AND application_name = %s", [application])]


# Tests create tables of their own beside the schema (the SDK example's
# effects): in test databases only, the platform's role may.
_TEST_ONLY_GRANT = "GRANT CREATE ON SCHEMA public TO cronwheel_platform"


def _migrations_digest() -> str:
    h = hashlib.sha256()
    for path in sorted(MIGRATIONS_DIR.glob("*.sql")):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:12]


def template(admin_url: str, *, contract: bool = True) -> str:
    """Create (once per migration set) a migrated template database; return its name.

    `contract=False`: the expand steps only, the contract steps pending (a
    template of its own name), as a platform has its schema mid-upgrade, when
    `cronwheel migrate` has run and `cronwheel migrate --contract` has not."""
    kind = "" if contract else "expand_"
    name = f"cw_template_{kind}{_migrations_digest()}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute("SELECT pg_advisory_lock(4242)")
        try:
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
            if not exists:
                conn.execute(f'CREATE DATABASE "{name}"')
                try:
                    migrate(with_dbname(admin_url, name), contract=contract)
                    with psycopg.connect(with_dbname(admin_url, name), autocommit=True) as db:
                        db.execute(_TEST_ONLY_GRANT)
                except Exception:
                    conn.execute(f'DROP DATABASE "{name}"')
                    raise
        finally:
            conn.execute("SELECT pg_advisory_unlock(4242)")
    return name


def clone(admin_url: str, template_name: str) -> str:
    name = f"cw_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template_name}"')
    return name


def drop(admin_url: str, name: str) -> None:
    """Drop a test database. An autovacuum worker inside it can make FORCE fail for
    a non-superuser (InsufficientPrivilege); it finishes quickly, so try again."""
    deadline = time.monotonic() + 30
    with psycopg.connect(admin_url, autocommit=True) as conn:
        while True:
            try:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
                return
            except (psycopg.errors.InsufficientPrivilege, psycopg.errors.ObjectInUse):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)  # retry pacing while autovacuum leaves
