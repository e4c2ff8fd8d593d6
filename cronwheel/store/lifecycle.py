"""The run lifecycle: StartRun, Heartbeat, CompleteRun, cancel, and the timers
that end attempts (lease expiry, timeout) and bring retries back.

Fencing: Heartbeat and CompleteRun hold only for the (attempt, start_token) that
StartRun handed out, while the run is RUNNING. A duplicate, late or stale call
changes nothing and gets STALE_ATTEMPT. Every terminal transition writes a
RunCompleted record through the outbox in the same transaction.

StartRun and CompleteRun are one statement each (data-modifying CTEs in
lifecycle.sql), plus one for what needs the statement's answer first (the
retry timer, the RunCompleted record). Called inside an open transaction (the
gateway's request) they add no savepoint: nothing changes before the one
statement that decides, so a refusal has nothing to undo.
"""

from __future__ import annotations

import contextlib
import json
import random
import secrets
from typing import Any, NamedTuple

from psycopg import pq
from psycopg.types.json import Jsonb

from cronwheel.core import events
from cronwheel.core.clock import iso, to_dt, to_ms
from cronwheel.core.errors import Conflict, NotFound, ValidationError
from cronwheel.core.events import OutboxRow
from cronwheel.core.ids import partition_of_run, run_id_for_instant
from cronwheel.core.runs import RunState, priority_rank
from cronwheel.kafka import Topics
from cronwheel.store import outbox, pgarrays
from cronwheel.store.firing import FireReport, Timer, insert_runs
from cronwheel.store.sql_loader import queries

Q = queries("lifecycle")
QF = queries("firing")
MAX_RESULT_BYTES = 64 * 1024
MAX_ERROR_CHARS = 4096


def backoff_ms(retry: dict, attempt: int, rng: random.Random | None = None) -> int:
    """Exponential backoff after `attempt` failed, with equal jitter: half fixed,
    half random, so retries of a herd spread out but never come back too early."""
    base = retry["initial_backoff_ms"] * retry["multiplier"] ** (attempt - 1)
    delay = min(retry["max_backoff_ms"], base)
    return int(delay / 2 + (rng or random).random() * delay / 2)


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


def _timer(p: int, kind: str, run_id: str, due_ms: int, priority: str, attempt: int) -> dict:
    return {
        "p": p,
        "id": f"{kind}:{run_id}",
        "kind": kind,
        "owner": run_id,
        "due": to_dt(due_ms),
        "prio": priority_rank(priority),
        "attempt": attempt,
    }


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
            "token": token, "now": to_dt(now), "attempt": attempt,
        }  # fmt: skip
        row = conn.execute(Q["start_attempt"], args).fetchone()
        if row is None:
            raise NotFound("run")
        if row[0] is None:
            raise self._refusal(conn, p, run_id, tenant_id, attempt, now, row[6:9])
        return _started(run_id, token, row)

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
                rows = conn.execute(
                    Q["start_many"],
                    {  # binary arrays: the list dumper cost ~2 us an element
                        "p": pgarrays.int2_array([p for _i, p, _t in batch]),
                        "run_id": pgarrays.text_array([c.run_id for c in cs]),
                        "tenant_id": pgarrays.text_array([c.tenant_id for c in cs]),
                        "worker_id": pgarrays.text_array([c.worker_id for c in cs]),
                        "token": pgarrays.text_array([t for _i, _p, t in batch]),
                        "attempt": pgarrays.int4_array([c.attempt for c in cs]),
                        "now": to_dt(now),
                    },
                ).fetchall()
                for (i, p, token), c, row in zip(batch, cs, rows, strict=True):
                    if row[1] is not None:
                        answers[i] = _started(c.run_id, token, row[1:])
                    elif row[7] is None:
                        answers[i] = NotFound("run")
                    else:
                        answers[i] = self._refusal(
                            conn, p, c.run_id, c.tenant_id, c.attempt, now, row[7:10]
                        )
        return answers  # type: ignore[return-value]

    def _refusal(self, conn, p, run_id, tenant_id, attempt, now, seen) -> Exception:
        """Why StartRun did not start the run, from the state it found (`seen`).
        A run that looked startable lost a race for its row: ask again."""
        state, cur_attempt, scheduled = RunState(seen[0]), seen[1], to_ms(seen[2])
        startable = state == RunState.PENDING and scheduled <= now + 1000
        if startable and (attempt is None or attempt == cur_attempt):
            return self._why_not_started(conn, p, run_id, tenant_id, attempt, now)
        return _refused(state, cur_attempt, scheduled, attempt, now)

    def spec(self, conn, tenant_id: str, run_id: str) -> dict | None:
        """The run's snapshot (target, payload, retry, timeout_ms, lease_ms), for the
        platform's own workers; never sent over the worker API (webhook headers)."""
        row = conn.execute(
            Q["run_spec"], {"p": _partition(run_id), "run_id": run_id, "tenant_id": tenant_id}
        ).fetchone()
        return row[0] if row else None

    def _why_not_started(self, conn, p, run_id, tenant_id, attempt, now) -> Exception:
        cur = conn.execute(
            Q["run_state"], {"p": p, "run_id": run_id, "tenant_id": tenant_id}
        ).fetchone()
        if cur is None:
            return NotFound("run")
        return _refused(RunState(cur[0]), cur[1], to_ms(cur[2]), attempt, now)

    def heartbeat(
        self, conn, tenant_id: str, run_id: str, attempt: Any, start_token: Any, now: int
    ) -> dict:
        _check_fence(attempt, start_token)
        p = _partition(run_id)
        row = conn.execute(
            Q["heartbeat"],
            {"p": p, "run_id": run_id, "tenant_id": tenant_id, "attempt": attempt,
             "token": start_token, "now": to_dt(now)},
        ).fetchone()  # fmt: skip
        if row is None:
            raise self._stale_or_missing(conn, p, run_id, tenant_id)
        return {"lease_expires_at": iso(to_ms(row[0]))}

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
            row = conn.execute(
                Q["finish_attempt"],
                {
                    "p": p, "run_id": run_id, "tenant_id": tenant_id, "attempt": attempt,
                    "token": start_token, "outcome": outcome, "retryable": retryable,
                    "now": to_dt(now), "result": None if result is None else Jsonb(result),
                    "error": error[:MAX_ERROR_CHARS] if error else None,
                    "attempt_error": error,
                },
            ).fetchone()  # fmt: skip
            if row is None:
                raise self._stale_or_missing(conn, p, run_id, tenant_id)
            self._after_finish(conn, p, run_id, row, error, now)
        return {"state": row[0], "attempt": row[1]}

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
        retries: list[dict] = []
        records: list[OutboxRow] = []
        with _atomic(conn):
            _generic_plans(conn)
            for rnd in _rounds([(p, calls[i].run_id) for i, p, _r in todo]):
                batch = [todo[k] for k in rnd]
                rows = conn.execute(Q["finish_many"], self._finish_args(calls, batch, now))
                buffered_taken: set[tuple[int, str]] = set()
                for (i, p, _r), row in zip(batch, rows.fetchall(), strict=True):
                    c, row = calls[i], row[1:]
                    if row[0] is None:
                        answers[i] = self._stale_or_missing(conn, p, c.run_id, c.tenant_id)
                        continue
                    answers[i] = {"state": row[0], "attempt": row[1]}
                    if row[0] == RunState.RETRY_WAIT:
                        due = now + backoff_ms(row[2]["retry"], row[1])
                        retries.append(
                            {
                                **_timer(p, "retry", c.run_id, due, row[8], row[1]),
                                "t": row[3],
                                "due_ms": due,
                            }
                        )
                        continue
                    records.append(self._completed(p, c.run_id, row, c.error, now))
                    job = (p, row[4])
                    if row[9] is not None and job not in buffered_taken:
                        buffered_taken.add(job)
                        records += self._buffered_run(conn, p, row[4], row[9:], now)
            if retries:
                conn.execute(
                    Q["arm_retries"],
                    {
                        **{k: [r[k] for r in retries] for k in ("p", "owner", "due", "prio")},
                        "attempt": [r["attempt"] for r in retries],
                        "tenant_id": [r["t"] for r in retries],
                        "due_ms": min(r["due_ms"] for r in retries),
                    },
                )
            outbox.append(conn, records)
        return answers  # type: ignore[return-value]

    @staticmethod
    def _finish_args(calls: list[CompleteCall], batch, now: int) -> dict:
        cs = [calls[i] for i, _p, _r in batch]
        return {  # binary arrays, as in start_many
            "p": pgarrays.int2_array([p for _i, p, _r in batch]),
            "run_id": pgarrays.text_array([c.run_id for c in cs]),
            "tenant_id": pgarrays.text_array([c.tenant_id for c in cs]),
            "attempt": pgarrays.int4_array([c.attempt for c in cs]),
            "token": pgarrays.text_array([c.start_token for c in cs]),
            "outcome": pgarrays.text_array([c.outcome for c in cs]),
            "retryable": pgarrays.bool_array([c.retryable for c in cs]),
            "result": pgarrays.text_array([r for _i, _p, r in batch]),
            "error": pgarrays.text_array(
                [c.error[:MAX_ERROR_CHARS] if c.error else None for c in cs]
            ),
            "attempt_error": pgarrays.text_array([c.error for c in cs]),
            "now": to_dt(now),
        }

    def cancel(
        self, conn, tenant_id: str, run_id: str, now: int, reason: str = "cancelled"
    ) -> dict:
        p = _partition(run_id)
        with _atomic(conn):
            row = conn.execute(
                Q["cancel_run"],
                {
                    "p": p,
                    "run_id": run_id,
                    "tenant_id": tenant_id,
                    "now": to_dt(now),
                    "error": reason,
                },
            ).fetchone()
            if row is None:
                cur = conn.execute(
                    Q["run_state"], {"p": p, "run_id": run_id, "tenant_id": tenant_id}
                ).fetchone()
                if cur is None:
                    raise NotFound("run")
                raise Conflict("NOT_RUNNABLE", f"the run is {cur[0]}")
            self._after_attempt(conn, p, run_id, row, "CANCELLED", reason, now)
        return {"state": row[0]}

    def _stale_or_missing(self, conn, p, run_id, tenant_id) -> Exception:
        cur = conn.execute(
            Q["run_state"], {"p": p, "run_id": run_id, "tenant_id": tenant_id}
        ).fetchone()
        if cur is None:
            return NotFound("run")
        return Conflict("STALE_ATTEMPT", "this attempt is no longer running")

    # -- what follows the end of an attempt ----------------------------------
    def _after_finish(self, conn, p: int, run_id: str, row, error, now: int) -> None:
        """After finish_attempt or finish_many (history, timers and buffered instant done): arm
        the retry, or announce the terminal state (and run the buffered instant)."""
        state, attempt, spec, tenant_id, job_id, wf_run, node = row[:7]
        priority, buffered = row[8], row[9:]
        if state == RunState.RETRY_WAIT:
            due = now + backoff_ms(spec["retry"], attempt)
            timer = _timer(p, "retry", run_id, due, priority, attempt)
            conn.execute(Q["arm_retry"], {**timer, "tenant_id": tenant_id, "due_ms": due})
            return
        done = self._completed(p, run_id, row, error, now)
        if buffered[0] is None:
            conn.execute(
                Q["announce"],
                {"p": p, "topic": done.topic, "key": done.key, "value": done.value,
                 "priority": outbox.rank_of(done)},
            )  # fmt: skip
            return
        outbox.append(conn, [done, *self._buffered_run(conn, p, job_id, buffered, now)])

    def _completed(self, p: int, run_id: str, row, error, now: int) -> OutboxRow:
        """The RunCompleted record of a terminal transition (`row` as the
        finishing statement returns it: state, attempt, spec, tenant, job,
        workflow run, node, ...)."""
        state, attempt, _spec, tenant_id, job_id, wf_run, node = row[:7]
        return OutboxRow(
            p,
            self.topics.run_completed,
            run_id.encode(),
            events.run_completed(
                run_id=run_id, tenant_id=tenant_id, partition_id=p, attempt=attempt,
                state=state, finished_ms=now, job_id=job_id, workflow_run_id=wf_run,
                node=node, error=error,
            ),
        )  # fmt: skip

    def _after_attempt(self, conn, p: int, run_id: str, row, outcome: str, error, now: int) -> None:
        """Record the attempt, drop its timers, then either schedule the retry or
        announce the terminal state (and release a buffered instant)."""
        state, attempt, spec, tenant_id, job_id, wf_run, node = row[:7]
        priority = row[8]
        conn.execute(
            Q["record_attempt_end"],
            {"p": p, "run_id": run_id, "attempt": attempt, "outcome": outcome, "error": error, "now": to_dt(now)},
        )  # fmt: skip
        conn.execute(
            QF["delete_timers"], {"p": [p, p], "id": [f"lease:{run_id}", f"timeout:{run_id}"]}
        )
        if state == RunState.RETRY_WAIT:
            due = now + backoff_ms(spec["retry"], attempt)
            conn.execute(QF["upsert_timer"], _timer(p, "retry", run_id, due, priority, attempt))
            conn.execute(QF["notify_timer"], {"due_ms": due})
            return
        rows = [self._completed(p, run_id, row, error, now)]
        if job_id:
            rows += self._release_buffered(conn, p, job_id, now)
        outbox.append(conn, rows)

    def _release_buffered(self, conn, p: int, job_id: str, now: int) -> list[OutboxRow]:
        got = conn.execute(Q["take_buffered_instant"], {"p": p, "job_id": job_id}).fetchone()
        if got is None:
            return []
        return self._buffered_run(conn, p, job_id, got, now)

    def _buffered_run(self, conn, p: int, job_id: str, got, now: int) -> list[OutboxRow]:
        """Create the run of a taken buffered instant (take_buffered_instant's row)."""
        at = to_ms(got[0])
        spec = {
            "target": got[2],
            "payload": got[3],
            "retry": got[4],
            "timeout_ms": got[5],
            "lease_ms": got[6],
        }
        run = {
            "partition_id": p, "run_id": run_id_for_instant(job_id, at), "tenant_id": got[1],
            "job_id": job_id, "scheduled_ms": at, "covers": None, "priority": got[7], "spec": spec,
            # An instant fired ahead and buffered: published no earlier than it.
            "not_before_ms": at if at > now else None,
        }  # fmt: skip
        return insert_runs(conn, self.topics, [run], now)

    # -- timer kinds -----------------------------------------------------------
    def on_expiry(self, conn, timers: list[Timer], now: int, report: FireReport) -> list[OutboxRow]:
        """`lease` and `timeout` timers: end the attempt unless it already ended;
        a lease that heartbeats extended is re-armed at its new expiry."""
        for t in timers:
            check_lease = t.kind == "lease"
            args = {
                "p": t.partition_id, "run_id": t.owner_id, "attempt": t.attempt, "now": to_dt(now),
                "check_lease": check_lease,
                "error": "lease expired" if check_lease else "timed out",
            }  # fmt: skip
            row = conn.execute(Q["expire_attempt"], args).fetchone()
            if row is not None:
                conn.execute(QF["delete_timers"], {"p": [t.partition_id], "id": [t.timer_id]})
                self._after_attempt(
                    conn, t.partition_id, t.owner_id, row, "TIMED_OUT", args["error"], now
                )
                continue
            cur = conn.execute(
                Q["lease_of"], {"p": t.partition_id, "run_id": t.owner_id}
            ).fetchone()
            if check_lease and cur and cur[0] == "RUNNING" and cur[1] == t.attempt and cur[2]:
                conn.execute(
                    QF["reschedule_timers"],
                    {"p": [t.partition_id], "id": [t.timer_id], "d": [cur[2]]},
                )
            else:
                conn.execute(QF["delete_timers"], {"p": [t.partition_id], "id": [t.timer_id]})
        return []

    def on_retry(self, conn, timers: list[Timer], now: int, report: FireReport) -> list[OutboxRow]:
        """`retry` timers: RETRY_WAIT -> PENDING at attempt + 1, published again."""
        rows: list[OutboxRow] = []
        for t in timers:
            conn.execute(QF["delete_timers"], {"p": [t.partition_id], "id": [t.timer_id]})
            got = conn.execute(
                Q["retry_run"],
                {
                    "p": t.partition_id,
                    "run_id": t.owner_id,
                    "attempt": t.attempt,
                    "now": to_dt(now),
                },
            ).fetchone()
            if got is None:
                continue
            attempt, spec, tenant_id, job_id, wf_run, node, scheduled, priority = got
            value = events.run_ready(
                run_id=t.owner_id, tenant_id=tenant_id, partition_id=t.partition_id, attempt=attempt,
                scheduled_ms=to_ms(scheduled), created_ms=now, priority=priority,
                target=spec["target"], payload=spec["payload"], job_id=job_id,
                workflow_run_id=wf_run, node=node,
            )  # fmt: skip
            rows.append(
                OutboxRow(t.partition_id, self.topics.runs(tenant_id), t.owner_id.encode(), value)
            )
            report.runs_created += 1
        return rows


def _started(run_id: str, token: str, row) -> dict:
    """StartRun's answer from a started row (attempt, lease expiry, spec, job,
    workflow run, node)."""
    spec = row[2]
    return {
        "run_id": run_id,
        "attempt": row[0],
        "start_token": token,
        "lease_expires_at": iso(to_ms(row[1])),
        "lease_ms": spec["lease_ms"],
        "payload": json.loads(spec["payload"]),
        "job_id": row[3],
        "workflow_run_id": row[4],
        "node": row[5],
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
