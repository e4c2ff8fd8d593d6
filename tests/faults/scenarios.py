"""The fault scenarios: each a fault the harness (tests/faults/harness.py)
applies on a schedule to its private stack, with the proof that it landed.

  kafka_kill      kill -9 of the broker mid-stream, down a while, started again
  kafka_restart   the broker stopped gracefully (SIGTERM), then started again
  pg_immediate    `pg_ctl stop -m immediate` while a firing transaction is open
                  and worker calls are in flight, then started again (crash
                  recovery); the runs a synchronous_commit=off commit lost are
                  counted, and the checker proves each fired again, same id
  replay          the dispatcher's and the SDK worker's groups reset to offset
                  0 while they are stopped: they read everything again
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psycopg
from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition

from tests.faults.harness import Load, Platform, PrivateStack, Report, check, wait_recovered
from tests.support.wait import wait_for

log = logging.getLogger("tests.faults")


@dataclass(frozen=True)
class Plan:
    """A fault schedule: `cycles` faults, each after a calm of `calm_s` (drawn
    around it) with the server down `down_s`."""

    cycles: int
    calm_s: float
    down_s: float
    seed: int = 26


# The database stays down longer than a run's lease (harness.LEASE_MS), so
# the runs a crash interrupts lose their attempt while it is down.
SHORT = {
    "kafka_kill": Plan(cycles=1, calm_s=1, down_s=2),
    "kafka_restart": Plan(cycles=1, calm_s=1, down_s=2),
    "pg_immediate": Plan(cycles=1, calm_s=1, down_s=6),
    "replay": Plan(cycles=1, calm_s=2, down_s=0),
}
LONG = {
    "kafka_kill": Plan(cycles=5, calm_s=10, down_s=8),
    "kafka_restart": Plan(cycles=5, calm_s=10, down_s=8),
    "pg_immediate": Plan(cycles=5, calm_s=10, down_s=8),
    "replay": Plan(cycles=3, calm_s=10, down_s=0),
}


def _outbox(conn: psycopg.Connection) -> tuple[int, int]:
    """(rows, highest id) of the outbox."""
    return conn.execute("SELECT count(*), coalesce(max(id), 0) FROM outbox").fetchone()


def _broker_down(stop_broker: Callable[[PrivateStack], int]):
    def fault(stack: PrivateStack, platform: Platform, plan: Plan, report: Report) -> None:
        with platform.connect() as conn:
            _, before = _outbox(conn)
            stop_broker(stack)
            assert stack.kafka_pid() is None
            down_at = time.monotonic()
            # The broker's absence, seen from the database: the timer keeps
            # firing, the relay's produces have nowhere to go, so rows fired
            # after the stop stay in the outbox.
            wait_for(lambda: _outbox(conn)[1] > before, plan.down_s + 10, 0.1, "a fire while down")
            time.sleep(max(0.0, plan.down_s - (time.monotonic() - down_at)))  # the outage itself
            rows, newest = _outbox(conn)
        assert stack.kafka_pid() is None, "the broker came back by itself"
        assert newest > before and rows > 0, "no row waited in the outbox while the broker was down"
        report.notes.append(f"outbox {rows} rows while the broker was down")
        t0 = time.monotonic()
        stack.up()
        report.notes.append(f"broker answering {time.monotonic() - t0:.1f} s after its start")

    return fault


def _firing_open(conn: psycopg.Connection) -> bool:
    """The timer's session is inside a transaction (a firing batch) right now."""
    return bool(
        conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'fault-timer'"
            " AND xact_start IS NOT NULL AND state <> 'idle'"
        ).fetchone()[0]
    )


def _pg_immediate(stack: PrivateStack, platform: Platform, plan: Plan, report: Report) -> None:
    with platform.connect() as conn:
        wait_for(
            lambda: conn.execute("SELECT count(*) FROM runs WHERE state = 'RUNNING'").fetchone()[0],
            20,
            0.01,
            "worker calls in flight",
        )
        wait_for(lambda: _firing_open(conn), 20, 0.001, "a firing transaction open")
        seen = {r for (r,) in conn.execute("SELECT run_id FROM runs")}
        running = conn.execute("SELECT count(*) FROM runs WHERE state = 'RUNNING'").fetchone()[0]
    pid = stack.pg_pid()
    stack.pg_ctl_stop("immediate")
    assert stack.pg_pid() is None and pid is not None
    time.sleep(plan.down_s)  # the outage itself
    stack.up()
    assert stack.pg_pid() not in (None, pid), "PostgreSQL did not restart"
    with platform.connect() as conn:
        after = {r for (r,) in conn.execute("SELECT run_id FROM runs")}
    vanished = len(seen - after)
    report.notes.append(
        f"{running} runs RUNNING at the crash, {vanished} committed runs lost by it"
    )


# The admin client is held while its futures are waited for: one dropped
# first destroys its handle and fails them ("Broker handle destroyed").


def _consumer_groups(admin, platform: Platform) -> list[str]:
    """The platform's consumer groups (named after its topic prefix) and the worker's."""
    listed = admin.list_consumer_groups(request_timeout=10).result()
    mine = (f"{platform.topic_prefix}.", f"cronwheel-worker.{platform.worker_topic}")
    return sorted(g.group_id for g in listed.valid if g.group_id.startswith(mine))


def _committed(admin, group: str) -> dict[tuple[str, int], int]:
    got = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group].result()
    return {(tp.topic, tp.partition): tp.offset for tp in got.topic_partitions if tp.offset >= 0}


def _replay(stack: PrivateStack, platform: Platform, plan: Plan, report: Report) -> None:
    """Every consumer of the load (dispatcher, SDK worker) stopped, its group
    reset to offset 0 of every partition it had read, and started again: it
    reads its whole history a second time."""
    platform.stop_worker()
    assert platform.services["dispatcher"].stop() == 0
    admin = stack.kafka_admin()  # resetting groups is the operator's act
    # Both groups: the worker's and the dispatcher's (named after the prefix).
    groups = wait_for(
        lambda: (g := _consumer_groups(admin, platform)) and len(g) >= 2 and g,
        30,
        0.5,
        "the worker's and the dispatcher's consumer groups",
    )
    before = {g: _committed(admin, g) for g in groups}
    for group, offsets in before.items():
        to_zero = [TopicPartition(t, p, 0) for t, p in offsets]
        admin.alter_consumer_group_offsets([ConsumerGroupTopicPartitions(group, to_zero)])[
            group
        ].result()
    reset = {g: _committed(admin, g) for g in groups}
    assert all(not any(o.values()) for o in reset.values()), f"offsets not reset: {reset}"
    records = sum(sum(o.values()) for o in before.values())
    assert records > 0, "nothing to replay"
    platform.start_service("dispatcher")
    platform.start_worker(platform.worker_topic)

    def read_again() -> bool:
        return all(
            all(_committed(admin, g).get(tp, 0) >= n for tp, n in offsets.items())
            for g, offsets in before.items()
        )

    # Landed: every group has committed past everything it had read before.
    wait_for(read_again, 120, 0.5, "the consumers to read their history again")
    report.notes.append(f"{records} records replayed by {len(groups)} groups")


# Faults that keep the database away longer than a run's lease: the runs they
# interrupt are expired and run again as their next attempt (docs/reliability.md).
OUTLASTS_LEASES = {"pg_immediate"}

FAULTS = {
    "kafka_kill": _broker_down(PrivateStack.kill_kafka),
    "kafka_restart": _broker_down(PrivateStack.stop_kafka),
    "pg_immediate": _pg_immediate,
    "replay": _replay,
}


def run(stack: PrivateStack, name: str, plan: Plan, log_dir: Path) -> Report:
    """One scenario from start to checker; the report lists what went wrong."""
    fault = FAULTS[name]
    rng = random.Random(plan.seed)
    report = Report(name)
    platform = Platform(stack, log_dir)
    t0 = time.monotonic()

    def phase(what: str) -> None:
        report.notes.append(f"{what} at {time.monotonic() - t0:.1f} s")

    load = None
    try:
        platform.start()
        load = Load(platform, rng)
        platform.start_worker(load.topic)
        load.start_triggers()
        with platform.connect() as conn:
            wait_for(
                lambda: conn.execute(
                    "SELECT count(*) FROM runs WHERE state = 'SUCCEEDED'"
                ).fetchone()[0],
                60,
                0.1,
                "the first run to succeed",
            )
        phase("first run succeeded")
        for _ in range(plan.cycles):
            time.sleep(rng.uniform(0.5, 1.5) * plan.calm_s)  # the schedule: calm, then fault
            fault(stack, platform, plan, report)
            report.recover_s.append(wait_recovered(platform))
        phase("faults done")
        end_ms = load.stop()
        phase("load stopped")
        report.notes.append(f"{load.trigger_retries} trigger posts retried")
        check(platform, load, end_ms, report, allow_lost_leases=name in OUTLASTS_LEASES)
        phase("checked")
        return report
    except BaseException:
        platform.launch.print_logs()
        raise
    finally:
        if load is not None:
            load.halt()
        platform.close()
