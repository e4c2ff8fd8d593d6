"""One mover per move: a router advances a move only while it holds the move's
lease in the directory (directory migration 0003, sql/directory_leases.sql;
docs/cells.md "One mover per move").

What holds:
- At most one router holds a move's lease at a time: taking it is one
  conditional upsert (free, expired or already the caller's), on the
  directory's clock, and a change of owner takes the next epoch.
- The holder renews it every third of its TTL from a thread of its own while
  a step runs (a copy of a large tenant, the drain) and checks it before every
  step and every wait of the drain: a router that finds the lease lost (it was
  paused past the TTL and another took it) stops at that point, raising
  LeaseLost, and leaves the move to the new holder. Each step is safe to run
  again (cronwheel/moves.py), so a step the old holder had begun and the new
  one runs again ends the same.
- A router that dies leaves its lease to expire; another router waiting on
  the move (services/router/moves.py) takes it then, without a restart.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import socket
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime

import psycopg
from psycopg.rows import class_row

from cronwheel.store.sql_loader import queries

log = logging.getLogger("cronwheel.router.moves")

TTL_S = 15.0  # a dead router's move waits this long at most for another


@functools.cache
def _q() -> dict[str, str]:
    return queries("directory_leases")


@functools.cache
def _operator_role() -> str:
    return queries("directory")["operator_role"]


def new_owner() -> str:
    """This router's name on the leases it takes: host, pid and a nonce."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class LeaseLost(RuntimeError):
    """Another router holds the move's lease now: stop advancing it."""


@dataclass(frozen=True)
class Held:
    """The lease as the directory last returned it."""

    move_id: str
    owner: str | None
    epoch: int
    expires_at: datetime


class MoveLease:
    """One router's lease on one move (`dsn`: the directory, a login that may
    become cronwheel_operator)."""

    def __init__(self, dsn: str, move_id: str, owner: str, ttl_s: float = TTL_S):
        self.dsn = dsn
        self.move_id = move_id
        self.owner = owner
        self.ttl_s = ttl_s
        self.held: Held | None = None
        self._lost = threading.Event()

    def acquire(self) -> bool:
        """Take the lease if it is free, expired or ours; whether we hold it."""
        got = self._write("acquire", {"move_id": self.move_id, "owner": self.owner})
        self.held = got
        if got is not None:
            self._lost.clear()
        return got is not None

    def renew(self) -> bool:
        """Extend the lease at the epoch we took; False (and lost from then
        on) when another router has taken it."""
        if self.held is None or self._lost.is_set():
            return False
        got = self._write("renew", self._ours())
        if got is None:
            log.warning("move %s: lease lost to another router", self.move_id)
            self._lost.set()
            return False
        self.held = got
        return True

    def check(self) -> None:
        """Raise LeaseLost unless we still hold the lease (a renewal found it
        taken, or it was never ours)."""
        if self.held is None or self._lost.is_set():
            raise LeaseLost(f"move {self.move_id}: another router holds its lease")

    def release(self) -> None:
        if self.held is not None and not self._lost.is_set():
            try:
                self._write("release", self._ours())
            except psycopg.Error as e:  # it runs out on its own
                log.warning("move %s: lease not released: %s", self.move_id, e)
        self.held = None

    def holder(self) -> Held | None:
        with (
            psycopg.connect(self.dsn, autocommit=True, connect_timeout=10) as conn,
            conn.cursor(row_factory=class_row(Held)) as cur,
        ):
            return cur.execute(_q()["holder"], {"move_id": self.move_id}).fetchone()

    @contextlib.contextmanager
    def kept(self) -> Iterator[MoveLease]:
        """Renew every third of the TTL until the block ends. A renewal that
        cannot reach the directory is tried again at the next tick; the lease
        then runs out on its own if the directory stays away."""
        done = threading.Event()

        def keep() -> None:
            while not done.wait(self.ttl_s / 3):
                try:
                    if not self.renew():
                        return
                except psycopg.Error as e:
                    log.warning("move %s: lease renewal failed: %s", self.move_id, e)

        thread = threading.Thread(target=keep, daemon=True, name=f"lease-{self.move_id}")
        thread.start()
        try:
            yield self
        finally:
            done.set()
            thread.join(self.ttl_s)

    def _ours(self) -> dict:
        assert self.held is not None
        return {"move_id": self.move_id, "owner": self.owner, "epoch": self.held.epoch}

    def _write(self, name: str, params: dict) -> Held | None:
        with (
            psycopg.connect(self.dsn, autocommit=True, connect_timeout=10) as conn,
            conn.transaction(),
            conn.cursor(row_factory=class_row(Held)) as cur,
        ):
            cur.execute(_operator_role())
            return cur.execute(_q()[name], {**params, "ttl_s": self.ttl_s}).fetchone()
