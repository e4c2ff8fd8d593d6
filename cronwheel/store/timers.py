"""Timers: every time-driven event (a job's or a workflow's next instant, a
retry's backoff, a lease's or a timeout's expiry) is a row of `timers`, and
this module owns every statement that touches them (sql/timers.sql): the
firing loop's claims, arming, moving and dropping timers, and the parts of the
run transitions that arm or end an attempt's timers (fragments spliced into
lifecycle.sql, so StartRun and CompleteRun stay one statement each).

A timer's class is PRIORITY_RANK's: given in Python, or, where only the
database knows the run's class, looked up in PRIORITIES passed as a parameter
(CLASS_PARAMS); no statement spells the mapping out.

Which kinds exist and who handles each is cronwheel.store.timer_kinds's; the
loop that both scheduled kinds (a job's, a workflow's next instant) run over
their timers is `plan_each` here.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import NamedTuple, TypeVar

import psycopg

from cronwheel.core.clock import to_dt, to_ms
from cronwheel.core.events import OutboxRow
from cronwheel.core.runs import NORMAL_RANK, PRIORITIES, PRIORITY_RANK, priority_rank
from cronwheel.core.schedule import parse_schedule
from cronwheel.store import pgarrays
from cronwheel.store.sql_loader import queries, splice

Q = queries("timers")
# The rank mapping, for statements that compute a timer's class from a run's.
CLASS_PARAMS = {"classes": pgarrays.text_array(list(PRIORITIES)), "normal_rank": NORMAL_RANK}


def spliced(blocks: dict[str, str]) -> dict[str, str]:
    """`blocks` (a module's named SQL) with each `{{timers.<name>}}` replaced by
    that fragment of timers.sql: the statement runs as one, its timer part
    written once. Statements with a fragment that reads the run's class take
    CLASS_PARAMS."""
    return splice(blocks, {"timers": Q})


def timer_id(kind: str, owner_id: str) -> str:
    """A timer's id: one timer per kind and owner (a job, a workflow, a run)."""
    return f"{kind}:{owner_id}"


def job_timer_id(job_id: str) -> str:
    return timer_id("job", job_id)


def workflow_timer_id(workflow_id: str) -> str:
    return timer_id("workflow", workflow_id)


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
    # Per created run: (now - due, the timer's class rank).
    lateness_ms: list[tuple[int, int]] = field(default_factory=list)
    fenced: int = 0  # timers left alone: their partition is no longer ours
    next_due_ms: list[int] = field(default_factory=list)  # when to wake: a quota refill, a backlog
    job_due_ms: list[int] = field(default_factory=list)  # where moved job timers are due next
    held: int = 0  # due job timers a tenant's fire quota held back (they stay due)
    lanes: int = 0  # lanes served round-robin; 0: no backlog, claimed in due order
    reannounced: dict[str, int] = field(
        default_factory=dict
    )  # PENDING runs past deadline, by class


# A timer kind's handler: called in the firing transaction with the due timers
# of its kind; returns the outbox rows it announces.
Handler = Callable[[psycopg.Connection, list[Timer], int, FireReport], list[OutboxRow]]


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


# -- moving and dropping timers -------------------------------------------------


class Moves:
    """Timers to move to a new due time or to drop, written in one statement
    each (apply), in the caller's transaction."""

    def __init__(self) -> None:
        self.p: list[int] = []
        self.id: list[str] = []
        self.due: list[int] = []
        self.gone_p: list[int] = []
        self.gone_id: list[str] = []

    def move(self, t: Timer, due_ms: int) -> None:
        self.p.append(t.partition_id)
        self.id.append(t.timer_id)
        self.due.append(due_ms)

    def drop(self, t: Timer) -> None:
        self.gone_p.append(t.partition_id)
        self.gone_id.append(t.timer_id)

    def apply(self, conn: psycopg.Connection) -> None:
        if self.id:
            moved = {"d": pgarrays.timestamptz_array(self.due)}
            conn.execute(Q["reschedule_timers"], {**_keys(self.p, self.id), **moved})
        if self.gone_id:
            conn.execute(Q["delete_timers"], _keys(self.gone_p, self.gone_id))


def _keys(partitions: list[int], ids: list[str]) -> dict:
    return {"p": pgarrays.int2_array(partitions), "id": pgarrays.text_array(ids)}


Owner = TypeVar("Owner")


def plan_each(
    timers: list[Timer], owners: dict[str, Owner], step: Callable[[Timer, Owner], int | None]
) -> Moves:
    """The loop of the scheduled kinds (a job's, a workflow's next instant):
    each timer's owner as the handler loaded it (missing: deleted, paused or
    unscheduled since the timer was written, so the timer goes); `step` plans
    the owner's firing, acts on it, and says when the timer is due next (None:
    never again). Returns the moves, for the caller to apply after its own
    writes."""
    moves = Moves()
    for t in timers:
        owner = owners.get(t.owner_id)
        due = None if owner is None else step(t, owner)
        if due is None:
            moves.drop(t)
        else:
            moves.move(t, due)
    return moves


def set_timer(
    conn: psycopg.Connection,
    kind: str,
    owner_id: str,
    partition: int,
    due_ms: int | None,
    priority: str,
) -> None:
    """Point an owner's timer (a job's, a workflow's) at `due_ms` and wake the
    firing loop, or drop it (None). Its tenant is the owner's."""
    tid = timer_id(kind, owner_id)
    if due_ms is None:
        conn.execute(Q["delete_timers"], {"p": [partition], "id": [tid]})
        return
    conn.execute(
        Q["upsert_timer"],
        {
            "p": partition, "id": tid, "kind": kind, "owner": owner_id, "due": to_dt(due_ms),
            "prio": PRIORITY_RANK[priority], "attempt": None,
        },
    )  # fmt: skip
    notify(conn, due_ms)


def notify(conn: psycopg.Connection, due_ms: int) -> None:
    """Wake the firing loop for a timer due at `due_ms` when this commits."""
    conn.execute(Q["notify_timer"], {"due_ms": due_ms})


def insert_job_timers(
    conn: psycopg.Connection, tenant_id: str, timers: Iterable[tuple[int, str, int, str]]
) -> None:
    """The first timers of new jobs of one tenant, (partition, job, due ms,
    class) each, in one statement, and one wake-up for the earliest."""
    timers = list(timers)
    if not timers:
        return
    conn.execute(
        Q["insert_new_job_timers"],
        {
            "tenant_id": tenant_id,
            "p": [p for p, _j, _d, _c in timers],
            "id": [job_timer_id(j) for _p, j, _d, _c in timers],
            "owner": [j for _p, j, _d, _c in timers],
            "due": [to_dt(d) for _p, _j, d, _c in timers],
            "prio": [PRIORITY_RANK[c] for _p, _j, _d, c in timers],
        },
    )
    notify(conn, min(d for _p, _j, d, _c in timers))


class Retry(NamedTuple):
    """The backoff timer of an attempt that ended in RETRY_WAIT."""

    p: int
    run_id: str
    tenant_id: str
    due_ms: int
    priority: str
    attempt: int


def arm_retries(conn: psycopg.Connection, retries: list[Retry]) -> None:
    """Arm retry timers and wake the firing loop, in one statement (a single
    one scalar: see lifecycle.sql on why)."""
    if not retries:
        return
    if len(retries) == 1:
        (r,) = retries
        conn.execute(
            Q["arm_retry"],
            {
                "p": r.p, "id": timer_id("retry", r.run_id), "owner": r.run_id,
                "due": to_dt(r.due_ms), "prio": priority_rank(r.priority),
                "attempt": r.attempt, "tenant_id": r.tenant_id, "due_ms": r.due_ms,
            },
        )  # fmt: skip
        return
    conn.execute(
        Q["arm_retries"],
        {
            "p": [r.p for r in retries],
            "owner": [r.run_id for r in retries],
            "due": [to_dt(r.due_ms) for r in retries],
            "prio": [priority_rank(r.priority) for r in retries],
            "attempt": [r.attempt for r in retries],
            "tenant_id": [r.tenant_id for r in retries],
            "due_ms": min(r.due_ms for r in retries),
        },
    )


def arm_sweeps(conn: psycopg.Connection, sweeps: Iterable[tuple[int, int]]) -> None:
    """The `pending` sweep timers of partitions (partition, first due ms) that
    have none yet (cronwheel.store.pending): one per partition, class low, no
    tenant; an existing one keeps its due time."""
    sweeps = list(sweeps)
    if not sweeps:
        return
    conn.execute(
        Q["arm_sweeps"],
        {
            "p": pgarrays.int2_array([p for p, _d in sweeps]),
            "due": pgarrays.timestamptz_array([d for _p, d in sweeps]),
            "prio": PRIORITY_RANK["low"],
        },
    )


# -- the firing loop's claims -------------------------------------------------------


def _timer(r: tuple) -> Timer:
    return Timer(r[0], r[1], r[2], r[3], to_ms(r[4]), r[5], r[6], r[7])


class Claimed:
    """What claim_due locked. A full batch means a backlog, which the firing
    claims again by lanes and may not act on all of: its rows become Timers
    only when asked (a storm's every batch is one)."""

    def __init__(self, rows: list[tuple]) -> None:
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def first_class(self) -> int | None:
        return self.rows[0][7] if self.rows else None

    def timers(self) -> list[Timer]:
        return [_timer(r) for r in self.rows]


def claim_due(conn: psycopg.Connection, due_by: dict, partitions, limit: int) -> Claimed:
    """Up to `limit` due timers of `partitions`, by class then due time, locked.
    `due_by`: {"now", "ahead"} (every kind due by now, job timers by ahead)."""
    return Claimed(
        conn.execute(
            Q["claim_due"], {**due_by, "partitions": partitions, "limit": limit}
        ).fetchall()
    )


# Up to this many due timers, due_lanes reads the lanes off the due timers
# themselves; beyond it (a backlog), one probe per lane that exists.
FEW_DUE = 2_000


def due_lanes(
    conn: psycopg.Connection, due_by: dict, partitions, few: int = FEW_DUE
) -> list[tuple[int, str]]:
    """The lanes (class, tenant) with a due timer in `partitions`, by class."""
    rows = conn.execute(Q["due_lanes"], {**due_by, "partitions": partitions, "few": few}).fetchall()
    return [(r[0], r[1]) for r in rows]


def claim_lanes(
    conn: psycopg.Connection,
    due_by: dict,
    partitions,
    quota: dict[tuple[int, str], int],
    taken: list[Timer],
) -> list[Timer]:
    """Up to quota[lane] due timers of each lane, oldest first, locked; not
    those already `taken` by this transaction."""
    rows = conn.execute(
        Q["claim_lanes"],
        {
            **due_by,
            "partitions": partitions,
            "prio": pgarrays.int2_array([lane[0] for lane in quota]),
            "tenant": pgarrays.text_array([lane[1] for lane in quota]),
            "quota": list(quota.values()),
            "taken": pgarrays.text_array([t.timer_id for t in taken]),
        },
    ).fetchall()
    return [_timer(r) for r in rows]


def upcoming(
    conn: psycopg.Connection, partitions, after: int, horizon: int, limit: int
) -> list[tuple[int, int, bool]]:
    """(class, due ms, a job timer's) of timers due in (after, horizon], up to
    `limit` per class."""
    rows = conn.execute(
        Q["upcoming"],
        {
            "partitions": partitions,
            "after": to_dt(after),
            "horizon": to_dt(horizon),
            "limit": limit,
        },
    ).fetchall()
    return [(prio, to_ms(due), is_job) for prio, due, is_job in rows]
