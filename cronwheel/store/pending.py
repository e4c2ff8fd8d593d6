"""No run waits forever: the `pending` timer kind (docs/pending-deadline.md).

A RunReady lost after the relay's acknowledgement (a worker that dropped it, a
topic's retention, a record dead-lettered) is never published again by anyone
else, and its run would stay PENDING for good, blocking an `overlap: skip` or
`buffer_one` job with it. So every partition has a sweep timer (`pending:<p>`,
armed by the timer service for the partitions it leases, timers.arm_sweeps),
due every `sweep_ms`; when it fires, the PENDING runs of its partitions whose
deadline has passed are announced again: the same run id and attempt, a new
RunReady through the outbox, in the firing transaction, fenced in the
statement that marks them (pending.sql). Workers are idempotent: StartRun
starts a run once whatever number of records name it.

Per-run timers would cost every run a timer row written at creation and
deleted at StartRun, on the steady firing path; a sweep per partition costs
the path one entry per run in a small partial index (runs_daily_unfinished) and
nothing per run otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass

import psycopg

from cronwheel.core.clock import to_dt, to_ms
from cronwheel.core.events import OutboxRow
from cronwheel.core.runs import PRIORITIES
from cronwheel.kafka import Topics
from cronwheel.store import pgarrays, timers
from cronwheel.store.dispatch import legacy_message_key
from cronwheel.store.new_runs import ready_row
from cronwheel.store.sql_loader import queries
from cronwheel.store.timers import FireReport, Timer

Q = queries("pending")

# The deadline of a PENDING run by class (critical, high, normal, low), in ms:
# well past the time a healthy run waits PENDING (the relay, the dispatcher and
# a worker's poll take milliseconds; a busy queue's backlog, seconds to
# minutes), so a run still queued behind others is rarely announced twice, and
# short enough that a lost record costs a few minutes, not a day. Critical runs
# are worth the duplicates sooner. docs/pending-deadline.md says more.
DEADLINES_MS = (60_000, 120_000, 300_000, 600_000)
# How often each partition's PENDING runs are checked (the deadline's
# resolution): 10 s, and the sweeps of a fleet's 1024 partitions come in
# SWEEP_GROUPS claims per period.
SWEEP_MS = 10_000
SWEEP_GROUPS = 8
# Each re-announcement of a run doubles its next deadline, up to 2^4 times:
# a queue with no worker for hours gets each of its runs announced about
# log2(outage / deadline) times, not once a deadline.
MAX_DOUBLINGS = 4
# Runs re-announced per sweep statement; more overdue than that: the sweep
# timers are due again at once.
LIMIT = 1_000
DISPATCHER = "dispatcher"  # the `processed` consumer that forwards RunReady


def next_sweep(partition: int, after_ms: int, sweep_ms: int) -> int:
    """The first instant after `after_ms` at which `partition`'s sweep is due:
    every `sweep_ms`, in one of SWEEP_GROUPS phases by partition, the same on
    every instance, so a group's sweeps are due together and claimed in one
    batch (under the timer's default batch: 1024 / 8 partitions)."""
    phase = (partition % SWEEP_GROUPS) * sweep_ms // SWEEP_GROUPS
    due = after_ms - (after_ms - phase) % sweep_ms
    return due if due > after_ms else due + sweep_ms


@dataclass
class PendingRuns:
    """The `pending` timers' handler (timer_kinds), made with the timer's
    settings: the deadline by class rank and the sweep period."""

    topics: Topics
    deadlines_ms: tuple[int, ...] = DEADLINES_MS
    sweep_ms: int = SWEEP_MS
    limit: int = LIMIT

    def __post_init__(self) -> None:
        if len(self.deadlines_ms) != len(PRIORITIES):
            raise ValueError(f"one deadline per class ({', '.join(PRIORITIES)})")
        self._params = {
            "deadline_ms": pgarrays.int8_array(list(self.deadlines_ms)),
            "max_doublings": MAX_DOUBLINGS,
            "limit": self.limit,
            **timers.CLASS_PARAMS,
        }

    def on_timers(
        self, conn: psycopg.Connection, due: list[Timer], now: int, report: FireReport
    ) -> list[OutboxRow]:
        """Announce again the overdue PENDING runs of the due timers' partitions
        (one statement for them all), and move each timer to its next sweep."""
        partitions = sorted({t.partition_id for t in due})
        rows = conn.execute(
            Q["reannounce_overdue"],
            {
                **self._params,
                "partitions": pgarrays.int2_array(partitions),
                "now": to_dt(now),
                "oldest": to_dt(now - min(self.deadlines_ms)),
            },
        ).fetchall()
        out = [self._ready(r, now) for r in rows]
        if rows:
            conn.execute(
                Q["forget_forwarded"],
                {
                    "consumer": DISPATCHER,
                    "keys": pgarrays.text_array([legacy_message_key(r[1], r[3]) for r in rows]),
                },
            )
            for r in rows:
                report.reannounced[r[9]] = report.reannounced.get(r[9], 0) + 1
        moves = timers.Moves()
        for t in due:
            # A full statement leaves overdue runs behind: sweep again at once.
            again = now + 1 if len(rows) >= self.limit else None
            moves.move(t, again or next_sweep(t.partition_id, now, self.sweep_ms))
        moves.apply(conn)
        report.next_due_ms.append(min(moves.due))  # the wheel wakes for the next sweep
        return out

    def _ready(self, row: tuple, now: int) -> OutboxRow:
        p, run_id, tenant_id, attempt, spec, job_id, wf_run, node, scheduled, priority, covers = row
        target = spec["target"]
        return ready_row(
            self.topics.runs(tenant_id), p, run_id, tenant_id, attempt, to_ms(scheduled), now,
            priority, target["type"], target.get("queue"), spec["payload"], job_id=job_id,
            workflow_run_id=wf_run, node=node, covers=covers,
        )  # fmt: skip
