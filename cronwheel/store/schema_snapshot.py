"""The whole current schema in one file: `cronwheel/store/schema.sql`.

`dump(admin_url)` migrates a scratch database on the server of `admin_url`
(every step, contract ones too), takes `pg_dump --schema-only` of it and cleans
the dump of what depends on the session or the dumping tool rather than on the
migrations: the session `SET`s, the version comments, the `\\restrict` token of
newer pg_dump builds and the owner (the role running the migrations). What is
left is tables, indexes, functions, triggers, policies and grants, in pg_dump's
order (by kind of object, then by name), so a new migration changes the file
only where it changes the schema. `cronwheel migrate --dump-schema` (`make
schema`) writes it; tests/integration/test_schema_snapshot.py checks that the
migrations still give exactly the file.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import uuid
from pathlib import Path

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from cronwheel.store.migrate import MIGRATIONS_DIR, migrate

SCHEMA_FILE = Path(__file__).with_name("schema.sql")
REGENERATE = "make schema"  # runs `cronwheel migrate --dump-schema`

HEADER = f"""\
-- cronwheel's whole database schema: what every migration, applied in order,
-- makes of an empty database (tests/integration/test_schema_snapshot.py checks it).
-- Generated: do not edit. After adding a migration run `{REGENERATE}`
-- (`cronwheel migrate --dump-schema`) and commit this file with it, and run
-- `make check-migrations` (squawk: docs/migrations.md, The migration lint).
-- pg_dump --schema-only --no-owner of PostgreSQL {{major}}, session settings removed.
"""

# Lines of pg_dump's output that say how it was dumped, not what the schema is.
_NOISE = re.compile(
    r"^(\\(un)?restrict .*"
    r"|-- Dumped (from|by) .*"
    r"|-- PostgreSQL database dump.*"
    r"|SET [a-z_]+ = .*;"
    r"|SELECT pg_catalog\.set_config\('search_path', '', false\);)$"
)


class SnapshotError(Exception):
    """The schema could not be dumped (no pg_dump, or it failed)."""


def pg_dump_binary(server_major: int) -> str:
    """A pg_dump of the server's major version: Debian's for that version (the
    local stack's), else the one on PATH (it refuses a newer server itself)."""
    debian = Path(f"/usr/lib/postgresql/{server_major}/bin/pg_dump")
    if debian.exists():
        return str(debian)
    found = shutil.which("pg_dump")
    if not found:
        raise SnapshotError(
            f"pg_dump not found: install PostgreSQL {server_major}'s client "
            f"(apt-get install postgresql-client-{server_major})"
        )
    return found


def clean(raw: str, server_major: int) -> str:
    """The dump without its session noise, blank runs squeezed, under HEADER."""
    kept = [line.rstrip() for line in raw.splitlines() if not _NOISE.match(line)]
    body = "\n".join(kept).replace("; Owner: -\n", "\n")
    body = re.sub(r"^--\n--\n", "", body, flags=re.M)  # comment boxes left empty
    body = re.sub(r"\n{3,}", "\n\n", body).strip("\n")
    return HEADER.format(major=server_major) + "\n" + body + "\n"


def _pg_env(url: str) -> tuple[dict[str, str], str]:
    """pg_dump's connection as libpq variables, so no password shows in its argv."""
    params = conninfo_to_dict(url)
    env = {**os.environ}
    mapping = {"host": "PGHOST", "port": "PGPORT", "user": "PGUSER", "password": "PGPASSWORD"}
    for key, var in mapping.items():
        if params.get(key):
            env[var] = str(params[key])
    if params.get("sslmode"):
        env["PGSSLMODE"] = str(params["sslmode"])
    return env, str(params["dbname"])


def dump_database(url: str) -> str:
    """The cleaned schema of the database at `url`, as it is now."""
    with psycopg.connect(url) as conn:
        major = conn.info.server_version // 10000
    env, dbname = _pg_env(url)
    proc = subprocess.run(
        [pg_dump_binary(major), "--schema-only", "--no-owner", "--dbname", dbname],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if proc.returncode != 0:
        raise SnapshotError(f"pg_dump failed: {proc.stderr.strip()}")
    return clean(proc.stdout, major)


def dump(admin_url: str, directory: Path = MIGRATIONS_DIR) -> str:
    """Migrate a scratch database on `admin_url`'s server with every step and
    return its cleaned schema; the scratch database is dropped afterwards."""
    name = f"cw_schema_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = make_conninfo(admin_url, dbname=name)
    try:
        migrate(url, directory)
        return dump_database(url)
    finally:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def write(admin_url: str, path: Path = SCHEMA_FILE) -> Path:
    path.write_text(dump(admin_url))
    return path
