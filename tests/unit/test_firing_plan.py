"""cronwheel.core.firing.plan_fire: what one firing of a job's timer decides, with
real schedules from parse_schedule and a clock the test chooses.

The property at the end drives plan_fire the way the timer service does (feed
back last_instant, sleep until next_due) after a random downtime and checks the
bookkeeping: every instant is either fired once or counted missed, never both,
never neither.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from cronwheel.core.clock import iso
from cronwheel.core.firing import (
    CATCHUP_BATCH,
    CATCHUP_PAUSE_MS,
    MISFIRE_GRACE_MS,
    FirePlan,
    due_at,
    plan_fire,
)
from cronwheel.core.jobs import Catchup
from cronwheel.core.schedule import jitter_offset_ms, parse_schedule

T0 = 1_800_000_000_000  # on a whole hour, UTC
SEC = 1000


def every(ms: int, anchor: int = T0):
    return parse_schedule({"every_ms": ms}, anchor_ms=anchor)


def plan(schedule, now: int, last: int = T0, job_id: str = "job_a", **kw) -> FirePlan:
    kw.setdefault("catchup", Catchup())
    return plan_fire(schedule, job_id=job_id, last_instant_ms=last, now_ms=now, **kw)


def instants(plan_: FirePlan) -> list[int]:
    return [r.instant_ms for r in plan_.runs]


def secs(*offsets: int) -> list[int]:
    return [T0 + s * SEC for s in offsets]


# -- one instant at a time ------------------------------------------------------


def test_plan_fire__instant_due__one_run_and_timer_moves_to_next_instant():
    p = plan(every(SEC), now=T0 + SEC + 7)  # a few ms late, as a real timer is
    assert instants(p) == secs(1)
    assert p.runs[0].covers is None
    assert (p.missed, p.overlap_skipped, p.buffered_ms) == (0, 0, None)
    assert p.last_instant_ms == T0 + SEC
    assert p.next_due_ms == T0 + 2 * SEC


def test_plan_fire__woken_before_due__fires_nothing_and_keeps_the_due_time():
    p = plan(every(SEC), now=T0 + SEC - 1)
    assert p.runs == [] and p.missed == 0
    assert p.last_instant_ms == T0
    assert p.next_due_ms == T0 + SEC


def test_plan_fire__cron_schedule__fires_on_the_hour_and_moves_to_the_next_hour():
    hourly = parse_schedule({"cron": "0 * * * *", "timezone": "Europe/Berlin"}, anchor_ms=T0)
    p = plan(hourly, now=T0, last=T0 - 1)
    assert instants(p) == [T0]
    assert p.next_due_ms == T0 + 3600 * SEC


def test_plan_fire__at_schedule__fires_once_then_is_exhausted():
    once = parse_schedule({"at": iso(T0 + 5 * SEC)}, anchor_ms=T0)
    early = plan(once, now=T0 + 4 * SEC)
    assert early.runs == [] and early.next_due_ms == T0 + 5 * SEC
    fired = plan(once, now=T0 + 5 * SEC)
    assert instants(fired) == secs(5)
    assert fired.next_due_ms is None  # the timer is dropped
    again = plan(once, now=T0 + 60 * SEC, last=fired.last_instant_ms)
    assert again.runs == [] and again.missed == 0 and again.next_due_ms is None


# -- jitter ----------------------------------------------------------------------


def _jittered_job_ids(jitter_ms: int, instant: int, n: int) -> list[str]:
    """Job ids whose offset at `instant` is not zero, so 'early' is observable."""
    ids = (f"job_{i}" for i in range(1000))
    return [j for j in ids if jitter_offset_ms(j, instant, jitter_ms) > 0][:n]


def test_plan_fire__jitter__due_time_is_delayed_deterministically_and_never_early():
    jitter = 5 * SEC
    sched = every(60 * SEC)
    first = T0 + 60 * SEC
    offsets = set()
    for job_id in _jittered_job_ids(jitter, first, 5):
        offset = jitter_offset_ms(job_id, first, jitter)
        assert 0 < offset < jitter
        offsets.add(offset)
        due = first + offset
        assert due_at(job_id, first, jitter) == due
        early = plan(sched, now=due - 1, job_id=job_id, jitter_ms=jitter)
        assert early.runs == [] and early.next_due_ms == due
        on_time = plan(sched, now=due, job_id=job_id, jitter_ms=jitter)
        # The run is for the scheduled instant; only its due time moved.
        assert instants(on_time) == [first]
        second = first + 60 * SEC
        assert on_time.next_due_ms == second + jitter_offset_ms(job_id, second, jitter)
        assert plan(sched, now=due, job_id=job_id, jitter_ms=jitter) == on_time
    assert len(offsets) > 1  # it spreads a herd, not shifts it


def test_plan_fire__jitter_longer_than_window__on_time_firing_misses_nothing():
    """A healthy scheduler that fires each instant at its jittered due time must not
    count it missed because the jitter delay exceeds the catch-up window."""
    jitter, window = 600 * SEC, 300 * SEC
    sched = every(60 * SEC)
    first = T0 + 60 * SEC
    for job_id in (f"job_{i}" for i in range(20)):
        due = due_at(job_id, first, jitter)
        p = plan(sched, now=due, job_id=job_id, jitter_ms=jitter, catchup=Catchup(window))
        assert p.missed == 0, job_id
        assert first in instants(p), job_id


# -- catch-up after downtime -----------------------------------------------------


def test_plan_fire__downtime_inside_window__policy_all_fires_every_instant_oldest_first():
    p = plan(every(SEC), now=T0 + 10 * SEC)
    assert instants(p) == secs(*range(1, 11))
    assert p.missed == 0
    assert p.last_instant_ms == T0 + 10 * SEC
    assert p.next_due_ms == T0 + 11 * SEC


def test_plan_fire__due_by_ahead__fires_instants_due_by_then__not_past_it():
    p = plan(every(SEC), now=T0 + SEC - 300, due_by_ms=T0 + SEC + 700)
    assert instants(p) == secs(1)  # due 300 ms from now: fired ahead
    assert p.next_due_ms == T0 + 2 * SEC  # the next is past the lead: stays a timer


def test_plan_fire__due_by_ahead__misfire_window_stays_relative_to_now():
    # 200 ms short of the grace after instant 1: by `now` it still fires; judged
    # at due_by (a second on) it would be counted missed.
    now = T0 + SEC + MISFIRE_GRACE_MS - 200
    window = Catchup(window_ms=0)
    late = plan(every(SEC), now=now, catchup=window)
    ahead = plan(every(SEC), now=now, due_by_ms=now + 1000, catchup=window)
    assert late.missed == 0 and instants(late)[0] == T0 + SEC
    assert ahead.missed == 0 and instants(ahead)[: len(instants(late))] == instants(late)
    assert len(instants(ahead)) == len(instants(late)) + 1  # and the one due within the lead


def test_plan_fire__due_by_ahead__next_catchup_batch_after_the_lead():
    catchup = Catchup(window_ms=300 * SEC, max_runs=1000)
    now = T0 + 25 * SEC
    p = plan(every(100), now=now, last=T0, catchup=catchup, due_by_ms=now + 1000)
    assert len(p.runs) == CATCHUP_BATCH
    # Due within the lead, the claim that made this batch would take it at once.
    assert p.next_due_ms == now + 1000 + CATCHUP_PAUSE_MS


def test_plan_fire__long_catchup__batches_of_catchup_batch_drain_without_loss_or_duplicate():
    sched = every(100)
    catchup = Catchup(window_ms=300 * SEC, max_runs=1000)
    now, last = T0 + 25 * SEC, T0
    fired: list[int] = []
    sizes = []
    for _ in range(10):
        p = plan(sched, now=now, last=last, catchup=catchup)
        assert p.missed == 0
        fired += instants(p)
        sizes.append(len(p.runs))
        last = p.last_instant_ms
        if len(p.runs) < CATCHUP_BATCH:
            break
        assert p.next_due_ms == now + CATCHUP_PAUSE_MS  # the next batch follows soon
        now = p.next_due_ms
    assert sizes[:2] == [CATCHUP_BATCH, CATCHUP_BATCH] and len(sizes) == 3
    assert fired == list(range(T0 + 100, now + 1, 100))  # every instant, in order, once
    assert p.next_due_ms == fired[-1] + 100


def test_plan_fire__instants_older_than_window__counted_missed_exactly():
    p = plan(every(SEC), now=T0 + 10 * SEC, catchup=Catchup(window_ms=5 * SEC))
    # The window is [now - 5 s, now]: the instant on its edge still fires.
    assert instants(p) == secs(5, 6, 7, 8, 9, 10)
    assert p.missed == 4  # 1 s .. 4 s
    assert p.last_instant_ms == T0 + 10 * SEC


def test_plan_fire__all_instants_older_than_window__all_missed_and_timer_moves_on():
    # Down for 10.5 s plus the grace: only the instants inside the grace fire.
    now = T0 + 10 * SEC + MISFIRE_GRACE_MS + 500
    grace_secs = MISFIRE_GRACE_MS // SEC
    p = plan(every(SEC), now=now, last=T0, catchup=Catchup(window_ms=0))
    assert p.missed == 10
    assert instants(p) == secs(*range(11, 11 + grace_secs))
    assert p.next_due_ms == T0 + (11 + grace_secs) * SEC


def test_plan_fire__window_zero_loop_slightly_late__still_fires():
    p = plan(every(SEC), now=T0 + SEC + 40, last=T0, catchup=Catchup(window_ms=0))
    assert instants(p) == secs(1) and p.missed == 0


def test_plan_fire__max_runs__keeps_the_newest_and_counts_the_rest_missed():
    p = plan(every(SEC), now=T0 + 10 * SEC, catchup=Catchup(max_runs=3))
    assert instants(p) == secs(8, 9, 10)
    assert p.missed == 7


def test_plan_fire__policy_latest__one_run_for_the_newest_instant_covering_the_window():
    p = plan(every(SEC), now=T0 + 10 * SEC, catchup=Catchup(window_ms=5 * SEC, policy="latest"))
    assert len(p.runs) == 1
    assert p.runs[0].instant_ms == T0 + 10 * SEC
    assert p.runs[0].covers == tuple(secs(5, 6, 7, 8, 9, 10))
    assert p.missed == 4
    assert p.next_due_ms == T0 + 11 * SEC


def test_plan_fire__policy_latest_single_instant__no_covers():
    p = plan(every(SEC), now=T0 + SEC, catchup=Catchup(policy="latest"))
    assert instants(p) == secs(1) and p.runs[0].covers is None


def test_plan_fire__policy_latest_over_max_runs__covers_newest_and_counts_the_rest_missed():
    p = plan(every(SEC), now=T0 + 10 * SEC, catchup=Catchup(policy="latest", max_runs=3))
    assert p.runs[0].covers == tuple(secs(8, 9, 10))
    assert p.missed == 7  # not covered by the run, so counted, never silently dropped


# -- overlap -----------------------------------------------------------------------


def test_plan_fire__overlap_allow_with_active_run__fires_as_usual():
    p = plan(every(SEC), now=T0 + 3 * SEC, overlap="allow", has_active_run=True)
    assert instants(p) == secs(1, 2, 3) and p.overlap_skipped == 0


def test_plan_fire__overlap_skip_no_active_run__one_run_for_the_newest():
    p = plan(every(SEC), now=T0 + 5 * SEC, overlap="skip")
    assert instants(p) == secs(5)
    assert p.overlap_skipped == 4
    assert p.last_instant_ms == T0 + 5 * SEC and p.next_due_ms == T0 + 6 * SEC


def test_plan_fire__overlap_skip_with_active_run__no_run_and_all_counted_skipped():
    p = plan(every(SEC), now=T0 + 5 * SEC, overlap="skip", has_active_run=True)
    assert p.runs == [] and p.overlap_skipped == 5 and p.buffered_ms is None
    assert p.last_instant_ms == T0 + 5 * SEC and p.next_due_ms == T0 + 6 * SEC


def test_plan_fire__overlap_buffer_one_with_active_run__buffers_the_newest():
    p = plan(every(SEC), now=T0 + 5 * SEC, overlap="buffer_one", has_active_run=True)
    assert p.runs == []
    assert p.buffered_ms == T0 + 5 * SEC
    assert p.overlap_skipped == 4  # the buffered one is not skipped


def test_plan_fire__overlap_buffer_one_no_active_run__one_run_for_the_newest():
    p = plan(every(SEC), now=T0 + SEC, overlap="buffer_one")
    assert instants(p) == secs(1) and p.buffered_ms is None and p.overlap_skipped == 0


def test_plan_fire__overlap_skip_catchup_longer_than_batch__runs_the_newest_instant():
    n = 250  # more than CATCHUP_BATCH instants in the window
    p = plan(every(SEC), now=T0 + n * SEC, overlap="skip", catchup=Catchup(max_runs=1000))
    assert instants(p) == [T0 + n * SEC]
    assert p.overlap_skipped == n - 1  # every other instant is accounted for
    assert p.last_instant_ms == T0 + n * SEC
    assert p.next_due_ms == T0 + (n + 1) * SEC


# -- the property ------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(
    every_ms=st.integers(100, 5000),
    window_ms=st.integers(0, 60_000),
    downtime_ms=st.integers(0, 120_000),
    jitter_ms=st.sampled_from([0, 0, 1, 250, 3000]),
    job_id=st.sampled_from(["job_a", "job_b", "job_c"]),
)
def test_plan_fire__repeated_after_downtime__each_instant_fired_once_or_missed(
    every_ms, window_ms, downtime_ms, jitter_ms, job_id
):
    sched = every(every_ms)
    catchup = Catchup(window_ms=window_ms, policy="all", max_runs=1000)
    window_ms = max(window_ms, MISFIRE_GRACE_MS)  # what the planner applies
    back = T0 + downtime_ms  # the scheduler comes back; nothing ran before
    end = back + 3 * every_ms + jitter_ms
    now, last = back, T0
    fired: list[int] = []
    missed = 0
    for _ in range(100):
        if now > end:
            break
        p = plan_fire(
            sched,
            job_id=job_id,
            last_instant_ms=last,
            now_ms=now,
            catchup=catchup,
            jitter_ms=jitter_ms,
        )
        assert all(i > last for i in instants(p))  # never an instant handled before
        assert all(due_at(job_id, i, jitter_ms) <= now for i in instants(p))  # never early
        assert p.last_instant_ms >= last
        fired += instants(p)
        missed += p.missed
        last = p.last_instant_ms
        assert p.next_due_ms is not None and p.next_due_ms > now
        now = p.next_due_ms
    else:
        raise AssertionError("the firings did not reach the end of the run")

    handled = list(range(T0 + every_ms, last + 1, every_ms))
    assert fired == sorted(set(fired)), "an instant fired twice or out of order"
    assert set(fired) <= set(handled)
    assert len(fired) + missed == len(handled), "an instant was lost or counted twice"
    # Whatever was inside the window when the scheduler came back fired; whatever
    # was older than the window (and than any jitter delay) was missed.
    assert [i for i in handled if i >= back - window_ms] == [
        i for i in fired if i >= back - window_ms
    ]
    assert not [i for i in fired if i < back - window_ms - jitter_ms]
