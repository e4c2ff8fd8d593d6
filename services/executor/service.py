"""The managed executor: the platform's own worker for `managed` targets.

It consumes the RunReady records the dispatcher forwards to the tenants'
managed topics, starts each run through the fenced lifecycle as worker
`executor:<instance>`, runs the command in the sandbox (sandbox.py) while
heartbeating every lease/3, and completes the run by exit code with the
result `{exit_code, output, output_truncated}`:

- exit 0: SUCCEEDED; any other exit: FAILED, retryable (the job's retry policy
  decides whether another attempt follows);
- the job's `timeout_ms` passed: the process group is killed and nothing is
  completed: the lifecycle's `timeout` timer (armed by StartRun for the same
  instant) ends the attempt as it does for every worker: RETRY_WAIT while
  attempts remain, else TIMED_OUT;
- a heartbeat refused (cancelled, or the lease expired and the run moved on):
  the command is killed and nothing is completed;
- a target this executor will not run (network not allowed, limits above its
  ceilings): FAILED, not retryable, with the reason.

Offsets: a record is done once its run is started (or found not startable);
from then on the database owns the run, and if this process dies the lease
expires and the run is retried. So a crash re-reads at most a few records,
whose StartRun then answers ALREADY_STARTED or STALE_ATTEMPT. At a cap
(executor-wide or the tenant's) the record is held and its partition paused,
so other tenants' partitions keep flowing; it is offered again when a slot
frees. On shutdown, commands get `shutdown_grace_ms` to finish, then are
killed and completed FAILED retryable ("interrupted"), so the run is retried.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
import uuid
from dataclasses import dataclass

import psycopg
from confluent_kafka import Consumer, Message, TopicPartition
from prometheus_client import Counter, Gauge, Histogram

from cronwheel.consumer import ConsumerService, Poison, expect_owned
from cronwheel.core.clock import now_ms
from cronwheel.core.errors import Conflict, NotFound
from cronwheel.core.events import traceparent
from cronwheel.core.ids import partition_of_run
from cronwheel.core.runs import priority_rank
from cronwheel.fetch_watch import FetchWatch
from cronwheel.logs import run_fields
from cronwheel.store.db import LOST, Reconnecting
from cronwheel.store.lifecycle import Lifecycle
from services.executor.sandbox import (
    PAYLOAD_FILE,
    Exit,
    Policy,
    Sandbox,
    TargetRefused,
    command_env,
)
from services.executor.settings import ExecutorSettings

log = logging.getLogger("cronwheel.executor")

CONSUMER = "executor"
COMPLETE_TRIES = 6  # waits of 0.1 to 1.6 s between them: about 3 s in all
RUNS = Counter(
    "cronwheel_executor_runs_total",
    "Managed runs the executor ended, by how",
    ["outcome"],  # succeeded, failed, timed_out, lost, refused, interrupted
)
ACTIVE = Gauge("cronwheel_executor_active_runs", "Sandboxed commands running now")
RUN_SECONDS = Histogram(
    "cronwheel_executor_run_seconds",
    "Wall time of sandboxed commands, sandbox start included",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800, 3600),
)


class Slots:
    """The executor-wide and per-tenant caps on commands running at once."""

    def __init__(self, total: int, per_tenant: int):
        self.total = total
        self.per_tenant = per_tenant
        self._by_tenant: dict[str, int] = {}
        self._lock = threading.Lock()

    def take(self, tenant: str) -> bool:
        with self._lock:
            if sum(self._by_tenant.values()) >= self.total:
                return False
            if self._by_tenant.get(tenant, 0) >= self.per_tenant:
                return False
            self._by_tenant[tenant] = self._by_tenant.get(tenant, 0) + 1
            return True

    def give(self, tenant: str) -> None:
        with self._lock:
            left = self._by_tenant[tenant] - 1
            if left:
                self._by_tenant[tenant] = left
            else:
                del self._by_tenant[tenant]

    def in_use(self) -> int:
        with self._lock:
            return sum(self._by_tenant.values())


class Executor(ConsumerService):
    name = CONSUMER

    def __init__(
        self,
        *args,  # ConsumerService's: dsn, bootstrap, topics
        policy: Policy | None = None,  # None: Policy's defaults
        concurrency: int = ExecutorSettings.concurrency,
        per_tenant: int = ExecutorSettings.per_tenant,
        instance: str | None = None,
        session_timeout_ms: int = ExecutorSettings.session_timeout_ms,
        shutdown_grace_ms: int = ExecutorSettings.shutdown_grace_ms,
        fetch_watch_s: float = ExecutorSettings.fetch_watch_s,
        **skeleton,  # ConsumerService's: group_id, idle_ms, ...
    ):
        self.policy = policy or Policy()
        # Refuses to construct (SandboxUnavailable) where commands cannot be sandboxed.
        self.sandbox = Sandbox(self.policy, concurrency)
        super().__init__(*args, commit_every_s=0.5, shutdown_grace_ms=shutdown_grace_ms, **skeleton)
        self.slots = Slots(concurrency, per_tenant)
        self.instance = instance or uuid.uuid4().hex[:12]
        self.worker_id = f"executor:{self.instance}"
        self.session_timeout_ms = session_timeout_ms
        self.lifecycle = Lifecycle(self.topics)
        # Managed topics by name, announced by the dispatcher when it creates
        # one. A dead instance's tenants move on after `session_timeout_ms`,
        # the leases' TTL.
        self.lease_tenant_topics("managed", ttl_ms=session_timeout_ms)
        # A partition librdkafka holds and stopped fetching ends run() for new
        # clients (cronwheel.fetch_watch, main.py's run_restarting); the
        # commands under way finish first (stopping).
        self.fetch_watch = FetchWatch(fetch_watch_s) if fetch_watch_s else None
        self.started_total = 0
        # A partition parked at a cap: its next record, held here, and paused
        # (pausing drops what was fetched after it; resuming continues after it).
        # Held with its class and the order it was held in: offered in that order.
        self._held: dict[tuple[str, int], tuple[int, int, Message]] = {}
        self._held_seq = itertools.count()
        self._room = threading.Event()
        self._runners: set[threading.Thread] = set()
        self._dbs: list[Reconnecting] = []  # idle connections of finished runs, for the next ones
        self._dbs_lock = threading.Lock()

    # -- the consumer loop ----------------------------------------------------

    def turn(self, consumer: Consumer, stop: threading.Event) -> bool:
        self._retry_held(consumer, stop)
        msg = consumer.poll(0.01 if self._held else self.idle_ms / 1000)
        for m in self.records([msg] if msg is not None else []):
            self._handle(consumer, m, stop)
        return True

    def stopping(self, stop: threading.Event) -> None:
        self._wait_for_runners()

    def warm(self, conn: psycopg.Connection) -> None:
        self.lifecycle.warm(conn, self.worker_id, now_ms())

    def held_back(self) -> set[tuple[str, int]]:
        """Partitions parked at a cap (paused): not read on purpose."""
        return set(self._held)

    def close(self) -> None:
        super().close()
        for db in self._dbs:
            db.close()
        self.sandbox.close()

    def _handle(self, consumer: Consumer, msg: Message, stop: threading.Event) -> None:
        where = (msg.topic(), msg.partition())
        try:
            datum = self._decode(msg)
        except Poison as p:
            if self.dead_letters.send([(msg, p)], stop, self.shutdown_grace_ms / 1000):
                self.offsets.finished(msg)
            return  # else stopping: not done, read again after a restart
        tenant = datum["tenant_id"]
        if not self.slots.take(tenant):
            # At a cap: park this partition at this record until a slot frees.
            consumer.pause([TopicPartition(*where)])
            self._held[where] = (priority_rank(datum.get("priority")), next(self._held_seq), msg)
            return
        try:
            begun = self.with_db(lambda conn: self._start(conn, datum), stop, _STOPPED)
        except BaseException:
            self.slots.give(tenant)
            raise
        if begun is _STOPPED:
            self.slots.give(tenant)
            return  # not done: read again after a restart
        self.offsets.finished(msg)
        if begun is None:
            self.slots.give(tenant)
            return
        ACTIVE.inc()
        runner = threading.Thread(
            target=self._execute, args=(begun,), name=f"run-{datum['run_id']}", daemon=True
        )
        self._runners.add(runner)
        runner.start()

    def _decode(self, msg: Message) -> dict:
        datum = expect_owned(msg, "RunReady", self.topics.managed)
        try:
            partition_of_run(datum["run_id"])
        except ValueError:
            raise Poison("bad_run_id", f"run_id {datum['run_id']!r} is not a run id") from None
        if datum["target_type"] != "managed":
            raise Poison("wrong_target", f"target_type {datum['target_type']!r} is not managed")
        return datum

    def _start(self, conn: psycopg.Connection, datum: dict) -> _Started | None:
        """StartRun for the record's attempt; None when it is not ours to run."""
        run_id, tenant = datum["run_id"], datum["tenant_id"]
        early_ms = datum["scheduled_at"] - now_ms()
        if 0 < early_ms <= 5000:  # a clock ahead of ours: wait rather than drop it
            self._stop.wait(early_ms / 1000)
        spec = self.lifecycle.spec(conn, tenant, run_id, now_ms())
        if spec is None:
            log.warning(
                "run %s: no such run for tenant %s",
                run_id,
                tenant,
                extra=run_fields(tenant_id=tenant, run_id=run_id, attempt=datum["attempt"]),
            )
            return None
        started_at = time.monotonic()
        try:
            got = self.lifecycle.start(
                conn, tenant, run_id, self.worker_id, now_ms(), attempt=datum["attempt"]
            )
        except (Conflict, NotFound) as e:
            log.info(
                "run %s attempt %s not started: %s",
                run_id,
                datum["attempt"],
                e,
                extra=run_fields(tenant_id=tenant, run_id=run_id, attempt=datum["attempt"]),
            )
            return None
        self.started_total += 1
        return _Started(
            tenant_id=tenant,
            run_id=run_id,
            attempt=got["attempt"],
            token=got["start_token"],
            lease_ms=got["lease_ms"],
            spec=spec,
            started_at=started_at,
        )

    # -- one run, in its own thread -------------------------------------------

    def _execute(self, run: _Started) -> None:
        with self._dbs_lock:
            db = self._dbs.pop() if self._dbs else Reconnecting(self.dsn, log)
        try:
            self._run_and_complete(db, run)
        except Exception:
            log.exception(
                "run %s attempt %d: executor error",
                run.run_id,
                run.attempt,
                extra=run_fields(tenant_id=run.tenant_id, run_id=run.run_id, attempt=run.attempt),
            )
            db.close()
        finally:
            with self._dbs_lock:
                self._dbs.append(db)  # at most `concurrency` of them
            self.slots.give(run.tenant_id)
            ACTIVE.dec()
            self._room.set()
            self._runners.discard(threading.current_thread())

    def _run_and_complete(self, db: Reconnecting, run: _Started) -> None:
        target, spec = run.spec["target"], run.spec
        try:
            limits = self.sandbox.limits_for(target)
            env = command_env(
                target.get("env") or {},
                {
                    "CRONWHEEL_RUN_ID": run.run_id,
                    "CRONWHEEL_ATTEMPT": str(run.attempt),
                    "CRONWHEEL_PAYLOAD_FILE": PAYLOAD_FILE,
                    # The run's W3C trace, where OpenTelemetry's SDKs read a
                    # parent from the environment (docs/events.md).
                    "TRACEPARENT": traceparent(run.run_id, run.attempt),
                },
            )
        except TargetRefused as e:
            RUNS.labels("refused").inc()
            self._complete(db, run, "FAILED", None, f"refused: {e}", retryable=False)
            return
        timeout_ms = spec.get("timeout_ms")
        job_deadline = timeout_ms is not None and timeout_ms <= self.policy.max_wall_ms
        wall_ms = timeout_ms if job_deadline else self.policy.max_wall_ms

        def heartbeat() -> bool:
            try:
                self.lifecycle.heartbeat(
                    db.connection(), run.tenant_id, run.run_id, run.attempt, run.token, now_ms()
                )
            except (Conflict, NotFound):
                return False  # cancelled, or the attempt already ended: stop the command
            except psycopg.Error as e:
                log.warning(
                    "run %s: heartbeat failed (%s); trying again",
                    run.run_id,
                    e,
                    extra=run_fields(
                        tenant_id=run.tenant_id, run_id=run.run_id, attempt=run.attempt
                    ),
                )
                db.close()
            return True

        try:
            got = self.sandbox.run(
                target["command"],
                env,
                limits,
                payload=spec.get("payload", "null"),
                deadline=run.started_at + wall_ms / 1000,
                tick=heartbeat,
                tick_every=run.lease_ms / 3000,
                stop=self._stop,
                grace=self.shutdown_grace_ms / 1000,
            )
        except ValueError as e:  # e.g. a NUL byte in the command
            RUNS.labels("refused").inc()
            self._complete(db, run, "FAILED", None, f"refused: {e}", retryable=False)
            return
        except OSError as e:
            RUNS.labels("failed").inc()
            self._complete(db, run, "FAILED", None, f"the sandbox did not start: {e}", True)
            return
        RUN_SECONDS.observe(got.duration_ms / 1000)
        log.info(
            "run %s attempt %d: %s, exit code %d, %d ms",
            run.run_id, run.attempt, got.reason, got.code, got.duration_ms,
            extra=run_fields(tenant_id=run.tenant_id, run_id=run.run_id, attempt=run.attempt),
        )  # fmt: skip
        self._finish(db, run, got, job_deadline)

    def _finish(self, db: Reconnecting, run: _Started, got: Exit, job_deadline: bool) -> None:
        result = {
            "exit_code": got.code,
            "output": got.output,
            "output_truncated": got.truncated,
        }
        if got.reason == "exited":
            ok = got.code == 0
            RUNS.labels("succeeded" if ok else "failed").inc()
            error = None if ok else f"exit code {got.code}"
            self._complete(db, run, "SUCCEEDED" if ok else "FAILED", result, error, True)
        elif got.reason == "timeout" and job_deadline:
            RUNS.labels("timed_out").inc()  # the lifecycle's timeout timer ends the attempt
        elif got.reason == "timeout":
            RUNS.labels("failed").inc()
            error = f"killed at the executor's wall-clock limit ({self.policy.max_wall_ms} ms)"
            self._complete(db, run, "FAILED", result, error, False)
        elif got.reason == "stopped":
            RUNS.labels("interrupted").inc()
            self._complete(db, run, "FAILED", result, "interrupted: the executor stopped", True)
        else:  # aborted: the attempt is no longer ours
            RUNS.labels("lost").inc()

    def _complete(
        self, db: Reconnecting, run: _Started, outcome, result, error, retryable: bool
    ) -> None:
        """CompleteRun, tried again while the database is away (the reconnect
        policy, stopping or not: an interrupted run is completed on the way
        out), at most COMPLETE_TRIES times; then the lease brings the run back."""

        def complete(conn: psycopg.Connection) -> None:
            self.lifecycle.complete(
                conn, run.tenant_id, run.run_id, run.attempt, run.token, outcome,
                now_ms(), result=result, error=error, retryable=retryable,
            )  # fmt: skip

        try:
            db.call(complete, None, tries=COMPLETE_TRIES)
        except (Conflict, NotFound) as e:
            log.info(
                "run %s attempt %d: completion refused: %s",
                run.run_id,
                run.attempt,
                e,
                extra=run_fields(tenant_id=run.tenant_id, run_id=run.run_id, attempt=run.attempt),
            )
        except LOST as e:
            log.error(
                "run %s attempt %d: not completed (%s); its lease will expire",
                run.run_id, run.attempt, e,
                extra=run_fields(tenant_id=run.tenant_id, run_id=run.run_id, attempt=run.attempt),
            )  # fmt: skip

    def _wait_for_runners(self) -> None:
        """Commands get shutdown_grace_ms to finish (they see `stop`), then are
        killed and completed FAILED retryable, so the run is retried."""
        deadline = time.monotonic() + self.shutdown_grace_ms / 1000 + 10
        for t in list(self._runners):
            t.join(max(0.0, deadline - time.monotonic()))

    # -- partitions, offsets, the database ------------------------------------

    def _retry_held(self, consumer: Consumer, stop: threading.Event) -> None:
        """Once a slot freed, offer the held records again; a partition whose
        record found a slot resumes."""
        if not self._held or not self._room.is_set():
            return
        self._room.clear()
        # By class, then the order they were held: the dispatcher puts each
        # class in partitions of its own, so a critical record waits held in
        # its own partition and takes the first slot that frees.
        for where in sorted(self._held, key=self._held.__getitem__):
            *_order, msg = self._held.pop(where)
            self._handle(consumer, msg, stop)
            if where not in self._held:
                consumer.resume([TopicPartition(*where)])

    def forget(self, where: tuple[str, int]) -> None:
        """A lease moved: the held record's new owner reads it again (runs in
        progress go on; StartRun fenced them)."""
        self._held.pop(where, None)


@dataclass(frozen=True)
class _Started:
    """An attempt this executor won: what it needs to run, heartbeat and complete it."""

    tenant_id: str
    run_id: str
    attempt: int
    token: str
    lease_ms: int
    spec: dict
    started_at: float  # time.monotonic() just before StartRun: timeout_ms counts from here


_STOPPED = object()
