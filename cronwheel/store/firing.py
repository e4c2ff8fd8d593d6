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
from cronwheel.core import events
from cronwheel.core.clock import to_dt, to_ms
from cronwheel.core.events import OutboxRow
from cronwheel.core.firing import plan_fire
from cronwheel.core.ids import run_id_for_instant
from cronwheel.core.jobs import Catchup
from cronwheel.core.runs import PRIORITY_RANK
from cronwheel.core.schedule import parse_schedule
from cronwheel.kafka import Topics
from cronwheel.store import outbox
from cronwheel.store.leases import Leases
from cronwheel.store.quotas import Buckets, fair_shares
from cronwheel.store.sql_loader import queries

Q = queries("firing")


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
    next_due_ms: list[int] = field(default_factory=list)  # where moved timers are due next
    held: int = 0  # due job timers a tenant's fire quota held back (they stay due)
    lanes: int = 0  # lanes served round-robin; 0: no backlog, claimed in due order


@dataclass(frozen=True)
class Upcoming:
    """What the timing wheel may rely on: every due time up to `complete_until`."""

    due_ms: list[int]
    complete_until: int


Handler = Callable[[psycopg.Connection, list[Timer], int, FireReport], list[OutboxRow]]


def job_timer_id(job_id: str) -> str:
    return f"job:{job_id}"


class ScheduleCache:
    """Parsed schedules by (job, version): parsing a cron per firing is waste."""

    def __init__(self, size: int = 200_000):
        self.size = size
        self._items: dict[tuple[str, int], object] = {}

    def get(self, job_id: str, version: int, spec: dict, anchor_ms: int):
        key = (job_id, version)
        sched = self._items.get(key)
        if sched is None:
            if len(self._items) >= self.size:
                self._items.clear()
            sched = self._items[key] = parse_schedule(spec, anchor_ms=anchor_ms)
        return sched


def run_spec(job: dict) -> dict:
    """The snapshot a run keeps of what to execute."""
    return {
        "target": job["target"],
        "payload": job["payload"],
        "retry": job["retry"],
        "timeout_ms": job["timeout_ms"],
        "lease_ms": job["lease_ms"],
    }


def insert_runs(
    conn: psycopg.Connection, topics: Topics, runs: list[dict], now: int
) -> list[OutboxRow]:
    """Insert runs (ON CONFLICT DO NOTHING) and return the RunReady rows for the
    ones that are new. Each dict: partition_id, run_id, tenant_id, job_id,
    scheduled_ms, covers, priority, spec."""
    if not runs:
        return []
    inserted = {
        r[0]
        for r in conn.execute(
            Q["insert_runs"],
            {
                "now": to_dt(now),
                "p": [r["partition_id"] for r in runs],
                "id": [r["run_id"] for r in runs],
                "t": [r["tenant_id"] for r in runs],
                "j": [r["job_id"] for r in runs],
                "s": [to_dt(r["scheduled_ms"]) for r in runs],
                "c": [json.dumps(list(r["covers"])) if r.get("covers") else None for r in runs],
                "pr": [r["priority"] for r in runs],
                "sp": [json.dumps(r["spec"]) for r in runs],
            },
        )
    }
    rows = []
    for r in runs:
        if r["run_id"] not in inserted:
            continue
        value = events.run_ready(
            run_id=r["run_id"],
            tenant_id=r["tenant_id"],
            partition_id=r["partition_id"],
            attempt=1,
            scheduled_ms=r["scheduled_ms"],
            created_ms=now,
            priority=r["priority"],
            target=r["spec"]["target"],
            payload=r["spec"]["payload"],
            job_id=r["job_id"],
            covers=r.get("covers"),
        )
        rows.append(
            outbox.RankedRow(
                r["partition_id"],
                topics.runs(r["tenant_id"]),
                r["run_id"].encode(),
                value,
                priority=PRIORITY_RANK.get(r["priority"], outbox.NORMAL),
            )
        )
    return rows


class JobTimers:
    """The handler of `job` timers: a job's next scheduled instant."""

    def __init__(self, topics: Topics, cache: ScheduleCache | None = None):
        self.topics = topics
        self.cache = cache or ScheduleCache()

    def __call__(
        self, conn: psycopg.Connection, timers: list[Timer], now: int, report: FireReport
    ) -> list[OutboxRow]:
        jobs = conn.execute(
            Q["jobs_for_timers"],
            {
                "partitions": [t.partition_id for t in timers],
                "job_ids": [t.owner_id for t in timers],
            },
        ).fetchall()
        cols = [
            "partition_id", "job_id", "tenant_id", "schedule", "target", "payload", "priority",
            "retry", "timeout_ms", "lease_ms", "overlap", "catchup", "jitter_ms", "anchor_at",
            "last_instant", "version", "has_active",
        ]  # fmt: skip
        by_id = {row[1]: dict(zip(cols, row, strict=True)) for row in jobs}
        new_runs: list[dict] = []
        adv: dict[str, list] = {k: [] for k in ("p", "id", "li", "m", "f", "o", "b")}
        resched: dict[str, list] = {"p": [], "id": [], "d": []}
        gone: dict[str, list] = {"p": [], "id": []}
        for t in timers:
            job = by_id.get(t.owner_id)
            if job is None:  # deleted or paused since the timer was written
                gone["p"].append(t.partition_id)
                gone["id"].append(t.timer_id)
                continue
            sched = self.cache.get(
                job["job_id"], job["version"], job["schedule"], to_ms(job["anchor_at"])
            )
            plan = plan_fire(
                sched,
                job_id=job["job_id"],
                last_instant_ms=to_ms(job["last_instant"]),
                now_ms=now,
                catchup=Catchup(**job["catchup"]),
                jitter_ms=job["jitter_ms"],
                overlap=job["overlap"],
                has_active_run=job["has_active"],
            )
            spec = run_spec(job)
            for pr in plan.runs:
                new_runs.append(
                    {
                        "partition_id": job["partition_id"],
                        "run_id": run_id_for_instant(job["job_id"], pr.instant_ms),
                        "tenant_id": job["tenant_id"],
                        "job_id": job["job_id"],
                        "scheduled_ms": pr.instant_ms,
                        "covers": pr.covers,
                        "priority": job["priority"],
                        "spec": spec,
                    }
                )
                report.lateness_ms.append(now - t.due_ms)
            report.missed += plan.missed
            for k, v in (
                ("p", job["partition_id"]),
                ("id", job["job_id"]),
                ("li", to_dt(plan.last_instant_ms)),
                ("m", plan.missed),
                ("f", len(plan.runs)),
                ("o", plan.overlap_skipped),
                ("b", None if plan.buffered_ms is None else to_dt(plan.buffered_ms)),
            ):
                adv[k].append(v)
            if plan.next_due_ms is None:
                gone["p"].append(t.partition_id)
                gone["id"].append(t.timer_id)
            else:
                resched["p"].append(t.partition_id)
                resched["id"].append(t.timer_id)
                resched["d"].append(to_dt(plan.next_due_ms))
                report.next_due_ms.append(plan.next_due_ms)
        rows = insert_runs(conn, self.topics, new_runs, now)
        report.runs_created += len(rows)
        if adv["id"]:
            conn.execute(Q["advance_jobs"], adv)
        if resched["id"]:
            conn.execute(Q["reschedule_timers"], resched)
        if gone["id"]:
            conn.execute(Q["delete_timers"], gone)
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
    ):
        self.topics = topics
        self.handlers: dict[str, Handler] = {"job": JobTimers(topics)}
        self.handlers.update(handlers or {})
        self.quotas = quotas or Buckets("fire")
        self.rounds = rounds
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
        partitions = list(leases.owned)
        with conn.transaction():
            # Deterministic run ids make a firing lost in a database crash safe to
            # repeat (the same runs, the same records), so the commit need not
            # wait for the WAL flush: it is the firing path's largest fixed cost.
            conn.execute(Q["relaxed_commit"])
            self._claimed_at = now
            self._wake = [w for w in self._wake if w > now]
            if self._backlog:
                # The last pass left a backlog: claim by lanes straight away
                # rather than lock a due-order batch first and leave it unused.
                timers, self._backlog = self._claim_fair(conn, partitions, now, limit, report)
            else:
                rows = conn.execute(
                    Q["claim_due"],
                    {"now": to_dt(now), "partitions": partitions, "limit": limit},
                ).fetchall()
                if not rows:
                    self._note_wake(report)
                    return report
                if len(rows) < limit:
                    timers, _ = self._within_quota(conn, [_timer(r) for r in rows], now, report)
                else:
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
        self, conn: psycopg.Connection, partitions: list[int], now: int, limit: int, report
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
                Q["due_lanes"], {"now": to_dt(now), "partitions": partitions}
            ).fetchall()
        ]
        report.lanes = len(lanes)
        metrics.FAIR_LANES.labels("timer").set(len(lanes))
        self._turn += 1
        claimed: list[Timer] = []
        room = limit
        for _ in range(self.rounds):
            quota = fair_shares(lanes, room, self._turn)
            if not quota:
                break
            rows = conn.execute(
                Q["claim_lanes"],
                {
                    "now": to_dt(now),
                    "partitions": partitions,
                    "prio": [lane[0] for lane in quota],
                    "tenant": [lane[1] for lane in quota],
                    "quota": list(quota.values()),
                    "taken": [t.timer_id for t in claimed],
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

    def _note_wake(self, report: FireReport) -> None:
        metrics.QUOTA_HELD.labels("fire").set(report.held)
        if self._wake:
            report.next_due_ms.append(min(self._wake))

    def upcoming(
        self, conn: psycopg.Connection, partitions: list[int], horizon: int, limit: int = 2048
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
        per_class: dict[int, list[int]] = {}
        for prio, due_at in rows:
            per_class.setdefault(prio, []).append(to_ms(due_at))
        complete_until = horizon
        for dues in per_class.values():
            if len(dues) >= limit:
                complete_until = min(complete_until, max(dues))
        due = sorted(d for dues in per_class.values() for d in dues if d <= complete_until)
        wake = [w for w in self._wake if w <= complete_until]
        return Upcoming(sorted(due + wake), complete_until)
