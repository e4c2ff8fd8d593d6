"""Tenant and job operations: the one place that writes jobs, and the `job`
timer kind (JobTimers: a job's next instants, fired by the firing loop).

Each operation is one transaction in one partition (the job's), so a job, its
timer and the runs it creates change together or not at all.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from cronwheel.core.clock import iso, now_ms, to_dt, to_ms
from cronwheel.core.errors import Conflict, NotFound, ValidationError
from cronwheel.core.events import OutboxRow
from cronwheel.core.firing import due_at, next_due, plan_fire
from cronwheel.core.ids import new_id, partition_of, run_id_for_instant, run_id_for_trigger
from cronwheel.core.jobs import Catchup, JobSpec, parse_job
from cronwheel.core.runs import PRIORITIES
from cronwheel.core.schedule import parse_schedule
from cronwheel.kafka import Topics
from cronwheel.store import outbox, pgarrays, timers, webhooks
from cronwheel.store.lifecycle import Lifecycle
from cronwheel.store.new_runs import NewRuns, insert_runs, run_spec, run_spec_text
from cronwheel.store.sql_loader import queries

Q = queries("jobs")
MAX_BACKFILL = 1000
DEFAULT_CLASSES = ("high", "normal", "low")
# What refuses one job of a batch without refusing the others: bad input
# (OverflowError: an instant or interval beyond what a calendar holds).
REFUSALS = (ValidationError, Conflict, NotFound, OverflowError)


def hash_key(secret: str) -> bytes:
    return hashlib.sha256(secret.encode()).digest()


def new_api_key(tenant_id: str | None = None) -> tuple[str, str]:
    """(key_id, secret): 32 random bytes; only the hash is stored. The secret
    names its tenant (`cw_<tenant_id>.<random>`), so a router finds the
    tenant's cell from the key alone (docs/cells.md, "Routing"); the random
    part is what makes it a secret."""
    prefix = f"cw_{tenant_id}." if tenant_id else "cw_"
    return new_id("key"), prefix + secrets.token_urlsafe(32)


def create_tenant(
    conn: psycopg.Connection,
    name: str,
    cell: str = "local",
    priority_classes: list[str] | None = None,
) -> dict:
    if priority_classes is not None and not isinstance(priority_classes, list):
        raise ValidationError("priority_classes", "must be a list of class names")
    classes = list(priority_classes or DEFAULT_CLASSES)
    bad = [c for c in classes if c not in PRIORITIES]
    if bad:
        raise ValidationError("priority_classes", f"unknown class {bad[0]!r}")
    if not isinstance(name, str) or not 1 <= len(name) <= 200:
        raise ValidationError("name", "must be a string of 1-200 characters")
    tenant_id = new_id("ten")
    key_id, secret = new_api_key(tenant_id)
    with conn.transaction():
        try:
            row = conn.execute(
                Q["insert_tenant"],
                {"tenant_id": tenant_id, "name": name, "cell": cell, "classes": classes},
            ).fetchone()
        except psycopg.errors.UniqueViolation as e:
            raise Conflict("TENANT_EXISTS", f"a tenant named {name!r} exists") from e
        conn.execute(
            Q["insert_api_key"],
            {"key_id": key_id, "tenant_id": tenant_id, "hash": hash_key(secret)},
        )
    return {
        "tenant_id": row[0],
        "name": row[1],
        "cell": row[2],
        "priority_classes": row[3],
        "api_key": secret,
    }


def tenant_for_key(conn: psycopg.Connection, secret: str) -> dict | None:
    row = conn.execute(Q["tenant_by_key"], {"hash": hash_key(secret)}).fetchone()
    if not row:
        return None
    return {"tenant_id": row[0], "name": row[1], "cell": row[2], "priority_classes": row[3]}


def _set_timer(conn, job_id: str, partition: int, due_ms: int | None, priority: str) -> None:
    timers.set_timer(conn, "job", job_id, partition, due_ms, priority)


def _spec_columns(spec: JobSpec) -> dict:
    return {
        "name": spec.name,
        "schedule": Jsonb(spec.schedule),
        "target": Jsonb(spec.target),
        "payload": spec.payload,
        "priority": spec.priority,
        "retry": Jsonb(asdict(spec.retry)),
        "timeout_ms": spec.timeout_ms,
        "lease_ms": spec.lease_ms,
        "overlap": spec.overlap,
        "catchup": Jsonb(asdict(spec.catchup)),
        "jitter_ms": spec.jitter_ms,
    }


class Jobs:
    def __init__(self, topics: Topics, kafka_bootstrap: str | None = None):
        self.topics = topics
        # The broker a queue job's workers consume its `topic` from (this
        # cell's), shown beside it; None: not shown.
        self.kafka_bootstrap = kafka_bootstrap
        self.lifecycle = Lifecycle(topics)

    # -- views -------------------------------------------------------------
    def view(self, row: dict) -> dict:
        schedule = dict(row["schedule"])
        schedule.update(jitter_ms=row["jitter_ms"], catchup=row["catchup"], overlap=row["overlap"])
        out = {
            "job_id": row["job_id"],
            "tenant_id": row["tenant_id"],
            "name": row["name"],
            "schedule": schedule,
            "target": row["target"],
            "payload": json.loads(row["payload"]),
            "priority": row["priority"],
            "retry": row["retry"],
            "timeout_ms": row["timeout_ms"],
            "lease_ms": row["lease_ms"],
            "paused": row["paused"],
            "version": row["version"],
            "next_fire_at": iso(to_ms(row["next_due_at"])) if row.get("next_due_at") else None,
            "last_instant": iso(to_ms(row["last_instant"])) if row["last_instant"] else None,
            "fired_count": row["fired_count"],
            "missed_count": row["missed_count"],
            "overlap_skipped": row["overlap_skipped"],
            "created_at": iso(to_ms(row["created_at"])),
            "updated_at": iso(to_ms(row["updated_at"])),
        }
        if row["target"]["type"] == "queue":
            out["topic"] = self.topics.queue(row["tenant_id"], row["target"]["queue"])
            if self.kafka_bootstrap is not None:
                out["kafka_bootstrap"] = self.kafka_bootstrap
        return out

    def _load(self, conn, tenant_id: str, job_id: str, lock: bool = False) -> dict:
        try:
            partition = partition_of(job_id)
        except Exception as e:  # pragma: no cover - partition_of accepts any string
            raise NotFound("job") from e
        if lock:
            conn.execute(Q["lock_job_timer"], {"partition_id": partition, "job_id": job_id})
        with conn.cursor(row_factory=dict_row) as cur:
            row = cur.execute(
                Q["lock_job" if lock else "get_job"],
                {"partition_id": partition, "job_id": job_id, "tenant_id": tenant_id},
            ).fetchone()
        if row is None:
            raise NotFound("job")
        return row

    def get(self, conn, tenant_id: str, job_id: str, now: int | None = None) -> dict:
        out = self.view(self._load(conn, tenant_id, job_id))
        if out["target"]["type"] == "webhook":
            out["signing_secret_ids"] = webhooks.secret_ids(conn, job_id, now or now_ms())
        return out

    def rotate_secret(self, conn, tenant: dict, job_id: str, now: int, overlap_ms: int) -> dict:
        """A new signing secret for a webhook job (shown once); the old ones keep
        signing for `overlap_ms`, so receivers can roll over without a gap."""
        row = self._load(conn, tenant["tenant_id"], job_id)
        if row["target"]["type"] != "webhook":
            raise Conflict("NOT_A_WEBHOOK_JOB", "only webhook jobs have signing secrets")
        return webhooks.rotate_secret(conn, tenant["tenant_id"], job_id, now, overlap_ms)

    def list(self, conn, tenant_id: str, cursor: str | None = None, limit: int = 50) -> dict:
        after_created, after_id = None, None
        if cursor:
            try:
                ms, after_id = cursor.split(".", 1)
                if not re.fullmatch(r"[A-Za-z0-9_-]{1,100}", after_id):
                    raise ValueError(after_id)
                after_created = to_dt(int(ms))
            except (ValueError, OverflowError, OSError) as e:
                raise ValidationError("cursor", "is not a cursor this API returned") from e
        with conn.cursor(row_factory=dict_row) as cur:
            rows = cur.execute(
                Q["list_jobs"],
                {
                    "tenant_id": tenant_id,
                    "after_created": after_created,
                    "after_id": after_id,
                    "limit": limit + 1,
                },
            ).fetchall()
        more = len(rows) > limit
        rows = rows[:limit]
        nxt = f"{to_ms(rows[-1]['created_at'])}.{rows[-1]['job_id']}" if more else None
        return {"items": [self.view(r) for r in rows], "next_cursor": nxt}

    # -- changes -----------------------------------------------------------
    def create(self, conn, tenant: dict, body: Any, now: int) -> dict:
        """One job: create_many's answer for it, or its error raised."""
        (result,) = self.create_many(conn, tenant, [body], now)
        if isinstance(result, Exception):
            raise result
        return result

    def create_many(
        self,
        conn,
        tenant: dict,
        bodies: list[Any],
        now: int,
        check: Callable[[Any], None] | None = None,
    ) -> list[dict | Exception]:
        """Each body's job, in order: its view (what POST /v1/jobs answers) or
        the error that refused it (a ValidationError and the like, raised by
        `check` or parse_job). One bad body refuses only itself. The valid ones
        are written together in one transaction: one statement batch each for
        jobs and timers, one notify for the earliest timer, one read back."""
        results: list[dict | Exception | None] = [None] * len(bodies)
        made: list[tuple[int, str, int, JobSpec, int | None]] = []  # (index, id, part, spec, due)
        for i, body in enumerate(bodies):
            try:
                if check is not None:
                    check(body)
                spec = parse_job(
                    body, now_ms=now, allowed_priorities=tuple(tenant["priority_classes"])
                )
                job_id = new_id("job")
                nxt = next_due(
                    parse_schedule(spec.schedule, anchor_ms=now), job_id, now, spec.jitter_ms
                )
            except REFUSALS as e:
                results[i] = e
                continue
            made.append((i, job_id, partition_of(job_id), spec, nxt[1] if nxt else None))
        if not made:
            return results  # type: ignore[return-value]
        secrets_by_job: dict[str, str] = {}
        columns = [_spec_columns(spec) for _i, _j, _p, spec, _d in made]
        with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
            rows = cur.execute(
                Q["insert_jobs"],
                {
                    "tenant_id": tenant["tenant_id"],
                    "now": to_dt(now),
                    "partition_id": [part for _i, _j, part, _s, _d in made],
                    "job_id": [job_id for _i, job_id, _p, _s, _d in made],
                    **{k: [c[k] for c in columns] for k in columns[0]},
                },
            ).fetchall()
            timers.insert_job_timers(
                conn,
                tenant["tenant_id"],
                [(part, job_id, due, spec.priority) for _i, job_id, part, spec, due in made if due],
            )
            for _i, job_id, _part, spec, _due in made:
                if spec.target["type"] == "webhook":
                    secrets_by_job[job_id] = webhooks.create_secret(
                        conn, tenant["tenant_id"], job_id, now
                    )
        due_of = {job_id: due for _i, job_id, _p, _s, due in made}
        views = {}
        for row in rows:  # as get_job shows them: the row and its timer's due time
            row["next_due_at"] = to_dt(due_of[row["job_id"]]) if due_of[row["job_id"]] else None
            view = self.view(row)
            if row["job_id"] in secrets_by_job:
                view["signing_secret_ids"] = webhooks.secret_ids(conn, row["job_id"], now)
                view["signing_secret"] = secrets_by_job[row["job_id"]]  # shown once
            views[row["job_id"]] = view
        for i, job_id, _part, _spec, _due in made:
            results[i] = views[job_id]
        return results  # type: ignore[return-value]

    def update(self, conn, tenant: dict, job_id: str, patch: Any, now: int) -> dict:
        """Merge `patch` into the job as the API shows it, validate the whole, and
        move the timer. A changed schedule starts from now: it never back-fires."""
        if not isinstance(patch, dict):
            raise ValidationError("body", "must be an object")
        with conn.transaction():
            row = self._load(conn, tenant["tenant_id"], job_id, lock=True)
            current = self.view({**row, "next_due_at": None})
            merged = {
                k: current[k]
                for k in ("name", "schedule", "target", "payload", "priority", "retry", "lease_ms")
            }
            if current["timeout_ms"] is not None:
                merged["timeout_ms"] = current["timeout_ms"]
            merged.update(patch)
            spec = parse_job(
                merged, now_ms=now, allowed_priorities=tuple(tenant["priority_classes"])
            )
            schedule_changed = (
                spec.schedule != row["schedule"] or spec.jitter_ms != row["jitter_ms"]
            )
            anchor = now if schedule_changed else to_ms(row["anchor_at"])
            conn.execute(
                Q["update_job"],
                {
                    "partition_id": row["partition_id"],
                    "job_id": job_id,
                    "now": to_dt(now),
                    "anchor_at": to_dt(anchor),
                    **_spec_columns(spec),
                },
            )
            if schedule_changed:
                conn.execute(
                    Q["restart_schedule_from"],
                    {"now": to_dt(now), "partition_id": row["partition_id"], "job_id": job_id},
                )
            secret = None
            if spec.target["type"] == "webhook":
                secret = webhooks.ensure_secret(conn, tenant["tenant_id"], job_id, now)
            if not row["paused"]:
                last = now if schedule_changed else to_ms(row["last_instant"])
                nxt = next_due(
                    parse_schedule(spec.schedule, anchor_ms=anchor), job_id, last, spec.jitter_ms
                )
                _set_timer(
                    conn, job_id, row["partition_id"], nxt[1] if nxt else None, spec.priority
                )
        out = self.get(conn, tenant["tenant_id"], job_id, now=now)
        if secret:
            out["signing_secret"] = secret  # shown once
        return out

    def pause(self, conn, tenant: dict, job_id: str, now: int) -> dict:
        with conn.transaction():
            row = self._load(conn, tenant["tenant_id"], job_id, lock=True)
            if not row["paused"]:
                conn.execute(
                    Q["set_paused"],
                    {
                        "paused": True,
                        "now": to_dt(now),
                        "partition_id": row["partition_id"],
                        "job_id": job_id,
                    },
                )
                _set_timer(conn, job_id, row["partition_id"], None, row["priority"])
        return self.get(conn, tenant["tenant_id"], job_id)

    def resume(self, conn, tenant: dict, job_id: str, now: int) -> dict:
        """Instants missed while paused go through the catch-up window like downtime."""
        with conn.transaction():
            row = self._load(conn, tenant["tenant_id"], job_id, lock=True)
            if row["paused"]:
                conn.execute(
                    Q["set_paused"],
                    {
                        "paused": False,
                        "now": to_dt(now),
                        "partition_id": row["partition_id"],
                        "job_id": job_id,
                    },
                )
                sched = parse_schedule(row["schedule"], anchor_ms=to_ms(row["anchor_at"]))
                nxt = next_due(sched, job_id, to_ms(row["last_instant"]), row["jitter_ms"])
                _set_timer(
                    conn, job_id, row["partition_id"], nxt[1] if nxt else None, row["priority"]
                )
        return self.get(conn, tenant["tenant_id"], job_id)

    def delete(self, conn, tenant: dict, job_id: str, now: int) -> None:
        with conn.transaction():
            row = self._load(conn, tenant["tenant_id"], job_id, lock=True)
            p = row["partition_id"]
            conn.execute(
                Q["soft_delete_job"], {"now": to_dt(now), "partition_id": p, "job_id": job_id}
            )
            _set_timer(conn, job_id, p, None, row["priority"])
            self.lifecycle.cancel_waiting_runs_of_job(conn, p, job_id, now, "job deleted")

    def _runs_for(self, row: dict, instants: list[tuple[str, int]]) -> NewRuns:
        spec = run_spec(row)
        runs = NewRuns()
        for run_id, at in instants:
            runs.add_spec(
                row["partition_id"], run_id, row["tenant_id"], row["job_id"], at,
                row["priority"], spec,
            )  # fmt: skip
        return runs

    def trigger(self, conn, tenant: dict, job_id: str, now: int) -> dict:
        """A run now, outside the schedule (also for paused jobs: an explicit ask)."""
        with conn.transaction():
            row = self._load(conn, tenant["tenant_id"], job_id, lock=True)
            run_id = run_id_for_trigger(job_id, now)
            rows = insert_runs(conn, self.topics, self._runs_for(row, [(run_id, now)]), now)
            outbox.append(conn, rows)
        return {"run_id": run_id, "created": bool(rows)}

    def backfill(
        self, conn, tenant: dict, job_id: str, start_ms: int, end_ms: int, now: int
    ) -> dict:
        """Runs for the schedule's instants in [start, end]. They carry the same ids
        as scheduled fires, so an instant that already ran is not run again."""
        if end_ms < start_ms:
            raise ValidationError("to", "must not be before from")
        if end_ms > now:
            raise ValidationError("to", "must not be in the future")
        with conn.transaction():
            row = self._load(conn, tenant["tenant_id"], job_id, lock=True)
            sched = parse_schedule(row["schedule"], anchor_ms=to_ms(row["anchor_at"]))
            instants: list[int] = []
            fire = sched.next_after(start_ms - 1)
            while fire is not None and fire.at_ms <= end_ms:
                instants.append(fire.at_ms)
                if len(instants) > MAX_BACKFILL:
                    raise ValidationError(
                        "to", f"the range holds more than {MAX_BACKFILL} instants"
                    )
                fire = sched.next_after(fire.at_ms)
            runs = self._runs_for(row, [(run_id_for_instant(job_id, at), at) for at in instants])
            rows = insert_runs(conn, self.topics, runs, now)
            outbox.append(conn, rows)
        return {
            "instants": len(instants),
            "created": len(rows),
            "already_existed": len(instants) - len(rows),
        }


class JobTimers:
    """The handler of `job` timers: a job's next scheduled instant(s)."""

    def __init__(
        self, topics: Topics, cache: timers.ScheduleCache | None = None, *, ahead_ms: int = 0
    ):
        self.topics = topics
        self.cache = cache or timers.ScheduleCache()
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
        self,
        conn: psycopg.Connection,
        due: list[timers.Timer],
        now: int,
        report: timers.FireReport,
    ) -> list[OutboxRow]:
        jobs = conn.execute(
            Q["jobs_for_timers"],
            {
                "partitions": pgarrays.int2_array([t.partition_id for t in due]),
                "job_ids": pgarrays.text_array([t.owner_id for t in due]),
            },
        ).fetchall()
        new_runs = NewRuns()
        horizon = now + self.ahead_ms
        adv: dict[str, list] = {k: [] for k in ("p", "id", "li", "m", "f", "o", "b")}

        def step(t: timers.Timer, job: tuple) -> int | None:
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
                    at = due_at(job_id, pr.instant_ms, jitter_ms) if self.ahead_ms else now
                    new_runs.add(
                        partition_id, run_id_for_instant(job_id, pr.instant_ms), tenant_id,
                        job_id, pr.instant_ms, pr.covers, priority, spec, target_type, queue,
                        payload, not_before_ms=at if at > now else None,
                    )  # fmt: skip
                    report.lateness_ms.append((now - t.due_ms, t.priority))
            report.missed += plan.missed
            adv["p"].append(partition_id)
            adv["id"].append(job_id)
            adv["li"].append(plan.last_instant_ms)
            adv["m"].append(plan.missed)
            adv["f"].append(len(plan.runs))
            adv["o"].append(plan.overlap_skipped)
            adv["b"].append(plan.buffered_ms)
            if plan.next_due_ms is not None:
                report.job_due_ms.append(plan.next_due_ms)
            return plan.next_due_ms

        # Deleted or paused since the timer was written: not loaded, the timer goes.
        moves = timers.plan_each(due, {row[1]: row for row in jobs}, step)
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
        moves.apply(conn)
        return rows
