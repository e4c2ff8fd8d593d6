"""The run lifecycle: StartRun, Heartbeat, CompleteRun, cancel, and the timers
that end attempts (lease expiry, timeout) and bring retries back.

Fencing: Heartbeat and CompleteRun hold only for the (attempt, start_token) that
StartRun handed out, while the run is RUNNING. A duplicate, late or stale call
changes nothing and gets STALE_ATTEMPT. Every terminal transition writes a
RunCompleted record through the outbox in the same transaction.

Every end of an attempt (CompleteRun, a lease or timeout expiring, a cancel,
a job's deletion) is decided in code, by cronwheel.core.runs.decide, and
written by one statement conditional on the run being where the decision
found it (end_attempt, end_attempts): the retry rule exists once. This module
is the only writer of runs_daily.state.

StartRun and CompleteRun are one statement each (data-modifying CTEs in
lifecycle.sql), plus one for what needs the statement's answer first (the
retry timer, the RunCompleted record); a retryable failure first reads the
run's retry policy. Called inside an open transaction (the gateway's request)
they add no savepoint: nothing changes before the one statement that decides,
so a refusal has nothing to undo.
"""

from __future__ import annotations

import contextlib
import json
import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

from psycopg import pq
from psycopg.rows import class_row
from psycopg.types.json import Jsonb

from cronwheel.core import events
from cronwheel.core.clock import iso, to_dt, to_ms
from cronwheel.core.errors import Conflict, NotFound, ValidationError
from cronwheel.core.events import OutboxRow
from cronwheel.core.ids import partition_of_run, run_id_for_instant
from cronwheel.core.runs import (
    Decision,
    Outcome,
    RetryPolicy,
    RunState,
    decide,
    needs_policy,
)
from cronwheel.kafka import Topics
from cronwheel.store import outbox, pgarrays, timers
from cronwheel.store.new_runs import NewRuns, insert_runs, ready_row, run_spec
from cronwheel.store.run_days import Days, in_days, one_in_days
from cronwheel.store.sql_loader import queries, splice
from cronwheel.store.timers import FireReport, Timer

NO_RUN = "0" * 32  # a run id no run has (its partition, 0, exists): Lifecycle.warm's

# With their fragments: the timer parts (timers.sql) and the buffered instant.
Q = timers.spliced(splice(queries("lifecycle"), {"lifecycle": queries("lifecycle")}))
MAX_RESULT_BYTES = 64 * 1024
MAX_ERROR_CHARS = 4096


def _partition(run_id: str) -> int:
    try:
        return partition_of_run(run_id)
    except ValueError as e:
        raise NotFound("run") from e


def _atomic(conn):
    """A transaction when none is open; none nested in the caller's (psycopg would
    add a SAVEPOINT and a RELEASE: two round trips that protect nothing here).
    In pipeline mode libpq learns of a BEGIN only at the next sync: a caller
    that sends its own BEGIN in a pipeline syncs before calling in (the gateway's
    pipelined_transaction does)."""
    if conn.pgconn.transaction_status == pq.TransactionStatus.IDLE:
        return conn.transaction()
    return contextlib.nullcontext()


def _generic_plans(conn) -> None:
    """In the caller's transaction, plan the batch statements once per connection.

    PostgreSQL plans a prepared statement afresh for each call while a plan for
    the call's values looks cheaper than the generic one, and with the arrays'
    lengths known (3 runs) it always does: planning start_many took 1.5 ms, as
    long as running it. The generic plan (10 rows assumed per array, a nested
    loop over the primary keys) is the right one for any batch, so it is forced
    for the rest of the transaction (the statements after it are the batch's
    own and primary-key ones). Without a transaction (autocommit) SET LOCAL
    would do nothing; nothing is sent."""
    if conn.pgconn.transaction_status == pq.TransactionStatus.INTRANS:
        conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")


class StartCall(NamedTuple):
    tenant_id: str
    run_id: str
    worker_id: str
    attempt: int | None = None


class CompleteCall(NamedTuple):
    tenant_id: str
    run_id: str
    attempt: Any
    start_token: Any
    outcome: Any
    result: Any = None
    error: Any = None
    retryable: Any = True


@dataclass(frozen=True)
class Seen:
    """A run's state, attempt and instant as a statement found it (run_state)."""

    state: str
    attempt: int
    scheduled_at: datetime


@dataclass(frozen=True)
class Started:
    """A row of start_attempt / start_many: the attempt StartRun began
    (`attempt` None: none began) and the run as the statement found it
    (`found_state` None: no run of this id and tenant)."""

    attempt: int | None
    lease_expires_at: datetime | None
    spec: dict | None
    job_id: str | None
    workflow_run_id: str | None
    node: str | None
    found_state: str | None
    found_attempt: int | None
    found_scheduled_at: datetime | None
    i: int | None = None  # the element of start_many

    @property
    def seen(self) -> Seen:
        return Seen(self.found_state, self.found_attempt, self.found_scheduled_at)


@dataclass(frozen=True)
class RunToEnd:
    """A run as runs_to_end and waiting_runs_of_job lock it."""

    p: int
    run_id: str
    state: str
    attempt: int
    lease_expires_at: datetime | None
    retry: dict
    tenant_id: str
    job_id: str | None
    workflow_run_id: str | None
    node: str | None
    priority: str


@dataclass(frozen=True)
class Ended:
    """A row of end_attempt / end_attempts: the run as the transition left it
    (`state` None: the run was not where the caller found it, nothing changed),
    and the instant its job had buffered, when it gave one up (`buffered_at`)."""

    state: str | None
    attempt: int | None
    tenant_id: str | None
    job_id: str | None
    workflow_run_id: str | None
    node: str | None
    priority: str | None
    buffered_at: datetime | None
    buffered_tenant_id: str | None
    target: dict | None
    payload: str | None
    retry: dict | None
    timeout_ms: int | None
    lease_ms: int | None
    buffered_priority: str | None
    i: int | None = None  # the element of end_attempts


@dataclass(frozen=True)
class Ending:
    """One element of end_attempts: move run `run_id` from `from_state` at
    `attempt` (and `token`, for CompleteRun) to what `decision` says.
    `set_result`/`set_error`: replace the run's result/error or keep them; the
    attempt's history row ends with `attempt_outcome` and `attempt_error`, which
    is also the error the RunCompleted record carries."""

    p: int
    run_id: str
    tenant_id: str
    from_state: str
    attempt: int
    decision: Decision
    attempt_outcome: str
    attempt_error: str | None
    token: str | None = None
    set_result: bool = False
    result: str | None = None  # JSON text
    set_error: bool = True
    error: str | None = None


def _rounds(keys: list[tuple[int, str]]) -> list[list[int]]:
    """Indexes of the calls in statement rounds: each round sorted by (partition,
    run) so concurrent batches lock runs in one order, and a run that comes
    again goes in the next round, to see what the first call did."""
    rounds: list[list[int]] = []
    seen: dict[tuple[int, str], int] = {}
    for i, key in sorted(enumerate(keys), key=lambda x: x[1]):
        n = seen.get(key, 0)
        seen[key] = n + 1
        if n == len(rounds):
            rounds.append([])
        rounds[n].append(i)
    return rounds


class Lifecycle:
    def __init__(self, topics: Topics):
        self.topics = topics

    # -- the worker protocol -------------------------------------------------
    def start(
        self,
        conn,
        tenant_id: str,
        run_id: str,
        worker_id: str,
        now: int,
        attempt: int | None = None,
    ) -> dict:
        if not isinstance(worker_id, str) or not 1 <= len(worker_id) <= 200:
            raise ValidationError("worker_id", "must be a string of 1-200 characters")
        p = _partition(run_id)
        token = secrets.token_urlsafe(18)
        args = {
            "p": p, "run_id": run_id, "tenant_id": tenant_id, "worker_id": worker_id,
            "token": token, "now": to_dt(now), "attempt": attempt, **timers.CLASS_PARAMS,
        }  # fmt: skip
        row = one_in_days(
            now, lambda w: _named(Started, w.execute(conn, Q["start_attempt"], args)).fetchone()
        )
        if row is None:
            raise NotFound("run")
        if row.attempt is None:
            raise self._refusal(conn, p, run_id, tenant_id, attempt, now, row.seen)
        return _started(run_id, token, row)

    def warm(self, conn, worker_id: str, now: int) -> None:
        """StartRun's statement and the run spec's, run once for a run that
        does not exist (NO_RUN: nothing is written). A connection's first run
        otherwise pays for its backend loading those tables' catalog entries
        (not for plans: psycopg prepares a statement only from its fifth run):
        2-5 ms more for a fresh instance's first run, which is often a new
        tenant's first (docs/dispatcher.md)."""
        self.spec(conn, "", NO_RUN, now)
        with contextlib.suppress(NotFound):
            self.start(conn, "", NO_RUN, worker_id, now)

    def start_many(self, conn, calls: list[StartCall], now: int) -> list[dict | Exception]:
        """StartRun for many runs (of any tenants): a statement per round (see
        _rounds), in one transaction when there is more than one round. One
        answer per call, in order: what `start` returns, or the exception it
        would raise, as a value. (`start` has a statement of its own: see
        lifecycle.sql on why.)"""
        if len(calls) == 1:  # the scalar statement: an array one is re-planned each call
            c = calls[0]
            return _answer(
                lambda: self.start(conn, c.tenant_id, c.run_id, c.worker_id, now, c.attempt)
            )
        answers: list[dict | Exception | None] = [None] * len(calls)
        todo: list[tuple[int, int, str]] = []  # (call, partition, token)
        for i, c in enumerate(calls):
            try:
                if not isinstance(c.worker_id, str) or not 1 <= len(c.worker_id) <= 200:
                    raise ValidationError("worker_id", "must be a string of 1-200 characters")
                todo.append((i, _partition(c.run_id), secrets.token_urlsafe(18)))
            except (ValidationError, NotFound) as e:
                answers[i] = e
        rounds = _rounds([(p, calls[i].run_id) for i, p, _t in todo])
        with _atomic(conn) if len(rounds) > 1 else contextlib.nullcontext():
            _generic_plans(conn)
            for rnd in rounds:
                batch = [todo[k] for k in rnd]
                cs = [calls[i] for i, _p, _t in batch]
                rows = in_days(
                    now, batch, lambda b, w: self._start_rows(conn, calls, b, now, w),
                    lambda row: row.found_state is None,
                )  # fmt: skip
                for (i, p, token), c, row in zip(batch, cs, rows, strict=True):
                    if row.attempt is not None:
                        answers[i] = _started(c.run_id, token, row)
                    elif row.found_state is None:
                        answers[i] = NotFound("run")
                    else:
                        answers[i] = self._refusal(
                            conn, p, c.run_id, c.tenant_id, c.attempt, now, row.seen
                        )
        return answers  # type: ignore[return-value]

    @staticmethod
    def _start_rows(conn, calls, batch, now: int, window: Days) -> list[Started]:
        cs = [calls[i] for i, _p, _t in batch]
        cur = window.execute(
            conn,
            Q["start_many"],
            {  # binary arrays: the list dumper cost ~2 us an element
                "p": pgarrays.int2_array([p for _i, p, _t in batch]),
                "run_id": pgarrays.text_array([c.run_id for c in cs]),
                "tenant_id": pgarrays.text_array([c.tenant_id for c in cs]),
                "worker_id": pgarrays.text_array([c.worker_id for c in cs]),
                "token": pgarrays.text_array([t for _i, _p, t in batch]),
                "attempt": pgarrays.int4_array([c.attempt for c in cs]),
                "now": to_dt(now),
                **timers.CLASS_PARAMS,
            },
        )
        return _named(Started, cur).fetchall()

    def _refusal(self, conn, p, run_id, tenant_id, attempt, now, seen: Seen) -> Exception:
        """Why StartRun did not start the run, from the state it found (`seen`).
        A run that looked startable lost a race for its row: ask again."""
        state, cur_attempt, scheduled = RunState(seen.state), seen.attempt, to_ms(seen.scheduled_at)
        startable = state == RunState.PENDING and scheduled <= now + 1000
        if startable and (attempt is None or attempt == cur_attempt):
            return self._why_not_started(conn, p, run_id, tenant_id, attempt, now)
        return _refused(state, cur_attempt, scheduled, attempt, now)

    def spec(self, conn, tenant_id: str, run_id: str, now: int) -> dict | None:
        """The run's snapshot (target, payload, retry, timeout_ms, lease_ms), for the
        platform's own workers; never sent over the worker API (webhook headers)."""
        key = {"p": _partition(run_id), "run_id": run_id, "tenant_id": tenant_id}
        row = one_in_days(now, lambda w: w.execute(conn, Q["run_spec"], key).fetchone())
        if row is None:
            return None
        (spec,) = row
        return spec

    def _why_not_started(self, conn, p, run_id, tenant_id, attempt, now) -> Exception:
        cur = self._seen(conn, p, run_id, tenant_id, now)
        if cur is None:
            return NotFound("run")
        return _refused(RunState(cur.state), cur.attempt, to_ms(cur.scheduled_at), attempt, now)

    def heartbeat(
        self, conn, tenant_id: str, run_id: str, attempt: Any, start_token: Any, now: int
    ) -> dict:
        _check_fence(attempt, start_token)
        p = _partition(run_id)
        args = {"p": p, "run_id": run_id, "tenant_id": tenant_id, "attempt": attempt,
                "token": start_token, "now": to_dt(now)}  # fmt: skip
        row = one_in_days(now, lambda w: w.execute(conn, Q["heartbeat"], args).fetchone())
        if row is None:
            raise self._stale_or_missing(conn, p, run_id, tenant_id, now)
        (lease_expires_at,) = row
        return {"lease_expires_at": iso(to_ms(lease_expires_at))}

    def complete(
        self,
        conn,
        tenant_id: str,
        run_id: str,
        attempt: Any,
        start_token: Any,
        outcome: Any,
        now: int,
        result: Any = None,
        error: Any = None,
        retryable: Any = True,
    ) -> dict:
        _check_completion(attempt, start_token, outcome, result, error, retryable)
        p = _partition(run_id)
        with _atomic(conn):
            policy = None
            if needs_policy(outcome, retryable):
                _generic_plans(conn)
                (policy,) = self._policies(
                    conn, [(p, tenant_id, run_id, attempt, start_token)], now
                )
                if policy is None:
                    raise self._stale_or_missing(conn, p, run_id, tenant_id, now)
            decision = decide(Outcome(outcome), retryable, attempt, policy, now)
            args = {
                "p": p, "run_id": run_id, "tenant_id": tenant_id, "attempt": attempt,
                "token": start_token, "outcome": outcome, "next_state": decision.state,
                "now": to_dt(now), "result": None if result is None else Jsonb(result),
                "error": error[:MAX_ERROR_CHARS] if error else None,
                "attempt_error": error,
            }  # fmt: skip
            row = one_in_days(
                now, lambda w: _named(Ended, w.execute(conn, Q["end_attempt"], args)).fetchone()
            )
            if row is None:
                raise self._stale_or_missing(conn, p, run_id, tenant_id, now)
            self._after_finish(conn, p, run_id, row, decision, error, now)
        return {"state": row.state, "attempt": row.attempt}

    def complete_many(self, conn, calls: list[CompleteCall], now: int) -> list[dict | Exception]:
        """CompleteRun for many runs (of any tenants) in one transaction: a
        statement per round (see _rounds), then one for the retry timers and one
        for the outbox. One answer per call, in order, as `start_many`."""
        if len(calls) == 1:  # the scalar statement, as in start_many
            c = calls[0]
            return _answer(
                lambda: self.complete(
                    conn, c.tenant_id, c.run_id, c.attempt, c.start_token, c.outcome,
                    now, c.result, c.error, c.retryable,
                )
            )  # fmt: skip
        answers: list[dict | Exception | None] = [None] * len(calls)
        todo: list[tuple[int, int, str | None]] = []  # (call, partition, result as JSON)
        for i, c in enumerate(calls):
            try:
                _check_completion(
                    c.attempt, c.start_token, c.outcome, c.result, c.error, c.retryable
                )
                result = None if c.result is None else json.dumps(c.result)
                todo.append((i, _partition(c.run_id), result))
            except (ValidationError, NotFound) as e:
                answers[i] = e
        retries: list[timers.Retry] = []
        records: list[OutboxRow] = []
        with _atomic(conn):
            _generic_plans(conn)
            for rnd in _rounds([(p, calls[i].run_id) for i, p, _r in todo]):
                batch = [todo[k] for k in rnd]
                need = [
                    (i, p)
                    for i, p, _r in batch
                    if needs_policy(calls[i].outcome, calls[i].retryable)
                ]
                keys = [(p, calls[i].tenant_id, calls[i].run_id, calls[i].attempt,
                         calls[i].start_token) for i, p in need]  # fmt: skip
                policies = dict(
                    zip([i for i, _p in need], self._policies(conn, keys, now), strict=True)
                )
                endings: list[tuple[int, Ending]] = []
                for i, p, result in batch:
                    c = calls[i]
                    if i in policies and policies[i] is None:
                        answers[i] = self._stale_or_missing(conn, p, c.run_id, c.tenant_id, now)
                        continue
                    decision = decide(
                        Outcome(c.outcome), c.retryable, c.attempt, policies.get(i), now
                    )
                    endings.append((i, _completion(p, c, result, decision)))
                ended = self._write_ends(conn, [e for _i, e in endings], now)
                for (i, e), row in zip(endings, ended, strict=True):
                    if row.state is None:
                        answers[i] = self._stale_or_missing(conn, e.p, e.run_id, e.tenant_id, now)
                    else:
                        answers[i] = {"state": row.state, "attempt": row.attempt}
                self._follow_ups(conn, [e for _i, e in endings], ended, now, retries, records)
            self._flush(conn, retries, records)
        return answers  # type: ignore[return-value]

    def _policies(
        self, conn, keys: list[tuple[int, str, str, int, str]], now: int
    ) -> list[RetryPolicy | None]:
        """The retry policy of each running attempt (partition, tenant, run,
        attempt, token) names; None for a stale call or an unknown run."""
        if not keys:
            return []

        def ask(keys, window: Days) -> list:
            return [retry for _i, retry in window.execute(
                conn,
                Q["attempt_policies"],
                {
                    "p": pgarrays.int2_array([k[0] for k in keys]),
                    "tenant_id": pgarrays.text_array([k[1] for k in keys]),
                    "run_id": pgarrays.text_array([k[2] for k in keys]),
                    "attempt": pgarrays.int4_array([k[3] for k in keys]),
                    "token": pgarrays.text_array([k[4] for k in keys]),
                },
            ).fetchall()]  # fmt: skip

        retries = in_days(now, keys, ask, lambda retry: retry is None)
        return [None if retry is None else RetryPolicy.of(retry) for retry in retries]

    @staticmethod
    def _write_ends(conn, endings: list[Ending], now: int) -> list[Ended]:
        """end_attempts: one row per ending, in order."""
        if not endings:
            return []
        return in_days(
            now, endings, lambda e, w: Lifecycle._end_rows(conn, e, now, w),
            lambda row: row.state is None,
        )  # fmt: skip

    @staticmethod
    def _end_rows(conn, endings: list[Ending], now: int, window: Days) -> list[Ended]:
        return _named(
            Ended,
            window.execute(
                conn,
                Q["end_attempts"],
                {  # binary arrays, as in start_many
                    "p": pgarrays.int2_array([e.p for e in endings]),
                    "run_id": pgarrays.text_array([e.run_id for e in endings]),
                    "tenant_id": pgarrays.text_array([e.tenant_id for e in endings]),
                    "from_state": pgarrays.text_array([e.from_state for e in endings]),
                    "attempt": pgarrays.int4_array([e.attempt for e in endings]),
                    "token": pgarrays.text_array([e.token for e in endings]),
                    "next_state": pgarrays.text_array([e.decision.state for e in endings]),
                    "set_result": pgarrays.bool_array([e.set_result for e in endings]),
                    "result": pgarrays.text_array([e.result for e in endings]),
                    "set_error": pgarrays.bool_array([e.set_error for e in endings]),
                    "error": pgarrays.text_array([e.error for e in endings]),
                    "attempt_outcome": pgarrays.text_array([e.attempt_outcome for e in endings]),
                    "attempt_error": pgarrays.text_array([e.attempt_error for e in endings]),
                    "now": to_dt(now),
                },
            ),
        ).fetchall()

    def _follow_ups(
        self,
        conn,
        endings: list[Ending],
        ended: list[Ended],
        now: int,
        retries: list[timers.Retry],
        records: list[OutboxRow],
    ) -> None:
        """What follows the runs end_attempts changed: a retry timer for each
        RETRY_WAIT (into `retries`), a RunCompleted record for each terminal run
        and the run of its job's buffered instant, once per job (`records`)."""
        buffered_taken: set[tuple[int, str]] = set()
        for e, row in zip(endings, ended, strict=True):
            if row.state is None:
                continue
            if row.state == RunState.RETRY_WAIT:
                retries.append(_retry(e.p, e.run_id, row, e.decision))
                continue
            records.append(self._completed(e.p, e.run_id, row, e.attempt_error, now))
            job = (e.p, row.job_id)
            if row.buffered_at is not None and job not in buffered_taken:
                buffered_taken.add(job)
                records += self._buffered_run(conn, e.p, row.job_id, row, now)

    @staticmethod
    def _flush(conn, retries: list[timers.Retry], records: list[OutboxRow]) -> None:
        """Arm the retry timers and append the records _follow_ups collected."""
        timers.arm_retries(conn, retries)
        outbox.append(conn, records)

    def _end(self, conn, endings: list[Ending], now: int) -> list[Ended]:
        """end_attempts and all that follows, for runs the caller locked."""
        ended = self._write_ends(conn, endings, now)
        retries: list[timers.Retry] = []
        records: list[OutboxRow] = []
        self._follow_ups(conn, endings, ended, now, retries, records)
        self._flush(conn, retries, records)
        return ended

    @staticmethod
    def _runs_to_end(conn, keys: list[tuple[int, str]], now: int) -> list[RunToEnd]:
        """The runs of `keys` that exist, locked; over every day for those the
        recent days did not have."""

        def ask(keys, window: Days) -> list[RunToEnd | None]:
            found = {
                (r.p, r.run_id): r
                for r in _named(RunToEnd, window.execute(conn, Q["runs_to_end"], {
                    "p": [p for p, _r in keys], "run_id": [r for _p, r in keys],
                })).fetchall()
            }  # fmt: skip
            return [found.get(k) for k in keys]

        return [r for r in in_days(now, keys, ask, lambda r: r is None) if r is not None]

    def cancel(
        self, conn, tenant_id: str, run_id: str, now: int, reason: str = "cancelled"
    ) -> dict:
        p = _partition(run_id)
        with _atomic(conn):
            (run,) = self._runs_to_end(conn, [(p, run_id)], now) or (None,)
            if run is None or run.tenant_id != tenant_id:
                raise NotFound("run")
            if RunState(run.state).terminal:
                raise Conflict("NOT_RUNNABLE", f"the run is {run.state}")
            self._end(conn, [_cancelling(run, reason, set_error=True, now=now)], now)
        return {"state": RunState.CANCELLED.value}

    def cancel_waiting_runs_of_job(self, conn, p: int, job_id: str, now: int, reason: str) -> None:
        """A deleted job's runs that no worker holds (PENDING, RETRY_WAIT) end
        CANCELLED, each announced at its own attempt with `reason`; the runs keep
        their error column (a retried run's last error). Runs a worker holds
        finish as they would."""
        runs = _named(
            RunToEnd, conn.execute(Q["waiting_runs_of_job"], {"p": p, "job_id": job_id})
        ).fetchall()
        if runs:
            self._end(conn, [_cancelling(r, reason, set_error=False, now=now) for r in runs], now)

    @staticmethod
    def _seen(conn, p, run_id, tenant_id, now: int) -> Seen | None:
        key = {"p": p, "run_id": run_id, "tenant_id": tenant_id}
        return one_in_days(
            now, lambda w: _named(Seen, w.execute(conn, Q["run_state"], key)).fetchone()
        )

    def _stale_or_missing(self, conn, p, run_id, tenant_id, now: int) -> Exception:
        cur = self._seen(conn, p, run_id, tenant_id, now)
        if cur is None:
            return NotFound("run")
        return Conflict("STALE_ATTEMPT", "this attempt is no longer running")

    # -- what follows the end of an attempt ----------------------------------
    def _after_finish(
        self, conn, p: int, run_id: str, row: Ended, decision: Decision, error, now: int
    ) -> None:
        """After end_attempt (history, timers and buffered instant done): arm the
        retry, or announce the terminal state (and run the buffered instant)."""
        if row.state == RunState.RETRY_WAIT:
            timers.arm_retries(conn, [_retry(p, run_id, row, decision)])
            return
        done = self._completed(p, run_id, row, error, now)
        if row.buffered_at is None:
            outbox.append(conn, [done])  # one statement
            return
        outbox.append(conn, [done, *self._buffered_run(conn, p, row.job_id, row, now)])

    def _completed(self, p: int, run_id: str, row: Ended, error, now: int) -> OutboxRow:
        """The RunCompleted record of a terminal transition."""
        return OutboxRow(
            p,
            self.topics.run_completed,
            run_id.encode(),
            events.run_completed(
                run_id=run_id, tenant_id=row.tenant_id, partition_id=p, attempt=row.attempt,
                state=row.state, finished_ms=now, job_id=row.job_id,
                workflow_run_id=row.workflow_run_id, node=row.node, error=error,
            ),
        )  # fmt: skip

    def _buffered_run(self, conn, p: int, job_id: str, got: Ended, now: int) -> list[OutboxRow]:
        """Create the run of the buffered instant a transition took from its job."""
        at = to_ms(got.buffered_at)
        run = NewRuns()
        run.add_spec(
            p, run_id_for_instant(job_id, at), got.buffered_tenant_id, job_id, at,
            got.buffered_priority, run_spec(vars(got)),
            # An instant fired ahead and buffered: published no earlier than it.
            not_before_ms=at if at > now else None,
        )  # fmt: skip
        return insert_runs(conn, self.topics, run, now)

    # -- timer kinds -----------------------------------------------------------
    def on_expiry(self, conn, due: list[Timer], now: int, report: FireReport) -> list[OutboxRow]:
        """`lease` and `timeout` timers: end the attempt unless it already ended;
        a lease that heartbeats extended is re-armed at its new expiry."""
        keys = sorted({(t.partition_id, t.owner_id) for t in due})
        runs = {(r.p, r.run_id): r for r in self._runs_to_end(conn, keys, now)}
        endings: dict[tuple[int, str], Ending] = {}
        moves = timers.Moves()
        for t in due:
            key = (t.partition_id, t.owner_id)
            run = runs.get(key)
            check_lease = t.kind == "lease"
            current = run is not None and run.state == RunState.RUNNING and run.attempt == t.attempt
            if current and (not check_lease or run.lease_expires_at <= to_dt(now)):
                # The run's lease and timeout timers, this one among them, go with it.
                if key not in endings:
                    endings[key] = _expiring(
                        run, "lease expired" if check_lease else "timed out", now
                    )
            elif current and check_lease and run.lease_expires_at:
                moves.move(t, to_ms(run.lease_expires_at))
            else:
                moves.drop(t)
        moves.apply(conn)
        if endings:
            self._end(conn, list(endings.values()), now)
        return []

    def on_retry(self, conn, due: list[Timer], now: int, report: FireReport) -> list[OutboxRow]:
        """`retry` timers: RETRY_WAIT -> PENDING at attempt + 1, published again."""
        rows: list[OutboxRow] = []
        gone = timers.Moves()
        for t in due:
            gone.drop(t)
        gone.apply(conn)
        for t in due:
            args = {"p": t.partition_id, "run_id": t.owner_id, "attempt": t.attempt,
                    "now": to_dt(now)}  # fmt: skip
            got = one_in_days(
                now, lambda w, args=args: w.execute(conn, Q["retry_run"], args).fetchone()
            )
            if got is None:
                continue
            attempt, spec, tenant_id, job_id, wf_run, node, scheduled, priority = got
            target = spec["target"]
            rows.append(
                ready_row(
                    self.topics.runs(tenant_id), t.partition_id, t.owner_id, tenant_id, attempt,
                    to_ms(scheduled), now, priority, target["type"], target.get("queue"),
                    spec["payload"], job_id=job_id, workflow_run_id=wf_run, node=node,
                )
            )  # fmt: skip
            report.runs_created += 1
        return rows


def _retry(p: int, run_id: str, row: Ended, decision: Decision) -> timers.Retry:
    """The retry timer of an attempt that ended in RETRY_WAIT."""
    return timers.Retry(p, run_id, row.tenant_id, decision.retry_at_ms, row.priority, row.attempt)


def _named(cls, cur):
    """`cur`'s rows as `cls` (psycopg's class_row): set before the rows are
    read, so it holds in pipeline mode too."""
    cur.row_factory = class_row(cls)
    return cur


def _completion(p: int, c: CompleteCall, result: str | None, decision: Decision) -> Ending:
    """A CompleteRun as end_attempts applies it (`result` as JSON text)."""
    return Ending(
        p=p, run_id=c.run_id, tenant_id=c.tenant_id, from_state=RunState.RUNNING,
        attempt=c.attempt, token=c.start_token, decision=decision,
        set_result=True, result=result,
        error=c.error[:MAX_ERROR_CHARS] if c.error else None,
        attempt_outcome=c.outcome, attempt_error=c.error,
    )  # fmt: skip


def _expiring(run: RunToEnd, reason: str, now: int) -> Ending:
    """A lease or timeout expiry of a running attempt (locked): retried while
    attempts are left, else TIMED_OUT; the run keeps its result."""
    decision = decide(Outcome.TIMED_OUT, True, run.attempt, RetryPolicy.of(run.retry), now)
    return Ending(
        p=run.p, run_id=run.run_id, tenant_id=run.tenant_id, from_state=run.state,
        attempt=run.attempt, decision=decision, error=reason,
        attempt_outcome=Outcome.TIMED_OUT, attempt_error=reason,
    )  # fmt: skip


def _cancelling(run: RunToEnd, reason: str, set_error: bool, now: int) -> Ending:
    """A cancel of a run as it was found (and locked)."""
    return Ending(
        p=run.p, run_id=run.run_id, tenant_id=run.tenant_id, from_state=run.state,
        attempt=run.attempt, decision=decide(Outcome.CANCELLED, False, run.attempt, None, now),
        set_error=set_error, error=reason if set_error else None,
        attempt_outcome=Outcome.CANCELLED, attempt_error=reason,
    )  # fmt: skip


def _started(run_id: str, token: str, row: Started) -> dict:
    """StartRun's answer from a started row."""
    return {
        "run_id": run_id,
        "attempt": row.attempt,
        "start_token": token,
        "lease_expires_at": iso(to_ms(row.lease_expires_at)),
        "lease_ms": row.spec["lease_ms"],
        "payload": json.loads(row.spec["payload"]),
        "job_id": row.job_id,
        "workflow_run_id": row.workflow_run_id,
        "node": row.node,
    }


def _check_completion(attempt, start_token, outcome, result, error, retryable) -> None:
    _check_fence(attempt, start_token)
    if outcome not in ("SUCCEEDED", "FAILED"):
        raise ValidationError("outcome", "must be SUCCEEDED or FAILED")
    if not isinstance(retryable, bool):
        raise ValidationError("retryable", "must be true or false")
    if error is not None and not isinstance(error, str):
        raise ValidationError("error", "must be a string")
    if result is not None and len(json.dumps(result)) > MAX_RESULT_BYTES:
        raise ValidationError(
            "result", "is larger than 64 KiB", code="PAYLOAD_TOO_LARGE", status=413
        )


def _answer(call) -> list[dict | Exception]:
    """A single call's answer as start_many/complete_many give it: its result,
    or the refusal it raised, as a value."""
    try:
        return [call()]
    except (ValidationError, NotFound, Conflict) as e:
        return [e]


def _refused(state: RunState, cur_attempt: int, scheduled: int, attempt, now: int) -> Conflict:
    if attempt is not None and attempt != cur_attempt:
        return Conflict("STALE_ATTEMPT", f"the run is at attempt {cur_attempt}, not {attempt}")
    if state == RunState.RUNNING:
        return Conflict("ALREADY_STARTED", "another worker holds this attempt")
    if state == RunState.PENDING and scheduled > now:
        return Conflict("NOT_RUNNABLE", "the run is not due yet")
    return Conflict("NOT_RUNNABLE", f"the run is {state.value}")


def _check_fence(attempt: Any, start_token: Any) -> None:
    if isinstance(attempt, bool) or not isinstance(attempt, int) or not 1 <= attempt <= 2**31 - 1:
        raise ValidationError("attempt", "must be a positive integer")
    if not isinstance(start_token, str) or not start_token:
        raise ValidationError("start_token", "must be the token StartRun returned")
