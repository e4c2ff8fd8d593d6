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

from cronwheel.core import events
from cronwheel.core.clock import to_dt, to_ms
from cronwheel.core.events import OutboxRow
from cronwheel.core.firing import plan_fire
from cronwheel.core.ids import run_id_for_instant
from cronwheel.core.jobs import Catchup
from cronwheel.core.schedule import parse_schedule
from cronwheel.kafka import Topics
from cronwheel.store import outbox
from cronwheel.store.leases import Leases
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


@dataclass
class FireReport:
    timers: int = 0
    runs_created: int = 0
    missed: int = 0
    lateness_ms: list[int] = field(default_factory=list)  # per created run: now - due
    fenced: int = 0  # timers left alone: their partition is no longer ours
    next_due_ms: list[int] = field(default_factory=list)  # where moved timers are due next


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
            OutboxRow(r["partition_id"], topics.runs(r["tenant_id"]), r["run_id"].encode(), value)
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


class Firing:
    def __init__(self, topics: Topics, handlers: dict[str, Handler] | None = None):
        self.topics = topics
        self.handlers: dict[str, Handler] = {"job": JobTimers(topics)}
        self.handlers.update(handlers or {})

    def fire_due(
        self, conn: psycopg.Connection, leases: Leases, now: int, limit: int = 500
    ) -> FireReport:
        """One batch: claim up to `limit` due timers and act on them in one transaction."""
        report = FireReport()
        if not leases.owned:
            return report
        with conn.transaction():
            # Deterministic run ids make a firing lost in a database crash safe to
            # repeat (the same runs, the same records), so the commit need not
            # wait for the WAL flush: it is the firing path's largest fixed cost.
            conn.execute(Q["relaxed_commit"])
            rows = conn.execute(
                Q["claim_due"],
                {"now": to_dt(now), "partitions": list(leases.owned), "limit": limit},
            ).fetchall()
            if not rows:
                return report
            timers = [Timer(r[0], r[1], r[2], r[3], to_ms(r[4]), r[5]) for r in rows]
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
        return report

    def upcoming(
        self, conn: psycopg.Connection, partitions: list[int], horizon: int, limit: int = 256
    ) -> list[int]:
        rows = conn.execute(
            Q["upcoming"], {"partitions": partitions, "horizon": to_dt(horizon), "limit": limit}
        ).fetchall()
        return sorted(to_ms(r[0]) for r in rows)
