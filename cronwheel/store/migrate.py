"""Numbered, forward-only SQL migrations, applied by `cronwheel migrate`.

Files are `migrations/NNNN_name.sql`. Each runs in its own transaction and is
recorded in `schema_migrations`; a session advisory lock makes two concurrent
`migrate` calls safe (the second waits, polling, then finds nothing to do). A file whose
first line is `-- cronwheel: no-transaction` runs outside a transaction (for
`CREATE INDEX CONCURRENTLY` in contract/expand steps on big tables).

A file named `NNNN_contract_name.sql` is a contract step: it removes what no
running version reads any more, so it waits until the operator asks for it
(`cronwheel migrate --contract`) once every instance runs a release that no
longer needs the old shape. Every other file is an expand step, safe beside the
previous release, and `cronwheel migrate` applies those alone. A contract step
only drops, so the expand steps numbered after it apply without it.
See docs/migrations.md for the expand / migrate / contract rule.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path

import psycopg

from cronwheel import config
from cronwheel.store import partition_indexes, roles

MIGRATIONS_DIR = Path(__file__).with_name("migrations")
LOCK_KEY = 0x63726F6E  # "cron": one advisory lock id for every migrate call
NO_TX_MARKER = "-- cronwheel: no-transaction"
CONTRACT_PREFIX = "contract_"
_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    path: Path

    @property
    def sql(self) -> str:
        return self.path.read_text()

    @property
    def contract(self) -> bool:
        """A contract step: applied only when asked (`cronwheel migrate --contract`)."""
        return self.name.startswith(CONTRACT_PREFIX)

    @property
    def transactional(self) -> bool:
        return not self.sql.lstrip().startswith(NO_TX_MARKER)


def discover(directory: Path = MIGRATIONS_DIR) -> list[Migration]:
    found = []
    for path in sorted(directory.glob("*.sql")):
        m = _NAME.match(path.name)
        if not m:
            raise ValueError(f"migration file name must be NNNN_name.sql: {path.name}")
        found.append(Migration(int(m.group(1)), m.group(2), path))
    versions = [m.version for m in found]
    if versions != list(range(1, len(found) + 1)):
        raise ValueError(f"migration numbers must run 1..N without gaps, got {versions}")
    return found


def applied_versions(conn: psycopg.Connection) -> set[int]:
    exists = conn.execute("SELECT to_regclass('schema_migrations') IS NOT NULL").fetchone()[0]
    if not exists:
        return set()
    return {row[0] for row in conn.execute("SELECT version FROM schema_migrations")}


def _lock(conn: psycopg.Connection, timeout_s: float = 600.0) -> None:
    """Take the migration lock, waiting *between* statements: a session blocked
    inside pg_advisory_lock holds a snapshot, and CREATE INDEX CONCURRENTLY in
    the holder's migration waits for every such snapshot to end, a deadlock."""
    deadline = time.monotonic() + timeout_s
    while not conn.execute("SELECT pg_try_advisory_lock(%s)", [LOCK_KEY]).fetchone()[0]:
        if time.monotonic() > deadline:
            raise TimeoutError(f"another migrate held the lock for over {timeout_s:.0f} s")
        time.sleep(0.1)  # poll pacing while another migrate works


def _apply_in_transaction(conn: psycopg.Connection, sql: str, record: str, mig: Migration) -> None:
    with conn.transaction():
        conn.execute(sql)
        conn.execute(record, [mig.version, mig.name])


def _is_cluster_race(e: psycopg.Error) -> bool:
    """Two sessions changed the same shared-catalog row (a role, a membership)
    at once: `tuple concurrently updated`, or a role made by the other between
    this one's check and its CREATE ROLE."""
    if isinstance(e, psycopg.errors.InternalError):
        return "concurrently updated" in str(e)
    if isinstance(e, psycopg.errors.UniqueViolation | psycopg.errors.DuplicateObject):
        return "pg_auth" in str(e) or "role" in str(e)
    return False


def _retry_cluster_race(step, *args, attempts: int = 8) -> None:
    """Run `step`, again after a short pause when it lost a cluster race.

    The advisory lock is per database, but roles belong to the cluster: two
    databases of one cluster migrating at once (a test's clones, two cells
    on one server) both run 0018's role statements and set_logins' ALTER
    ROLE, and PostgreSQL fails the later writer of the same pg_authid row
    rather than making it wait. The step is idempotent (its transaction
    rolled back, or ALTER ROLE sets the same thing again), so retrying it is
    exact."""
    for attempt in range(attempts):
        try:
            step(*args)
            return
        except psycopg.Error as e:
            if attempt == attempts - 1 or not _is_cluster_race(e):
                raise
            time.sleep(0.05 * (attempt + 1))


def pending(dsn: str, directory: Path = MIGRATIONS_DIR) -> list[Migration]:
    """The migrations not yet applied to the database at `dsn`, in order."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        done = applied_versions(conn)
    return [m for m in discover(directory) if m.version not in done]


def migrate(
    dsn: str, directory: Path = MIGRATIONS_DIR, *, contract: bool = True
) -> list[Migration]:
    """Apply pending migrations in order; returns those applied by this call.

    `contract=False` leaves the contract steps pending (what `cronwheel
    migrate` does unless given `--contract`). The default applies every step:
    the tests, benchmarks and the schema snapshot run this release's code on
    this release's whole schema.

    Then the services' roles (migration 0018) get their logins, with the
    passwords of config.role_passwords() (CRONWHEEL_DB_PLATFORM_PASSWORD,
    CRONWHEEL_DB_GATEWAY_PASSWORD, or the local stack's; docs/tenancy.md
    "Roles"): a role belongs to the cluster, its password to the deployment,
    neither to a migration file. Last, the indexes a step declared on a
    partitioned table alone are built on each partition
    (store/partition_indexes.py)."""
    pending_all = [m for m in discover(directory) if contract or not m.contract]
    applied: list[Migration] = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        _lock(conn)
        try:
            conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations ("
                " version int PRIMARY KEY, name text NOT NULL,"
                " applied_at timestamptz NOT NULL DEFAULT now())"
            )
            done = applied_versions(conn)
            for mig in pending_all:
                if mig.version in done:
                    continue
                sql = mig.sql
                record = "INSERT INTO schema_migrations (version, name) VALUES (%s, %s)"
                if not mig.transactional:
                    conn.execute(sql)
                    conn.execute(record, [mig.version, mig.name])
                else:
                    _retry_cluster_race(_apply_in_transaction, conn, sql, record, mig)
                applied.append(mig)
            _retry_cluster_race(roles.set_logins, conn, config.role_passwords())
            # A step's indexes declared ON ONLY a partitioned parent, built
            # partition by partition without stopping its writers; after the
            # logins, which a failed or slow build must not hold back.
            partition_indexes.complete(conn)
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", [LOCK_KEY])
    return applied
