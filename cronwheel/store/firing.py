"""The firing transaction: claim due timers of owned partitions and hand each kind
to its handler, all in one transaction with the outbox rows they announce.

Features add timer kinds (a retry's backoff, a lease's expiry, a workflow's next
instant) by registering a handler; the loop itself never changes.
"""

from __future__ import annotations

from dataclasses import dataclass

import psycopg

from cronwheel import metrics
from cronwheel.core.clock import to_dt
from cronwheel.core.events import OutboxRow
from cronwheel.core.runs import PRIORITY_RANK
from cronwheel.kafka import Topics
from cronwheel.store import outbox, pgarrays, timer_kinds, timers
from cronwheel.store.leases import Leases

# Where these were before timers.py and new_runs.py: services/timer and the
# benches import them from here.
from cronwheel.store.new_runs import insert_runs as insert_runs
from cronwheel.store.new_runs import run_spec as run_spec
from cronwheel.store.new_runs import run_spec_text as run_spec_text
from cronwheel.store.quotas import Buckets, fair_shares
from cronwheel.store.sql_loader import queries
from cronwheel.store.timers import FireReport as FireReport
from cronwheel.store.timers import Handler as Handler
from cronwheel.store.timers import ScheduleCache as ScheduleCache
from cronwheel.store.timers import Timer as Timer
from cronwheel.store.timers import job_timer_id as job_timer_id

Q = queries("firing")
CRITICAL = PRIORITY_RANK["critical"]


@dataclass(frozen=True)
class Upcoming:
    """What the timing wheel may rely on: every time it must wake at up to
    `complete_until`, with whether it is a job timer's (woken wake_lead before
    it is due, and not at all once a claim ahead took it)."""

    entries: list[tuple[int, bool]]  # (wake time, a job timer's), by time
    complete_until: int

    @property
    def due_ms(self) -> list[int]:
        return [w for w, _job in self.entries]


def wake_lead(ahead_ms: int) -> int:
    """How long before a job timer is due the wheel wakes for it: three
    quarters of the firing's lead. A pass claims every job timer due within the
    whole lead, so the next one not taken is due over a quarter lead on: passes
    come at most every quarter lead, each with that much of the schedule (a
    sliding horizon woken per timer would still fire one run per pass), and an
    instant with many jobs starts being fired three quarters of a lead early."""
    return ahead_ms - ahead_ms // 4


class Firing:
    """Claims due timers and runs their handlers, one transaction per batch.

    Order under a backlog (docs/priority.md): classes first (critical, high,
    normal, low), then within a class every tenant (lane) the same share of the
    batch, so a tenant with 100k due timers cannot hold back one with 10. With
    fewer due than a batch, one scan in due order claims them all and fairness
    has nothing to decide. Job timers of a tenant whose fire bucket is empty
    stay due; the report says when the bucket refills so the wheel wakes then.
    """

    def __init__(
        self,
        topics: Topics,
        handlers: dict[str, Handler] | None = None,
        *,
        quotas: Buckets | None = None,
        rounds: int = 4,
        critical_batch: int | None = None,
        ahead_ms: int = 0,
    ):
        self.topics = topics
        # Job timers are claimed up to ahead_ms before they are due (their runs
        # published at the instant by the relay); every other kind when due.
        self.ahead_ms = ahead_ms
        # Every kind's handler (timer_kinds), and the caller's in place of any.
        self.handlers: dict[str, Handler] = timer_kinds.handlers(topics, ahead_ms=ahead_ms)
        self.handlers.update(handlers or {})
        self.quotas = quotas or Buckets("fire")
        self.rounds = rounds
        # Critical first (docs/priority.md): when set, a batch that takes
        # critical timers takes nothing of a lower class, and a backlog that a
        # critical timer leads starts with a batch of at most this many, so the
        # first critical runs commit (and reach the relay) while the next
        # batch is being made. None: classes share batches (the default here;
        # the timer service sets it).
        self.critical_batch = critical_batch
        self._turn = 0  # rotates which lanes get a batch's remainder
        self._claimed_at = 0  # `now` of the last claim: upcoming() looks after it
        self._wake: list[int] = []  # quota refills and unfinished backlogs to wake for
        self._backlog = False  # the last pass left lanes open: claim by lanes first

    def fire_due(
        self, conn: psycopg.Connection, leases: Leases, now: int, limit: int = 500
    ) -> FireReport:
        """One batch: claim up to `limit` due timers and act on them in one transaction."""
        report = FireReport()
        if not leases.owned:
            return report
        partitions = leases.owned_array()  # one binary array for every query of the pass
        with conn.transaction():
            # Deterministic run ids make a firing lost in a database crash safe to
            # repeat (the same runs, the same records), so the commit need not
            # wait for the WAL flush: it is the firing path's largest fixed cost.
            conn.execute(Q["firing_settings"])
            self._claimed_at = now
            self._wake = [w for w in self._wake if w > now]
            if self._backlog:
                # The last pass left a backlog: claim by lanes straight away
                # rather than lock a due-order batch first and leave it unused.
                due, self._backlog = self._claim_fair(conn, partitions, now, limit, report)
            else:
                claimed = timers.claim_due(conn, self._due_by(now), partitions, limit)
                if not claimed:
                    self._note_wake(report)
                    return report
                if len(claimed) < limit:
                    due, _ = self._within_quota(conn, claimed.timers(), now, report)
                else:
                    if self.critical_batch and claimed.first_class == CRITICAL:
                        limit = min(limit, self.critical_batch)
                    due, self._backlog = self._claim_fair(conn, partitions, now, limit, report)
            if not due:
                self._note_wake(report)
                return report
            mine = leases.verify_and_lock(conn, {t.partition_id for t in due})
            report.fenced = sum(1 for t in due if t.partition_id not in mine)
            due = [t for t in due if t.partition_id in mine]
            report.timers = len(due)
            by_kind: dict[str, list[Timer]] = {}
            for t in due:
                by_kind.setdefault(t.kind, []).append(t)
            out: list[OutboxRow] = []
            for kind, group in by_kind.items():
                handler = self.handlers.get(kind)
                if handler is None:
                    raise RuntimeError(f"no handler for timer kind {kind!r}")
                out.extend(handler(conn, group, now, report))
            outbox.append(conn, out)
        self._note_wake(report)
        return report

    def _claim_fair(
        self, conn: psycopg.Connection, partitions, now: int, limit: int, report
    ) -> tuple[list[Timer], bool]:
        """A backlog: claim by lanes in up to `rounds` rounds. Each round shares
        the room left between the open lanes of the highest class with any
        (fair_shares); a lane that returns less than its share is drained, one
        whose tenant's bucket ran dry is closed, the others stay open for the
        next round. What the (already locked) due-order claim took and the
        lanes did not is simply not acted on. Returns the timers and whether
        lanes are left open (more is due than this batch took)."""
        lanes = timers.due_lanes(conn, self._due_by(now), partitions)
        report.lanes = len(lanes)
        metrics.FAIR_LANES.labels("timer").set(len(lanes))
        self._turn += 1
        claimed: list[Timer] = []
        first_class = None
        room = limit
        for _ in range(self.rounds):
            quota = fair_shares(lanes, room, self._turn)
            if not quota:
                break
            top = next(iter(quota))[0]  # each round serves one class
            first_class = top if first_class is None else first_class
            if self.critical_batch and first_class == CRITICAL and top != CRITICAL:
                break  # the critical runs commit now, without a lower class's work
            got = timers.claim_lanes(conn, self._due_by(now), partitions, quota, claimed)
            room -= len(got)
            counts: dict[tuple[int, str], int] = {}
            for t in got:
                counts[(t.priority, t.tenant_id)] = counts.get((t.priority, t.tenant_id), 0) + 1
            kept, throttled = self._within_quota(conn, got, now, report)
            claimed.extend(kept)
            # Open for the next round: not drained, and not out of tokens.
            lanes = [
                lane
                for lane in lanes
                if (lane not in quota or counts.get(lane, 0) >= quota[lane])
                and lane[1] not in throttled
            ]
            if room <= 0:
                break
        if lanes:
            # More is due than this batch took: wake again at once.
            self._wake.append(now)
        return claimed, bool(lanes)

    @property
    def backlog(self) -> bool:
        """The last pass left due timers it had no room for."""
        return self._backlog

    def _within_quota(
        self, conn: psycopg.Connection, timers: list[Timer], now: int, report: FireReport
    ) -> tuple[list[Timer], set[str]]:
        """Drop job timers beyond what their tenants' fire buckets grant (higher
        classes first); they stay due, and the refill instant is noted. Returns
        the timers to act on and the tenants held back."""
        limited = self.quotas.limited(conn, now)
        if not limited:
            return timers, set()
        wants: dict[str, int] = {}
        for t in timers:
            if t.kind == "job" and t.tenant_id in limited:
                wants[t.tenant_id] = wants.get(t.tenant_id, 0) + 1
        if not wants:
            return timers, set()
        grants = self.quotas.take(conn, wants, now)
        left = {tenant: g.granted for tenant, g in grants.items()}
        kept = []
        for t in sorted(timers, key=lambda t: (t.priority, t.due_ms)):
            if t.kind == "job" and t.tenant_id in left:
                if left[t.tenant_id] <= 0:
                    report.held += 1
                    continue
                left[t.tenant_id] -= 1
            kept.append(t)
        held = set()
        for tenant, g in grants.items():
            if g.resume_ms is not None:
                held.add(tenant)
                self._wake.append(g.resume_ms)
                metrics.QUOTA_THROTTLED.labels("fire").inc()
        return kept, held

    def _due_by(self, now: int) -> dict:
        """The claim's bounds: every kind due by `now`, job timers by `ahead`."""
        return {"now": to_dt(now), "ahead": to_dt(now + self.ahead_ms)}

    def _note_wake(self, report: FireReport) -> None:
        metrics.QUOTA_HELD.labels("fire").set(report.held)
        if self._wake:
            report.next_due_ms.append(min(self._wake))

    def upcoming(
        self,
        conn: psycopg.Connection,
        partitions: list[int] | pgarrays.PackedArray,
        horizon: int,
        limit: int = 2048,
    ) -> Upcoming:
        """Due times after the last claim up to `horizon`, and the instants the
        last passes asked to be woken at (a quota refill, a backlog left).

        At most `limit` per class: when a class fills its limit, the answer is
        complete only up to that class's last due time, and `complete_until`
        says so; the wheel must look again by then rather than sleep past
        timers it was never told of."""
        per_class: dict[int, list[tuple[int, bool]]] = {}
        for prio, due, is_job in timers.upcoming(
            conn, partitions, self._claimed_at, horizon, limit
        ):
            per_class.setdefault(prio, []).append((due, is_job))
        complete_until = horizon
        for dues in per_class.values():
            if len(dues) >= limit:
                complete_until = min(complete_until, max(d for d, _j in dues))
        # Wake times: a job timer's wake_lead before it is due.
        lead = wake_lead(self.ahead_ms)
        due = [
            (d - lead if is_job else d, is_job)
            for dues in per_class.values()
            for d, is_job in dues
            if d <= complete_until
        ]
        wake = [(w, False) for w in self._wake if w <= complete_until]
        return Upcoming(sorted(due + wake), complete_until - lead)
