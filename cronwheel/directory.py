"""The directory as routers and gateways see it: a read-through cache over
cronwheel/store/directory.py (docs/cells.md, "The directory").

What holds:
- An answer (a tenant's placement, or that the directory has none; the list
  of cells) is served from the cache for `ttl_s` after it was read, then read
  again on the next ask.
- Stale-while-error: when that read fails (the directory's database is down
  or slow past `timeout_s`), the last answer is served on, and the database
  is asked again at most once per `retry_s` per entry; routing goes on from
  the cache for as long as the directory is away. A tenant the cache never
  saw cannot be routed meanwhile: DirectoryUnavailable.
- "No such tenant" is remembered for `missing_ttl_s` only (shorter): a tenant
  placed by another process is found soon after.
- `place` writes through: the writer's own cache knows the new placement at once.
- `cached` answers from memory alone (no I/O), so an event loop can take the
  common case inline and send only misses to a thread.

A stale cache cannot make a write land in the wrong cell: each cell's gateway
refuses a tenant the directory does not home in it (421), and the move
protocol fences the old cell by its own database before it flips the epoch.
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import psycopg

from cronwheel.store import directory as store
from cronwheel.store.directory import CellInfo, Placement

log = logging.getLogger("cronwheel.directory")

_CELLS = "\0cells"  # the cache key of the cell list (no tenant id has a NUL)
# A key that names its tenant (cronwheel/store/jobs.py, new_api_key).
_KEY_TENANT = re.compile(r"^cw_([A-Za-z0-9_-]{1,100})\.[A-Za-z0-9_-]+$")
_TENANT_PATH = re.compile(r"^/v1/tenants/([A-Za-z0-9_-]{1,100})(?:/|$)")


def tenant_of_key(token: str) -> str | None:
    """The tenant an API key names (`cw_<tenant_id>.<random>`); None for a key
    made before keys named their tenant, or for anything else."""
    m = _KEY_TENANT.match(token)
    return m.group(1) if m else None


def tenant_of_path(path: str) -> str | None:
    """The tenant an operator path is about (`/v1/tenants/{id}...`), or None."""
    m = _TENANT_PATH.match(path)
    return m.group(1) if m else None


class DirectoryUnavailable(RuntimeError):
    """The directory's database did not answer and the cache has no answer."""


@dataclass
class _Entry:
    value: object
    fresh_until: float


class Directory:
    def __init__(
        self,
        dsn: str,
        *,
        ttl_s: float = 5.0,
        missing_ttl_s: float = 1.0,
        retry_s: float = 1.0,
        timeout_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.dsn = dsn
        self.ttl_s = ttl_s
        self.missing_ttl_s = min(missing_ttl_s, ttl_s)
        self.retry_s = retry_s
        self.timeout_s = timeout_s
        self.clock = clock
        self._entries: dict[str, _Entry] = {}
        self._conn: psycopg.Connection | None = None
        self._db = threading.Lock()  # one connection, one statement at a time
        self._lock = threading.Lock()  # the entries
        self.stale_served = 0  # answers served stale because the directory was away

    # -- reads ---------------------------------------------------------------
    def cached(self, tenant_id: str) -> Placement | None | bool:
        """From memory only: the placement, None (known to be absent), or False
        (not known or no longer fresh: ask `placement`)."""
        return self._fresh(tenant_id)

    def placement(self, tenant_id: str) -> Placement | None:
        """The tenant's placement, None if the directory has none."""
        got = self._read(tenant_id, lambda conn: store.placement(conn, tenant_id))
        return got  # type: ignore[return-value]

    def cells(self) -> dict[str, CellInfo]:
        """The registered cells by name, in their order (the first is the default)."""
        got = self._fresh(_CELLS)
        if got is False:
            got = self._read(_CELLS, lambda conn: {c.name: c for c in store.cells(conn)})
        return got  # type: ignore[return-value]

    def default_cell(self) -> str | None:
        return next(iter(self.cells()), None)

    def forget(self, tenant_id: str) -> None:
        """Drop what the cache knows of a tenant (a cell said it is not there)."""
        with self._lock:
            self._entries.pop(tenant_id, None)

    # -- writes --------------------------------------------------------------
    def place(self, tenant_id: str, cell: str) -> Placement:
        """Home a new tenant (as the operator), remembered here at once.
        DirectoryUnavailable when the directory's database does not answer."""
        try:
            with self._db:
                placed = store.place(self._connection(), tenant_id, cell)
        except psycopg.OperationalError as e:
            self._drop_connection()
            raise DirectoryUnavailable(f"the directory did not answer: {e}") from e
        self._remember(tenant_id, placed, self.ttl_s)
        return placed

    def close(self) -> None:
        self._drop_connection()

    # -- the cache -----------------------------------------------------------
    def _fresh(self, key: str):
        with self._lock:
            entry = self._entries.get(key)
        if entry is None or entry.fresh_until <= self.clock():
            return False
        return entry.value

    def _remember(self, key: str, value: object, ttl: float) -> None:
        with self._lock:
            self._entries[key] = _Entry(value, self.clock() + ttl)

    def _read(self, key: str, query: Callable[[psycopg.Connection], object]):
        fresh = self._fresh(key)
        if fresh is not False:
            return fresh
        try:
            with self._db:
                value = query(self._connection())
        except psycopg.OperationalError as e:
            self._drop_connection()
            with self._lock:
                entry = self._entries.get(key)
                if entry is None:
                    raise DirectoryUnavailable(f"the directory did not answer: {e}") from e
                entry.fresh_until = self.clock() + self.retry_s  # ask again later, not now
                self.stale_served += 1
            log.warning("directory unavailable, serving its cached answer: %s", e)
            return entry.value
        self._remember(key, value, self.ttl_s if value is not None else self.missing_ttl_s)
        return value

    def _connection(self) -> psycopg.Connection:
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(
                self.dsn, autocommit=True, connect_timeout=max(1, int(self.timeout_s))
            )
            self._conn.execute(
                "SELECT set_config('statement_timeout', %s, false)",
                [f"{int(self.timeout_s * 1000)}ms"],
            )
        return self._conn

    def _drop_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(psycopg.Error):  # closing a broken connection
                conn.close()
