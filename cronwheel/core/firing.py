"""What one firing of a job's timer does, as a pure function of the job's state
and the clock. The timer service runs it inside the firing transaction; tests run
it with any clock they like.

The job remembers `last_instant`, the last scheduled instant it handled. A firing
walks the instants after it that are due by now:
- instants older than the catch-up window (at least MISFIRE_GRACE_MS) are
  missed: counted, never fired;
- instants inside the window fire (policy `all`, at most `max_runs`, the newest
  kept), or become one run that carries the span (policy `latest`);
- at most CATCHUP_BATCH runs are created per firing; the rest follow on the next
  pass a moment later, so a long catch-up drains at a bounded rate.
Overlap `skip` / `buffer_one` fire no run while one is active (buffer_one keeps
the newest instant to run when the active one ends).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from cronwheel.core.jobs import Catchup
from cronwheel.core.schedule import jitter_offset_ms

CATCHUP_BATCH = 100
CATCHUP_PAUSE_MS = 100  # between catch-up batches of one job
MAX_WALK = 5_000_000  # instants walked to count misses before giving up counting exactly
# A firing this late is still on time, whatever the window: a window of 0 means
# "no catch-up after downtime", not "a loop 3 ms late misses the instant".
MISFIRE_GRACE_MS = 5_000


@dataclass(frozen=True)
class PlannedRun:
    instant_ms: int
    covers: tuple[int, ...] | None = None  # policy `latest`: the instants it stands for


@dataclass
class FirePlan:
    runs: list[PlannedRun] = field(default_factory=list)
    missed: int = 0
    overlap_skipped: int = 0
    buffered_ms: int | None = None
    last_instant_ms: int | None = None
    next_due_ms: int | None = None  # None: the schedule is exhausted, drop the timer


def due_at(job_id: str, instant_ms: int, jitter_ms: int) -> int:
    return instant_ms + jitter_offset_ms(job_id, instant_ms, jitter_ms)


def next_due(schedule, job_id: str, after_ms: int, jitter_ms: int) -> tuple[int, int] | None:
    """(instant, due time) of the first instant after `after_ms`, or None."""
    fire = schedule.next_after(after_ms)
    if fire is None:
        return None
    return fire.at_ms, due_at(job_id, fire.at_ms, jitter_ms)


def plan_fire(
    schedule,
    *,
    job_id: str,
    last_instant_ms: int,
    now_ms: int,
    catchup: Catchup,
    jitter_ms: int = 0,
    overlap: str = "allow",
    has_active_run: bool = False,
    due_by_ms: int | None = None,
) -> FirePlan:
    """`due_by_ms` (default `now_ms`): fire the instants due by then, later than
    now when the timer fires ahead; the misfire window stays relative to now."""
    due_by = now_ms if due_by_ms is None else due_by_ms
    plan = FirePlan(last_instant_ms=last_instant_ms)
    # An instant is missed only when even its latest possible due time (instant +
    # jitter) is older than the window: a jittered fire on time is never missed,
    # and the cut stays monotonic in the instant, so the walk stays in order.
    window_start = now_ms - max(catchup.window_ms, MISFIRE_GRACE_MS) - jitter_ms
    keep: deque[int] = deque()
    cursor = last_instant_ms
    walked = 0
    more_due = False
    while True:
        fire = schedule.next_after(cursor)
        if fire is None or due_at(job_id, fire.at_ms, jitter_ms) > due_by:
            break
        walked += 1
        if walked > MAX_WALK:
            more_due = True
            break
        cursor = fire.at_ms
        if fire.at_ms < window_start:
            plan.missed += 1
            plan.last_instant_ms = cursor
            continue
        keep.append(fire.at_ms)
        if catchup.policy == "all" and len(keep) > catchup.max_runs:
            keep.popleft()
            plan.missed += 1
    if not keep:
        if not more_due:
            plan.last_instant_ms = max(plan.last_instant_ms, cursor)
        _set_next(plan, schedule, job_id, jitter_ms, due_by, more_due)
        return plan

    if catchup.policy == "latest":
        covers = tuple(keep)
        if len(covers) > catchup.max_runs:
            plan.missed += len(covers) - catchup.max_runs  # not covered: counted, not dropped
            covers = covers[-catchup.max_runs :]
        runs = [PlannedRun(keep[-1], covers if len(keep) > 1 else None)]
        plan.last_instant_ms = keep[-1]
    else:
        # With overlap skip/buffer_one only the newest instant can run: take all.
        batch = list(keep)[:CATCHUP_BATCH] if overlap == "allow" else list(keep)
        runs = [PlannedRun(i) for i in batch]
        plan.last_instant_ms = batch[-1]
        more_due = more_due or len(batch) < len(keep)

    if overlap != "allow":
        # One run at most per firing, and none while another is active.
        newest = runs[-1]
        if has_active_run:
            plan.overlap_skipped = len(runs) - (1 if overlap == "buffer_one" else 0)
            if overlap == "buffer_one":
                plan.buffered_ms = newest.instant_ms
            runs = []
        else:
            plan.overlap_skipped = len(runs) - 1
            runs = [newest]
        plan.last_instant_ms = max(plan.last_instant_ms, keep[-1])
        more_due = False
    plan.runs = runs
    _set_next(plan, schedule, job_id, jitter_ms, due_by, more_due)
    return plan


def _set_next(plan: FirePlan, schedule, job_id: str, jitter_ms: int, due_by: int, more_due: bool):
    if more_due:
        # The next catch-up batch after a pause, beyond what this claim could
        # take (firing ahead claims up to due_by: it would come at once).
        plan.next_due_ms = due_by + CATCHUP_PAUSE_MS
        return
    nxt = next_due(schedule, job_id, plan.last_instant_ms, jitter_ms)
    plan.next_due_ms = None if nxt is None else nxt[1]
