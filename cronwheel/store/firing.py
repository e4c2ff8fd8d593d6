"""The firing transaction: claim due timers of owned partitions and hand each kind
to its handler, all in one transaction with the outbox rows they announce.

Features add timer kinds (a retry's backoff, a lease's expiry, a workflow's next
instant) by registering a handler; the loop itself never changes.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field

import psycopg

from cronwheel import metrics
from cronwheel.core.clock import to_dt, to_ms
from cronwheel.core.events import OutboxRow
from cronwheel.core.firing import due_at, plan_fire
from cronwheel.core.ids import run_id_for_instant
from cronwheel.core.jobs import Catchup
from cronwheel.core.runs import PRIORITY_RANK
from cronwheel.core.schedule import parse_schedule
from cronwheel.kafka import Topics
from cronwheel.store import outbox, pgarrays
from cronwheel.store.leases import Leases
from cronwheel.store.new_runs import NewRuns, insert_runs, run_spec_text
from cronwheel.store.new_runs import run_spec as run_spec  # where it was
from cronwheel.store.quotas import Buckets, fair_shares
from cronwheel.store.sql_loader import queries

Q = queries("firing")
CRITICAL = PRIORITY_RANK["critical"]


@dataclass(frozen=True)
class Timer:
    partition_id: int
    timer_id: str
    kind: str
    owner_id: str
    due_ms: int
    attempt: int | None
    tenant_id: str = ""
    priority: int = 2  # 0 critical .. 3 low


@dataclass
class FireReport:
    timers: int = 0
    runs_created: int = 0
    missed: int = 0
    lateness_ms: list[int] = field(default_factory=list)  # per created run: now - due
    fenced: int = 0  # timers left alone: their partition is no longer ours
    next_due_ms: list[int] = field(default_factory=list)  # when to wake: a quota refill, a backlog
    job_due_ms: list[int] = field(default_factory=list)  # where moved job timers are due next
    held: int = 0  # due job timers a tenant's fire quota held back (they stay due)
    lanes: int = 0  # lanes served round-robin; 0: no backlog, claimed in due order


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


Handler = Callable[[psycopg.Connection, list[Timer], int, FireReport], list[OutboxRow]]


def wake_lead(ahead_ms: int) -> int:
    """How long before a job timer is due the wheel wakes for it: three
    quarters of the firing's lead. A pass claims every job timer due within the
    whole lead, so the next one not taken is due over a quarter lead on: passes
    come at most every quarter lead, each with that much of the schedule (a
    sliding horizon woken per timer would still fire one run per pass), and an
    instant with many jobs starts being fired three quarters of a lead early."""
    return ahead_ms - ahead_ms // 4


def job_timer_id(job_id: str) -> str:
    return f"job:{job_id}"


class ScheduleCache:
    """Parsed schedules: parsing a cron (or an RFC 3339 instant) per firing is
    waste. By (owner, version), or by the schedule's JSON text and anchor
    (by_text): a schedule is a function of those alone, so a herd of jobs
    with one schedule parses it once."""

    def __init__(self, size: int = 200_000):
        self.size = size
        self._items: dict[tuple, object] = {}

    def get(self, job_id: str, version: int, spec: dict, anchor_ms: int):
        key = (job_id, version)
        sched = self._items.get(key)
        if sched is None:
            if len(self._items) >= self.size:
                self._items.clear()
            sched = self._items[key] = parse_schedule(spec, anchor_ms=anchor_ms)
        return sched

    def by_text(self, text: str, anchor_ms: int):
        key = (text, anchor_ms)
        sched = self._items.get(key)
        if sched is None:
            if len(self._items) >= self.size:
                self._items.clear()
            sched = self._items[key] = parse_schedule(json.loads(text), anchor_ms=anchor_ms)
        return sched


class JobTimers:
    """The handler of `job` timers: a job's next scheduled instant."""

    def __init__(self, topics: Topics, cache: ScheduleCache | None = None, *, ahead_ms: int = 0):
        self.topics = topics
        self.cache = cache or ScheduleCache()
        self._catchups: dict[str, Catchup] = {}
        # Firing ahead: instants due within this of `now` are fired now, their
        # RunReady held by the relay until due (docs/architecture.md).
        self.ahead_ms = ahead_ms

    def _catchup(self, text: str) -> Catchup:
        got = self._catchups.get(text)
        if got is None:
            if len(self._catchups) >= 10_000:
                self._catchups.clear()
            got = self._catchups[text] = Catchup(**json.loads(text))
        return got

    def __call__(
        self, conn: psycopg.Connection, timers: list[Timer], now: int, report: FireReport
    ) -> list[OutboxRow]:
        jobs = conn.execute(
            Q["jobs_for_timers"],
            {
                "partitions": pgarrays.int2_array([t.partition_id for t in timers]),
                "job_ids": pgarrays.text_array([t.owner_id for t in timers]),
            },
        ).fetchall()
        by_id = {row[1]: row for row in jobs}
        new_runs = NewRuns()
        horizon = now + self.ahead_ms
        adv: dict[str, list] = {k: [] for k in ("p", "id", "li", "m", "f", "o", "b")}
        resched: dict[str, list] = {"p": [], "id": [], "d": []}
        gone: dict[str, list] = {"p": [], "id": []}
        for t in timers:
            job = by_id.get(t.owner_id)
            if job is None:  # deleted or paused since the timer was written
                gone["p"].append(t.partition_id)
                gone["id"].append(t.timer_id)
                continue
            (
                partition_id, job_id, tenant_id, schedule, target, payload, priority, retry,
                timeout_ms, lease_ms, overlap, catchup, jitter_ms, anchor_ms, last_ms, _version,
                has_active, target_type, queue,
            ) = job  # fmt: skip
            plan = plan_fire(
                self.cache.by_text(schedule, anchor_ms),
                job_id=job_id,
                last_instant_ms=last_ms,
                now_ms=now,
                due_by_ms=horizon,
                catchup=self._catchup(catchup),
                jitter_ms=jitter_ms,
                overlap=overlap,
                has_active_run=has_active,
            )
            if plan.runs:
                spec = run_spec_text(target, payload, retry, timeout_ms, lease_ms)
                for pr in plan.runs:
                    # Fired ahead of its due time: the relay holds it until then.
                    due = due_at(job_id, pr.instant_ms, jitter_ms) if self.ahead_ms else now
                    new_runs.add(
                        partition_id, run_id_for_instant(job_id, pr.instant_ms), tenant_id,
                        job_id, pr.instant_ms, pr.covers, priority, spec, target_type, queue,
                        payload, not_before_ms=due if due > now else None,
                    )  # fmt: skip
                    report.lateness_ms.append(now - t.due_ms)
            report.missed += plan.missed
            adv["p"].append(partition_id)
            adv["id"].append(job_id)
            adv["li"].append(plan.last_instant_ms)
            adv["m"].append(plan.missed)
            adv["f"].append(len(plan.runs))
            adv["o"].append(plan.overlap_skipped)
            adv["b"].append(plan.buffered_ms)
            if plan.next_due_ms is None:
                gone["p"].append(t.partition_id)
                gone["id"].append(t.timer_id)
            else:
                resched["p"].append(t.partition_id)
                resched["id"].append(t.timer_id)
                resched["d"].append(plan.next_due_ms)
                report.job_due_ms.append(plan.next_due_ms)
        rows = insert_runs(conn, self.topics, new_runs, now)
        report.runs_created += len(rows)
        if adv["id"]:
            conn.execute(
                Q["advance_jobs"],
                {
                    "p": pgarrays.int2_array(adv["p"]),
                    "id": pgarrays.text_array(adv["id"]),
                    "li": pgarrays.timestamptz_array(adv["li"]),
                    "m": pgarrays.int8_array(adv["m"]),
                    "f": pgarrays.int8_array(adv["f"]),
                    "o": pgarrays.int8_array(adv["o"]),
                    "b": pgarrays.timestamptz_array(adv["b"]),
                },
            )
        if resched["id"]:
            conn.execute(
                Q["reschedule_timers"],
                {
                    "p": pgarrays.int2_array(resched["p"]),
                    "id": pgarrays.text_array(resched["id"]),
                    "d": pgarrays.timestamptz_array(resched["d"]),
                },
            )
        if gone["id"]:
            conn.execute(
                Q["delete_timers"],
                {"p": pgarrays.int2_array(gone["p"]), "id": pgarrays.text_array(gone["id"])},
            )
        return rows


def _timer(r: tuple) -> Timer:
    return Timer(r[0], r[1], r[2], r[3], to_ms(r[4]), r[5], r[6], r[7])


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
        self.handlers: dict[str, Handler] = {"job": JobTimers(topics, ahead_ms=ahead_ms)}
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
                timers, self._backlog = self._claim_fair(conn, partitions, now, limit, report)
            else:
                rows = conn.execute(
                    Q["claim_due"],
                    {**self._due_by(now), "partitions": partitions, "limit": limit},
                ).fetchall()
                if not rows:
                    self._note_wake(report)
                    return report
                if len(rows) < limit:
                    timers, _ = self._within_quota(conn, [_timer(r) for r in rows], now, report)
                else:
                    if self.critical_batch and rows[0][7] == CRITICAL:
                        limit = min(limit, self.critical_batch)
                    timers, self._backlog = self._claim_fair(conn, partitions, now, limit, report)
            if not timers:
                self._note_wake(report)
                return report
            mine = leases.verify_and_lock(conn, {t.partition_id for t in timers})
            report.fenced = sum(1 for t in timers if t.partition_id not in mine)
            timers = [t for t in timers if t.partition_id in mine]
            report.timers = len(timers)
            by_kind: dict[str, list[Timer]] = {}
            for t in timers:
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
        lanes = [
            (r[0], r[1])
            for r in conn.execute(
                Q["due_lanes"], {**self._due_by(now), "partitions": partitions}
            ).fetchall()
        ]
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
            rows = conn.execute(
                Q["claim_lanes"],
                {
                    **self._due_by(now),
                    "partitions": partitions,
                    "prio": pgarrays.int2_array([lane[0] for lane in quota]),
                    "tenant": pgarrays.text_array([lane[1] for lane in quota]),
                    "quota": list(quota.values()),
                    "taken": pgarrays.text_array([t.timer_id for t in claimed]),
                },
            ).fetchall()
            got = [_timer(r) for r in rows]
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
        rows = conn.execute(
            Q["upcoming"],
            {
                "partitions": partitions,
                "after": to_dt(self._claimed_at),
                "horizon": to_dt(horizon),
                "limit": limit,
            },
        ).fetchall()
        per_class: dict[int, list[tuple[int, bool]]] = {}
        for prio, due, is_job in rows:
            per_class.setdefault(prio, []).append((to_ms(due), is_job))
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
