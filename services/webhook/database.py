"""The webhook service's database work: blocking psycopg calls on a few threads,
and the lifecycle calls of many deliveries grouped into one transaction.

Why group: every StartRun and CompleteRun of its own is a transaction with its
commit, a thread hand-off and a wake-up of the event loop; at a few hundred
deliveries a second that was most of the service's CPU and of its PostgreSQL
backends' (docs/webhooks.md has the figures). `submit` queues a call; whatever
is queued when a thread is free goes as one transaction, each call in it as
the call would run alone (the Lifecycle methods open their own savepoint), and
every caller learns its own answer once the transaction has committed: an
offset is still committed only after its StartRun is durable, and a request
still goes out only after its StartRun is.

A call that raises inside a group (a deadlock, a constraint, a bug; refusals
are answers, not exceptions) aborts the group: it is rolled back and each of
its calls is made again alone, so one bad call fails only its own caller.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
from prometheus_client import Histogram

log = logging.getLogger("cronwheel.webhook")

GROUP_CALLS = Histogram(
    "cronwheel_webhook_db_group_calls",
    "Lifecycle calls (StartRun, CompleteRun, Heartbeat) per database transaction",
    buckets=(1, 2, 4, 8, 16, 32, 48),
)

# Each call in a group holds a subtransaction (its savepoint) until the commit;
# past 64 of them PostgreSQL's snapshots of every other session get slower
# (subxid overflow), so a group stays under that.
MAX_GROUP = 48


class Stopping(Exception):
    """The service is stopping while the database is away."""


class _Abort(Exception):
    """A call of a group failed in a way that spoils the group's transaction."""


class Database:
    """Blocking psycopg calls on a pool of threads, one connection each. An
    OperationalError reconnects and calls again (the calls are safe to repeat:
    a repeated StartRun or CompleteRun that already landed is refused)."""

    def __init__(self, dsn: str, workers: int, stop: threading.Event, max_group: int = MAX_GROUP):
        self.dsn = dsn
        self.stop = stop
        self.workers = workers
        self.max_group = max(1, min(max_group, MAX_GROUP))
        # One thread more than groups may take, so a lookup (`call`) never
        # queues behind a full set of groups.
        self.pool = ThreadPoolExecutor(workers + 1, thread_name_prefix="webhook-db")
        self._local = threading.local()
        self._all: list[psycopg.Connection] = []
        self._lock = threading.Lock()
        self._queue: list[tuple[Callable[..., Any], tuple, asyncio.Future]] = []
        self._groups = 0  # groups on their way (at most `workers`)
        self._flush_soon = False
        self.grouped = 0  # calls made in groups, and
        self.groups = 0  # how many groups they made (for the bench)

    # -- one call ---------------------------------------------------------------

    async def call(self, fn: Callable[..., Any], *args) -> Any:
        """`fn(conn, *args)` on a thread, in autocommit mode."""
        return await asyncio.get_running_loop().run_in_executor(self.pool, self._call, fn, args)

    def _call(self, fn, args):
        return self._with_connection(lambda conn: fn(conn, *args))

    def _with_connection(self, work: Callable[[psycopg.Connection], Any]) -> Any:
        backoff = 0.1
        while True:
            conn = getattr(self._local, "conn", None)
            try:
                if conn is None or conn.closed:
                    conn = self._local.conn = psycopg.connect(self.dsn, autocommit=True)
                    with self._lock:
                        self._all.append(conn)
                return work(conn)
            except psycopg.OperationalError as exc:
                log.warning("database unavailable (%s); retrying", exc)
                if conn is not None:
                    conn.close()
                self._local.conn = None
                if self.stop.wait(backoff):
                    raise Stopping() from exc
                backoff = min(backoff * 2, 5.0)

    # -- calls grouped into transactions -------------------------------------------

    def submit(self, fn: Callable[..., Any], *args) -> asyncio.Future:
        """`fn(conn, *args)` in the next group's transaction; the future has its
        answer (or its exception) once that transaction committed."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._queue.append((fn, args, fut))
        if not self._flush_soon and self._groups < self.workers:
            # After the callbacks already due: the deliveries started together
            # queue their calls first, then go as one group.
            self._flush_soon = True
            loop.call_soon(self._flush)
        return fut

    def _flush(self) -> None:
        self._flush_soon = False
        loop = asyncio.get_running_loop()
        while self._queue and self._groups < self.workers:
            group = self._queue[: self.max_group]
            del self._queue[: self.max_group]
            self._groups += 1
            self.grouped += len(group)
            self.groups += 1
            GROUP_CALLS.observe(len(group))
            calls = [(fn, args) for fn, args, _f in group]
            try:
                done = loop.run_in_executor(self.pool, self._run_group, calls)
            except RuntimeError:  # the pool is shut down: the service is stopping
                done = loop.create_future()
                done.set_exception(Stopping())
            done.add_done_callback(lambda d, group=group: self._settle(group, d))

    def _settle(self, group, done: asyncio.Future) -> None:
        self._groups -= 1
        if done.cancelled():
            answers = [(False, Stopping())] * len(group)
        elif done.exception() is not None:
            answers = [(False, done.exception())] * len(group)
        else:
            answers = done.result()
        for (_fn, _args, fut), (ok, value) in zip(group, answers, strict=True):
            if fut.done():
                continue
            if ok:
                fut.set_result(value)
            else:
                fut.set_exception(value)
        if self._queue:
            self._flush()

    def _run_group(self, calls: list[tuple[Callable[..., Any], tuple]]) -> list[tuple[bool, Any]]:
        if len(calls) == 1:
            fn, args = calls[0]
            return [self._alone(fn, args)]
        try:
            return self._with_connection(lambda conn: self._group(conn, calls))
        except _Abort as exc:
            log.info("a group of %d calls failed (%s); each goes alone", len(calls), exc)
            return [self._alone(fn, args) for fn, args in calls]

    def _alone(self, fn, args) -> tuple[bool, Any]:
        try:
            return True, self._call(fn, args)
        except Exception as exc:  # the caller's to handle, as from `call`
            return False, exc

    @staticmethod
    def _group(conn: psycopg.Connection, calls) -> list[tuple[bool, Any]]:
        """The calls in one transaction. A lost connection raises (the group goes
        again on a new one); any other exception aborts the group. The service's
        calls turn the lifecycle's refusals (Conflict, NotFound) into answers, so
        an exception here is rare: a bug, a deadlock, a constraint."""
        answers: list[tuple[bool, Any]] = []
        try:
            with conn.transaction():
                for fn, args in calls:
                    answers.append((True, fn(conn, *args)))
        except Exception as exc:
            if isinstance(exc, psycopg.OperationalError) and (conn.broken or conn.closed):
                raise
            # The call may have changed rows before it raised (Lifecycle calls in
            # an open transaction take no savepoint): the group is rolled back.
            raise _Abort(f"{type(exc).__name__}: {exc}") from exc
        return answers

    def close(self) -> None:
        self.pool.shutdown(wait=True)
        with self._lock:
            for conn in self._all:
                conn.close()
