"""The roles services log in as (migration 0018; docs/tenancy.md, "Roles").

`cronwheel_platform` (the internal services), `cronwheel_gateway` (the HTTP
gateway, which becomes `cronwheel_operator` for an operator request) are the
cluster's, made by 0018 where missing; the tables' owner is none of them.
Here: their logins (`cronwheel migrate` gives them the passwords of
config.role_passwords()), and what a login could do past row-level security.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

import psycopg
from psycopg import sql

from cronwheel import config
from cronwheel.store.sql_loader import queries

# The names migration 0018 and roles.sql give them.
PLATFORM = config.PG_PLATFORM_USER
GATEWAY = config.PG_GATEWAY_USER
OPERATOR = "cronwheel_operator"


@functools.cache
def _q() -> dict[str, str]:
    return queries("roles")


def set_logins(conn: psycopg.Connection, passwords: Mapping[str, str]) -> None:
    """Each role of `passwords` that exists may log in with its password (a
    role 0018 has not made yet is left for the run that applies it)."""
    found = {r for (r,) in conn.execute(_q()["existing"], {"names": list(passwords)})}
    for role, password in passwords.items():
        if role in found:
            set_login(conn, role, password)


def set_login(conn: psycopg.Connection, role: str, password: str) -> None:
    """`role` may log in with `password`, stored as a SCRAM verifier that
    libpq computes here (the server never sees the password)."""
    verifier = conn.pgconn.encrypt_password(password.encode(), role.encode(), b"scram-sha-256")
    conn.execute(
        sql.SQL(_q()["set_login"]).format(
            role=sql.Identifier(role), verifier=sql.Literal(verifier.decode())
        )
    )


def session_role(conn: psycopg.Connection) -> tuple[str, bool, bool, str | None]:
    """(login, superuser, BYPASSRLS, a table with policies it owns or None)."""
    return conn.execute(_q()["session_role"]).fetchone()
