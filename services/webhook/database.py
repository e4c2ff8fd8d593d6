"""The webhook service's database work: blocking psycopg calls on a few threads,
and the lifecycle calls of many deliveries grouped into one transaction.

Why group: every StartRun and CompleteRun of its own is a transaction with its
commit, a thread hand-off and a wake-up of the event loop; at a few hundred
deliveries a second that was most of the service's CPU and of its PostgreSQL
backends' (docs/webhooks.md has the figures). Whatever is queued when a thread
is free goes as one transaction, and every caller learns its own answer once
that transaction has committed: an offset is still committed only after its
StartRun is durable, and a request still goes out only after its StartRun is.

Two kinds of call share a group:
- `submit(fn, *args)`: `fn(conn, *args)`, each in its turn (heartbeats);
- `submit_many(fn, item)`: the group's items of one `fn` go to it together,
  `fn(conn, items)` answering one value per item in order, an exception
  instance standing for that item's error (Lifecycle.start_many and
  complete_many: a few statements for the whole batch, not one per run).

A call that raises inside a group (a deadlock, a constraint, a bug; refusals
are answers, not exceptions) aborts the group: it is rolled back and each of
its calls is made again alone (a batched one as a batch of one), so one bad
call fails only its own caller.
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

from cronwheel.store.db import Reconnecting, pipelined_transaction

log = logging.getLogger("cronwheel.webhook")

GROUP_CALLS = Histogram(
    "cronwheel_webhook_db_group_calls",
    "Lifecycle calls (StartRun, CompleteRun, Heartbeat) per database transaction",
    buckets=(1, 2, 4, 8, 16, 32, 64, 128),
)

# A group is one transaction. The service's calls take no savepoint in it (the
# Lifecycle adds none inside an open transaction), so the group's size is not
# bounded by PostgreSQL's 64 cached subtransactions; the bound is on how long a
# group holds its runs' rows locked (40-60 ms for 128 calls under load). Under
# load the groups fill up: with 48 at most, two connections carried at most
# about 1,600 deliveries/s (StartRun and CompleteRun each a call), however many
# were in flight; with 128, bench_webhook measured 1,700-2,400/s.
MAX_GROUP = 128
_STOPPED = object()


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
        self._all: list[Reconnecting] = []  # every thread's connection
        self._lock = threading.Lock()
        # (fn, args, future, batched): batched calls carry their one item as args[0]
        self._queue: list[tuple[Callable[..., Any], tuple, asyncio.Future, bool]] = []
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

    def warm(self, prime: Callable[[psycopg.Connection], Any]) -> None:
        """Opens every thread's connection now, in the background, and runs
        `prime(conn)` on it: opening one (authentication included) and a
        backend's first statements on the runs' tables were ~10 and ~5 ms of
        the first delivery after a start, which is a new tenant's first run
        on a fresh instance (docs/dispatcher.md). The threads meet at a barrier
        first, so each opens its own; a failure is left to the first call
        that needs it."""
        n = self.workers + 1
        met = threading.Barrier(n)

        def one() -> None:
            try:
                met.wait(timeout=5)
                self._connection_here().call(prime, None, tries=1)
            except Exception as exc:  # the database away: the calls reconnect
                log.debug("a connection not opened ahead: %s", exc)

        for _ in range(n):
            self.pool.submit(one)

    def _connection_here(self) -> Reconnecting:
        """This thread's connection (not opened until used)."""
        db = getattr(self._local, "db", None)
        if db is None:
            db = self._local.db = Reconnecting(self.dsn, log)
            with self._lock:
                self._all.append(db)
        return db

    def _with_connection(self, work: Callable[[psycopg.Connection], Any]) -> Any:
        """`work(conn)` on this thread's connection, under the services'
        reconnect policy (cronwheel.store.db); Stopping if `stop` came while
        the database was away."""
        got = self._connection_here().call(work, self.stop, _STOPPED)
        if got is _STOPPED:
            raise Stopping()
        return got

    # -- calls grouped into transactions -------------------------------------------

    def submit(self, fn: Callable[..., Any], *args) -> asyncio.Future:
        """`fn(conn, *args)` in the next group's transaction; the future has its
        answer (or its exception) once that transaction committed."""
        return self._enqueue(fn, args, False)

    def submit_many(self, fn: Callable[[Any, list], list], item: Any) -> asyncio.Future:
        """`item` goes to `fn(conn, items)` with the other items of `fn` in the
        next group; the future has its answer (an exception instance in the
        answers is raised to its caller) once the transaction committed."""
        return self._enqueue(fn, (item,), True)

    def _enqueue(self, fn, args: tuple, batched: bool) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._queue.append((fn, args, fut, batched))
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
            calls = [(fn, args, batched) for fn, args, _f, batched in group]
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
        for (_fn, _args, fut, _b), (ok, value) in zip(group, answers, strict=True):
            if fut.done():
                continue
            if ok:
                fut.set_result(value)
            else:
                fut.set_exception(value)
        if self._queue:
            self._flush()

    def _run_group(
        self, calls: list[tuple[Callable[..., Any], tuple, bool]]
    ) -> list[tuple[bool, Any]]:
        if len(calls) == 1:
            return [self._alone(*calls[0])]
        try:
            return self._with_connection(lambda conn: self._group(conn, calls))
        except _Abort as exc:
            log.info("a group of %d calls failed (%s); each goes alone", len(calls), exc)
            return [self._alone(*call) for call in calls]

    def _alone(self, fn, args, batched: bool = False) -> tuple[bool, Any]:
        try:
            if batched:
                return _answer(self._call(fn, ([args[0]],))[0])
            return True, self._call(fn, args)
        except Exception as exc:  # the caller's to handle, as from `call`
            return False, exc

    @staticmethod
    def _group(conn: psycopg.Connection, calls) -> list[tuple[bool, Any]]:
        """The calls in one transaction: each batched `fn` once, where its first
        item stands, with all of its items. A lost connection raises (the group
        goes again on a new one); any other exception aborts the group. The
        service's calls turn the lifecycle's refusals (Conflict, NotFound) into
        answers, so an exception here is rare: a bug, a deadlock, a constraint."""
        answers: list[tuple[bool, Any] | None] = [None] * len(calls)
        batches: dict[Any, list[int]] = {}
        for i, (fn, _args, batched) in enumerate(calls):
            if batched:
                batches.setdefault(fn, []).append(i)
        try:
            with pipelined_transaction(conn) as pipeline:
                # libpq learns of the BEGIN at a sync: the Lifecycle calls then
                # see the open transaction (no nested one, generic plans set).
                # Their statements that nobody reads (SET LOCAL, the outbox's
                # rows, the notify, COMMIT) ride with the next one that is read.
                pipeline.sync()
                for i, (fn, args, batched) in enumerate(calls):
                    if not batched:
                        answers[i] = (True, fn(conn, *args))
                    elif answers[i] is None:
                        where = batches[fn]
                        got = fn(conn, [calls[k][1][0] for k in where])
                        for k, value in zip(where, got, strict=True):
                            answers[k] = _answer(value)
        except Exception as exc:
            if isinstance(exc, psycopg.OperationalError) and (conn.broken or conn.closed):
                raise
            # The call may have changed rows before it raised (Lifecycle calls in
            # an open transaction take no savepoint): the group is rolled back.
            raise _Abort(f"{type(exc).__name__}: {exc}") from exc
        return answers  # type: ignore[return-value]

    def close(self) -> None:
        self.pool.shutdown(wait=True)
        with self._lock:
            for db in self._all:
                db.close()


def _answer(value: Any) -> tuple[bool, Any]:
    """A batched call's answer as (ok, value): an exception instance is its error."""
    return (False, value) if isinstance(value, Exception) else (True, value)
