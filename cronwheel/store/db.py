"""Connections for the services' loops, the one reconnect policy they share,
transactions in pipeline mode, and the check that a service's login cannot
bypass row-level security."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator

import psycopg
from psycopg import pq

from cronwheel import config
from cronwheel.store import roles


class UnsafeRole(RuntimeError):
    """A service's database login could bypass row-level security (one line)."""


def refuse_unsafe_role(dsn: str | None = None) -> None:
    """UnsafeRole, before a service starts, when its login (`dsn`, default the
    services' DATABASE_URL) is a superuser, has BYPASSRLS, or owns a table with
    policies: each of those sees every tenant's rows whatever the policies say
    (migration 0018). Waits out a database that is away, as the services do."""
    dsn = dsn or config.load(config.Common).database_url
    login = Reconnecting(dsn, _log)
    try:
        name, superuser, bypassrls, owns = login.call(roles.session_role, None)
    finally:
        login.close()
    if superuser:
        why = "is a superuser"
    elif bypassrls:
        why = "has BYPASSRLS"
    elif owns:
        why = f"owns table {owns} (an owner bypasses its policies)"
    else:
        return
    raise UnsafeRole(
        f"refusing to start: database role {name!r} {why}; services log in as a role that is "
        "neither superuser nor BYPASSRLS and owns no table, e.g. cronwheel_platform "
        "(docs/tenancy.md, Roles)"
    )


_log = logging.getLogger("cronwheel.db")

# What ends a connection the network lost without a word (packets dropped, no
# RST: a partition): data sent and not acknowledged for 10 s (tcp_user_timeout;
# the kernel looks at its retransmissions, so a query sent into a cut failed
# after 24 s here, tests/integration/test_lost_link.py), an idle connection
# whose keepalive probes go unanswered for ~19 s, and a connection attempt
# that has not completed in 5 s. The statement then fails
# as OperationalError, one of `LOST`, and the reconnect policy takes over. At
# the kernel's defaults a dispatcher cut off from PostgreSQL for 30 s waited
# for its next TCP retransmission, up to ~25 s after the cut healed
# (docs/reliability.md, "Cut off, and back"). None of these bounds a query's
# running time: a busy server still acknowledges what it was sent.
LINK_LIMITS = {
    "connect_timeout": 5,
    "tcp_user_timeout": 10_000,
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 3,
    "keepalives_count": 3,
}


def link(dsn: str) -> psycopg.Connection:
    """An autocommit connection whose loss in the network ends in an error
    (LINK_LIMITS): every connection a service's loop or watch keeps."""
    return psycopg.connect(dsn, autocommit=True, **LINK_LIMITS)


def connect(dsn: str, *, idle_tx_timeout_ms: int | None = None) -> psycopg.Connection:
    """An autocommit connection (transactions are explicit `with conn.transaction()`).

    `idle_tx_timeout_ms` bounds how long a frozen process (SIGSTOP, a hang, a
    partition) can hold a transaction's row locks: the server ends it, so a new
    lease owner is not blocked by claimed timers or share-locked lease rows for
    longer than about one lease TTL.
    """
    conn = link(dsn)
    if idle_tx_timeout_ms:
        conn.execute(
            "SELECT set_config('idle_in_transaction_session_timeout', %s, false)",
            [f"{int(idle_tx_timeout_ms)}ms"],
        )
    return conn


# The reconnect policy, the same for every service loop: a failure to reach
# PostgreSQL is waited out 0.1 s, then twice as long each time, at most 5 s.
RECONNECT_FIRST_S = 0.1
RECONNECT_MAX_S = 5.0
_NEVER = threading.Event()  # a `stop` that never comes
# What a new connection mends. psycopg raises OperationalError when the
# server cannot be reached or ended the session, but InternalError for a
# session ended for idling in a transaction (25P03,
# idle_in_transaction_session_timeout): what a service cut off from the
# database inside a transaction hears first (a timer in pg_partition exited
# on it, CI 2026-12-03).
LOST = (psycopg.OperationalError, psycopg.errors.IdleInTransactionSessionTimeout)


class Backoff:
    """The waits between tries while the database is away (the policy above).
    Only `LOST` is waited out: the server restarted, ended the session
    (`pg_terminate_backend`, an idle transaction's timeout), or cannot be
    reached; psycopg also raises OperationalError for a deadlock or a
    cancelled statement, which a new try mends as well. Every other error is
    the caller's."""

    def __init__(self, log: logging.Logger) -> None:
        self.log = log
        self.delay = RECONNECT_FIRST_S

    def wait(self, exc: BaseException, stop: threading.Event) -> bool:
        """Log `exc` and wait the next delay; True if `stop` came meanwhile."""
        self.log.warning("database unavailable (%s); retrying in %.1fs", exc, self.delay)
        stopped = stop.wait(self.delay)
        self.delay = min(self.delay * 2, RECONNECT_MAX_S)
        return stopped

    def reset(self) -> None:
        self.delay = RECONNECT_FIRST_S


class Reconnecting:
    """One connection that outlives database restarts: `call` runs `fn(conn)`,
    reconnecting with the policy's backoff while the database is away."""

    def __init__(self, dsn: str, log: logging.Logger) -> None:
        self.dsn = dsn
        self.log = log
        self.conn: psycopg.Connection | None = None

    def connection(self) -> psycopg.Connection:
        """The connection, opened again if it was closed or never opened."""
        if self.conn is None or self.conn.closed:
            self.conn = link(self.dsn)
        return self.conn

    def call(self, fn, stop: threading.Event | None, stopped=None, *, tries: int | None = None):
        """`fn(conn)`; `stopped` when `stop` is set while waiting to reconnect.
        `stop` None: no stop request ends the waits (work that must be done
        while stopping). With `tries`, the last error is raised after that
        many failures."""
        backoff = Backoff(self.log)
        failures = 0
        while True:
            try:
                return fn(self.connection())
            except LOST as exc:
                self.close()
                failures += 1
                if tries is not None and failures >= tries:
                    raise
                if backoff.wait(exc, stop or _NEVER):
                    return stopped

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def keep_connected(loop, stop: threading.Event, log: logging.Logger) -> None:
    """Run `loop(stop)` until it returns, starting it again (with the policy's
    backoff) each time it loses the database: a loop that holds connections of
    its own (a LISTEN, a transaction per pass) opens them again, and the
    service outlives a PostgreSQL restart instead of exiting. The backoff
    starts afresh after a loop that ran longer than the longest wait."""
    backoff = Backoff(log)
    while not stop.is_set():
        began = time.monotonic()
        try:
            loop(stop)
            return
        except LOST as exc:
            if time.monotonic() - began > RECONNECT_MAX_S:
                backoff.reset()
            if backoff.wait(exc, stop):
                return


@contextlib.contextmanager
def pipelined_transaction(conn) -> Iterator[psycopg.Pipeline]:
    """BEGIN ... COMMIT in psycopg's pipeline mode. Not `conn.transaction()`: in a
    pipeline it syncs after BEGIN and again after COMMIT, two more round trips.
    BEGIN goes out with the caller's first statement, which it should end with
    the pipeline's `sync()` (libpq learns it is in a transaction only then);
    COMMIT with what nobody reads (outbox row, notify) in the final sync."""
    try:
        with conn.pipeline() as pipeline:
            conn.execute(_BEGIN)
            yield pipeline
            conn.execute(_COMMIT)
    except BaseException:
        if conn.pgconn.transaction_status != pq.TransactionStatus.IDLE:
            with contextlib.suppress(psycopg.Error):
                conn.execute(_ROLLBACK)
        raise


_BEGIN, _COMMIT, _ROLLBACK = b"BEGIN", b"COMMIT", b"ROLLBACK"
