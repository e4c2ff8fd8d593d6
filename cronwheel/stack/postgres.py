"""A private PostgreSQL cluster for the local stack, from Debian's packages.

It lives under the project's state directory on its own port, is owned by the
`postgres` user when we run as root (PostgreSQL refuses root), and listens on
loopback only. The socket directory is private to the cluster's owner, so local
socket access as the superuser is trusted while TCP needs the role's password.

Its roles: the tables' owner `cronwheel` (migrations, tools; CREATEROLE), which
makes the roles the services log in as, `cronwheel_platform` and
`cronwheel_gateway`, and gives them the passwords config.LOCAL_ROLE_PASSWORDS
names (migration 0018 and `cronwheel migrate`; docs/tenancy.md, "Roles").
"""

from __future__ import annotations

import functools
import glob
import hashlib
import os
import subprocess
from pathlib import Path

import psycopg

from cronwheel import config
from cronwheel.stack.process import (
    StackError,
    as_user,
    chown_tree,
    is_root,
    pid_alive,
    port_open,
    read_pid,
    run,
    wait_until,
)

SERVICE_USER = "postgres"


def _bindir() -> Path | None:
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), reverse=True)
    return Path(candidates[0]).parent if candidates else None


def ensure_installed() -> Path:
    """Install Debian's `postgresql` package when the server binaries are missing."""
    bindir = _bindir()
    if bindir:
        return bindir
    if not is_root():
        raise StackError(
            "PostgreSQL server not installed: run `sudo apt-get install -y postgresql` "
            "or set DATABASE_URL"
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    run(["apt-get", "update", "-q"], "apt-get update", timeout=600, env=env)
    run(
        ["apt-get", "install", "-y", "-q", "--no-install-recommends", "postgresql"],
        "apt-get install postgresql",
        timeout=900,
        env=env,
    )
    # Debian's package starts a cluster of its own on 5432; we use our own.
    bindir = _bindir()
    if not bindir:
        raise StackError("apt-get installed postgresql but no pg_ctl was found")
    return bindir


def _owner() -> str | None:
    return SERVICE_USER if is_root() else None


def data_root(home: Path) -> Path:
    """The cluster directory: under `home`, unless the `postgres` user cannot reach
    it (a checkout inside a private directory), then a stable spot under /var/tmp."""
    preferred = home / "pg"
    if not is_root():
        return preferred
    probe = subprocess.run(
        as_user(SERVICE_USER, ["test", "-x", str(home.parent)]), capture_output=True
    )
    if probe.returncode == 0:
        return preferred
    digest = hashlib.sha256(str(home).encode()).hexdigest()[:10]
    return Path("/var/tmp") / f"cronwheel-{digest}" / "pg"


class LocalPostgres:
    def __init__(self, home: Path):
        self.home = home
        self.port = config.PG_PORT

    @functools.cached_property
    def root(self) -> Path:
        return data_root(self.home)

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def sock(self) -> Path:
        return self.root / "sock"

    @property
    def log(self) -> Path:
        return self.root / "postgres.log"

    @property
    def url(self) -> str:
        """The services' URL (the platform's role)."""
        return config.LOCAL_DATABASE_URL

    def pid(self) -> int | None:
        pid = read_pid(self.data / "postmaster.pid")
        return pid if pid_alive(pid) else None

    def running(self) -> bool:
        return self.pid() is not None

    def _superuser_conn(self, dbname: str = "postgres") -> psycopg.Connection:
        return psycopg.connect(
            host=str(self.sock), port=self.port, user="postgres", dbname=dbname, autocommit=True
        )

    def up(self) -> None:
        if self.running():
            self._ensure_role_and_db()  # a cluster made before the services' roles
            return
        bindir = ensure_installed()
        if port_open(self.port):
            raise StackError(
                f"port {self.port} is taken by another process: set CRONWHEEL_PG_PORT "
                "or DATABASE_URL"
            )
        owner = _owner()
        if not (self.data / "PG_VERSION").exists():
            self.root.mkdir(parents=True, exist_ok=True)
            self.sock.mkdir(exist_ok=True)
            if owner:
                chown_tree(self.root, owner)
            os.chmod(self.root, 0o700)
            os.chmod(self.sock, 0o700)
            run(
                as_user(
                    owner,
                    [
                        str(bindir / "initdb"),
                        "-D",
                        str(self.data),
                        "-U",
                        "postgres",
                        "--auth-local=trust",
                        "--auth-host=scram-sha-256",
                        "-E",
                        "UTF8",
                        "--locale=C",
                    ],
                ),
                "initdb",
            )
            # Tuned for a test and dev box: durability off would hide fsync costs from
            # benchmarks, so only the sizes change.
            with open(self.data / "postgresql.auto.conf", "a") as f:
                f.write(
                    "max_connections = 300\nshared_buffers = '512MB'\n"
                    "max_locks_per_transaction = 256\nwal_level = replica\n"
                    "log_min_messages = warning\ntimezone = 'UTC'\n"
                )
        run(
            as_user(
                owner,
                [
                    str(bindir / "pg_ctl"),
                    "-D",
                    str(self.data),
                    "-l",
                    str(self.log),
                    "-o",
                    f"-p {self.port} -k {self.sock} -c listen_addresses=127.0.0.1"
                    # The churning tables (timers, outbox; migration 0006) need
                    # their dead index entries gone within seconds, not a minute.
                    " -c autovacuum_naptime=1s",
                    "-w",
                    "-t",
                    "60",
                    "start",
                ],
            ),
            "pg_ctl start",
            timeout=90,
        )
        wait_until(self._accepts, 60, "PostgreSQL", on_fail=self._log_tail)
        self._ensure_role_and_db()

    def _accepts(self) -> bool:
        try:
            with self._superuser_conn():
                return True
        except psycopg.OperationalError:
            return False

    def _log_tail(self) -> str:
        try:
            return ": " + self.log.read_text().strip().splitlines()[-1]
        except (OSError, IndexError):
            return ""

    def _ensure_role_and_db(self) -> None:
        with self._superuser_conn() as conn:
            if not conn.execute(
                "SELECT 1 FROM pg_roles WHERE rolname = %s", [config.PG_USER]
            ).fetchone():
                conn.execute(
                    f"CREATE ROLE {config.PG_USER} LOGIN CREATEDB PASSWORD '{config.PG_PASSWORD}'"
                )
            # The owner makes the services' roles (migration 0018) and gives
            # them their logins (`cronwheel migrate`); a cluster made before
            # them gets the right here.
            # Each statement below only where it changes something: every
            # `cronwheel up` (each xdist worker's, at once) comes here, and two
            # writers of one shared-catalog row fail ("tuple concurrently updated").
            if not conn.execute(
                "SELECT rolcreaterole FROM pg_roles WHERE rolname = %s", [config.PG_USER]
            ).fetchone()[0]:
                conn.execute(f"ALTER ROLE {config.PG_USER} CREATEROLE")
            if not conn.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", [config.PG_DATABASE]
            ).fetchone():
                conn.execute(f"CREATE DATABASE {config.PG_DATABASE} OWNER {config.PG_USER}")
            # Lets tests drop their databases while autovacuum works in them.
            # pg_signal_backend lets tests drop their databases while autovacuum
            # works in them. With pg_read_all_stats the owner sees the services'
            # sessions in pg_stat_activity, which log in as other roles now (the
            # benchmarks find each process's backends by client_port, a column
            # hidden from other roles).
            for granted in ("pg_signal_backend", "pg_read_all_stats"):
                if not conn.execute(
                    "SELECT pg_has_role(%s, %s, 'MEMBER')", [config.PG_USER, granted]
                ).fetchone()[0]:
                    conn.execute(f"GRANT {granted} TO {config.PG_USER}")

    def down(self) -> None:
        if not self.running():
            return
        bindir = _bindir()
        if bindir is None:
            return
        run(
            as_user(
                _owner(), [str(bindir / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop"]
            ),
            "pg_ctl stop",
            timeout=60,
        )
