"""The timer service: the firing loop over due timers of the partitions it leases.

It sleeps until the earliest due time it knows of. The next few seconds of due
times are loaded into memory ahead of time (the timing wheel), so it wakes at the
due millisecond rather than on a polling tick; LISTEN/NOTIFY on `cw_timers` wakes
it early when a nearer timer is written. The database stays the truth: the wheel
only decides when to look, and every firing claims rows in a transaction.

Firing ahead (`ahead_ms`, docs/architecture.md): a job timer is claimed that
long before it is due, so a second's instants are created in a few large
transactions rather than one small one each, and the relay publishes each run
at its instant. The wheel holds wake times: a job timer's due time less half
the lead (firing.wake_lead), any other timer's due time.
"""

from __future__ import annotations

import heapq
import logging
import threading
from collections.abc import Callable

import psycopg
from prometheus_client import Counter

from cronwheel import metrics
from cronwheel.config import Firing as FiringSettings
from cronwheel.core.runs import PRIORITIES
from cronwheel.kafka import Topics
from cronwheel.store.db import connect, keep_connected
from cronwheel.store.dbclock import DbClock
from cronwheel.store.firing import FireReport, Firing, Handler, wake_lead
from cronwheel.store.leases import Leases
from cronwheel.store.pending import DEADLINES_MS, PendingRuns, next_sweep
from cronwheel.store.timer_kinds import timer_handlers
from cronwheel.store.timers import arm_sweeps
from services.timer.settings import TimerSettings

log = logging.getLogger("cronwheel.timer")

RUNS_REANNOUNCED = Counter(
    "cronwheel_runs_reannounced_total",
    "PENDING runs announced again because no worker started them by their deadline"
    " (docs/pending-deadline.md)",
    ["priority"],
)


class TimingWheel:
    """The upcoming wake times of owned partitions, earliest first (a heap).

    Refilled from the database every half lookahead (or when empty); between
    refills it learns new due times from the firing itself (the next instants
    of the timers it just moved) and from NOTIFY, so a busy loop does not
    query for what it already knows. A job timer is woken for `lead_ms` before
    it is due, and forgotten once a claim ahead took it (drop_through)."""

    def __init__(self, lead_ms: int = 0) -> None:
        self.lead_ms = lead_ms
        self._due: list[tuple[int, bool]] = []  # (wake time, a job timer's)
        self.loaded_at: int | None = None
        self.complete_until: int | None = None  # the load knew every wake time up to here

    def load(self, entries: list[tuple[int, bool]], now: int, complete_until: int) -> None:
        self._due = list(entries)
        heapq.heapify(self._due)
        self.loaded_at = now
        self.complete_until = complete_until

    def add(self, wake: int) -> None:
        heapq.heappush(self._due, (wake, False))

    def add_job(self, due: int) -> None:
        heapq.heappush(self._due, (due - self.lead_ms, True))

    def drop_through(self, now: int, jobs_claimed_until: int | None = None) -> None:
        """Forget what a firing at `now` handled: every wake time up to it, and
        job timers due by `jobs_claimed_until` (the claim's lead)."""
        jobs_until = now if jobs_claimed_until is None else jobs_claimed_until
        while self._due:
            wake, job = self._due[0]
            if wake > now and not (job and wake + self.lead_ms <= jobs_until):
                break
            heapq.heappop(self._due)

    def stale(self, now: int, lookahead_ms: int) -> bool:
        return (
            not self._due
            or self.loaded_at is None
            or now - self.loaded_at >= lookahead_ms // 2
            or now >= self.complete_until
        )

    def next_wake(self) -> int | None:
        """The earliest known wake time, or the end of what the last load knew
        (past it the wheel must look again: a load is capped per class)."""
        candidates = [self._due[0][0]] if self._due else []
        if self.complete_until is not None:
            candidates.append(self.complete_until)
        return min(candidates) if candidates else None


class TimerService:
    def __init__(
        self,
        dsn: str,
        topics: Topics,
        *,
        batch: int = TimerSettings.batch,
        critical_batch: int = TimerSettings.critical_batch,
        lease_ttl_ms: int = FiringSettings.lease_ttl_ms,
        lookahead_ms: int = 2_000,
        idle_ms: int = 1_000,
        wheel_limit: int = 2048,
        handlers: dict[str, Handler] | None = None,
        clock: Callable[[], int] | None = None,
        instance: str | None = None,
        ahead_ms: int = FiringSettings.fire_ahead_ms,  # 0: each run at its instant
        pending_deadlines_ms: tuple[int, ...] = DEADLINES_MS,  # by class rank
        pending_sweep_ms: int = TimerSettings.pending_sweep_ms,
    ):
        self.dsn = dsn
        self.ahead_ms = ahead_ms
        # PENDING runs past their deadline are announced again: each owned
        # partition's sweep timer (armed when its lease is taken) runs it.
        self.pending_sweep_ms = pending_sweep_ms
        pending = PendingRuns(topics, pending_deadlines_ms, pending_sweep_ms)
        # The firing loop is the same for every feature; features add timer kinds.
        # critical_batch > 0: a storm led by critical timers starts with a
        # small batch of them alone (docs/priority.md, "Critical first", says
        # why it is off by default).
        self.firing = Firing(
            topics,
            {**timer_handlers(topics), "pending": pending.on_timers, **(handlers or {})},
            critical_batch=critical_batch,
            ahead_ms=ahead_ms,
        )
        self.leases = Leases("timer", ttl_ms=lease_ttl_ms)
        if instance:
            self.leases.owner = instance
        self.batch = batch
        self.lookahead_ms = lookahead_ms
        self.idle_ms = idle_ms
        self.wheel_limit = wheel_limit  # due times per class one wheel load reads
        # Leases and due times are judged by the database's clock (a DbClock,
        # synced at every lease tick), not this host's: a host running ahead
        # would take live partition leases and fire expiries early. A test
        # passes a clock of its own to control time. The leases' own clock is
        # the same one (their release on the way out reads it).
        self.clock: Callable[[], int] = clock if clock is not None else self.leases.clock
        self.wheel = TimingWheel(wake_lead(ahead_ms))
        self.fired_total = 0
        self._swept: set[int] = set()  # owned partitions whose sweep timer is armed

    def run(self, stop: threading.Event) -> None:
        keep_connected(self._run_connected, stop, log)

    def _run_connected(self, stop: threading.Event) -> None:
        with (
            connect(self.dsn, idle_tx_timeout_ms=max(2 * self.leases.ttl_ms, 10_000)) as conn,
            connect(self.dsn) as listen,
        ):
            listen.execute("LISTEN cw_timers")
            next_lease = 0
            try:
                while not stop.is_set():
                    now = self.clock()
                    if now >= next_lease:
                        if isinstance(self.clock, DbClock):
                            self.clock.sync(conn)
                            now = self.clock()
                        self.leases.tick(conn, now)
                        metrics.OWNED_PARTITIONS.labels("timer").set(len(self.leases.owned))
                        self.arm_pending_sweeps(conn, now)
                        next_lease = now + self.leases.ttl_ms // 3
                    report = self.fire_once(conn, now)
                    if report.timers + report.fenced >= self.batch or self.firing.backlog:
                        continue  # more is due: no sleep
                    if report.fenced:
                        next_lease = 0  # our view of the leases is stale
                    self._sleep(conn, listen, next_lease, stop)
            finally:
                try:
                    self.leases.release_all(conn)
                except psycopg.Error:
                    log.warning("could not release leases on the way out")

    def arm_pending_sweeps(self, conn: psycopg.Connection, now: int) -> None:
        """A sweep timer for each partition newly leased that has none
        (one statement, only when the leases changed)."""
        owned = set(self.leases.owned)
        new = owned - self._swept
        if new:
            arm_sweeps(conn, [(p, next_sweep(p, now, self.pending_sweep_ms)) for p in new])
        self._swept = owned

    def fire_once(self, conn: psycopg.Connection, now: int) -> FireReport:
        report = self.firing.fire_due(conn, self.leases, now, self.batch)
        self.wheel.drop_through(now, now + self.ahead_ms)
        for due in report.next_due_ms:
            self.wheel.add(due)
        for due in report.job_due_ms:
            self.wheel.add_job(due)
        if report.runs_created:
            self.fired_total += report.runs_created
            metrics.RUNS_FIRED.labels("job").inc(report.runs_created)
            committed = self.clock()
            for late, rank in report.lateness_ms:
                metrics.FIRING_LATENESS.labels(PRIORITIES[rank]).observe(
                    max(0, committed - now + late) / 1000
                )
        if report.missed:
            metrics.MISSED_INSTANTS.inc(report.missed)
        if report.fenced:
            metrics.FENCED_TIMERS.inc(report.fenced)
        for priority, n in report.reannounced.items():
            RUNS_REANNOUNCED.labels(priority).inc(n)
        return report

    def _sleep(self, conn, listen, next_lease: int, stop: threading.Event) -> None:
        now = self.clock()
        if self.wheel.stale(now, self.lookahead_ms):
            horizon = now + self.lookahead_ms + self.ahead_ms
            coming = self.firing.upcoming(
                conn, self.leases.owned_array(), horizon, self.wheel_limit
            )
            self.wheel.load(coming.entries, now, coming.complete_until)
        wake = min(self.wheel.next_wake() or now + self.idle_ms, next_lease, now + self.idle_ms)
        while not stop.is_set():
            remaining = wake - self.clock()
            if remaining <= 0:
                return
            # At most 250 ms per wait, so a stop request is seen promptly.
            for note in listen.notifies(timeout=min(remaining, 250) / 1000, stop_after=1):
                try:
                    due = int(note.payload)
                except ValueError:
                    due = self.clock()
                # The payload does not say the kind: wake for a job timer (its
                # lead before) and for any other (when due).
                self.wheel.add(due)
                if self.ahead_ms:
                    self.wheel.add_job(due)
                wake = min(wake, due - self.wheel.lead_ms)
