"""Idle tenants and dozing (cronwheel.dozing): what a dispatcher and the broker
spend on N tenants with nothing due, with dozing on and off.

N tenants (a run topic of one partition each) in a fresh database and topic
prefix; a dispatcher runs in this process, first with dozing on
(`--doze-after-ms`), then off, each for `--window` seconds after every
partition is assigned and, with dozing on, after every partition dozes.
Printed per case: partitions assigned and dozing, this process's CPU (the
dispatcher's Python and librdkafka's threads) and the broker's, as a share of
one core, with the machine's load; with dozing on, how long the doze checks
and the sweeps held the dispatcher's loop (p99 and max of the calls).

`--latency K`: what dozing costs a run due at once (a trigger, a retry, a
workflow node: the path with no second of warning). One tenant; K times a
record is produced as the relay does (a wake, then the record at once)
onto a partition that dozes, and K times onto one awake (within a second of
the last record). Printed: p50 / p99 / max of the record's run-topic
timestamp to its queue-topic timestamp (the dispatcher's produce). It asserts
nothing.
"""

from __future__ import annotations

import argparse
import os
import threading
import time
import uuid

import psycopg
from common import (
    cpu_seconds,
    create_topics,
    delete_topics,
    describe,
    fresh_database,
    grant,
    header,
    kafka_broker_pid,
    prefix_topics,
    say,
)
from confluent_kafka import OFFSET_END, TopicPartition

from cronwheel import config, kafka
from cronwheel.consumer import produce
from cronwheel.core import events
from cronwheel.dozing import Waker
from cronwheel.kafka import Topics
from services.dispatcher.service import Dispatcher


def _tenants(url: str, topics: Topics, n: int) -> list[str]:
    ids = [f"idle{i:05d}" for i in range(n)]
    with psycopg.connect(url, autocommit=True) as conn, conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO tenants (tenant_id, name) VALUES (%s, %s)", [(t, t) for t in ids]
        )
    names = [topics.runs(t) for t in ids]
    create_topics(names)
    return names


def _measure(url: str, topics: Topics, n: int, doze_after_ms: int, window: float) -> None:
    d = Dispatcher(url, config.kafka_bootstrap(), topics, doze_after_ms=doze_after_ms)
    turns = _time_doze_checks(d)
    stop = threading.Event()
    thread = threading.Thread(target=d.run, args=(stop,), daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 300
        while d.assignment is None or len(d.assignment.assigned) < n:
            if time.monotonic() > deadline:
                raise SystemExit(f"only {len(d.assignment.assigned)} of {n} assigned in 300 s")
            time.sleep(0.5)  # a setup poll, not a measurement
        if doze_after_ms:
            while len(d.dozing.dozing) < n and time.monotonic() < deadline:
                time.sleep(0.5)
        broker = kafka_broker_pid()
        me, them = cpu_seconds(os.getpid()), cpu_seconds(broker) if broker else 0.0
        started = time.monotonic()
        turns.clear()
        time.sleep(window)  # the measured window itself
        spent = time.monotonic() - started
        held = sorted(turns)
        mine = (cpu_seconds(os.getpid()) - me) / spent * 100
        broker_cpu = ((cpu_seconds(broker) - them) / spent * 100) if broker else float("nan")
        dozing = len(d.dozing.dozing) if d.dozing is not None else 0
        say(
            f"doze {'on' if doze_after_ms else 'off'}: {len(d.assignment.assigned)} partitions"
            f" assigned, {dozing} dozing; dispatcher process CPU {mine:.1f}%,"
            f" broker CPU {broker_cpu:.1f}% over {spent:.0f} s"
        )
        if held:
            say(
                f"  the loop held by the doze checks and sweeps: {len(held)} calls,"
                f" p99 {1000 * held[int(0.99 * (len(held) - 1))]:.1f} ms,"
                f" max {1000 * held[-1]:.1f} ms"
            )
    finally:
        stop.set()
        thread.join(60)


def _time_doze_checks(d: Dispatcher) -> list[float]:
    """How long each of the loop's doze checks (the sweep's included) holds
    the dispatcher's loop, in seconds: a run whose record comes meanwhile
    waits that long."""
    took: list[float] = []
    check = d._doze

    def timed(consumer):
        t0 = time.perf_counter()
        try:
            return check(consumer)
        finally:
            took.append(time.perf_counter() - t0)

    d._doze = timed
    return took


def _latency(url: str, topics: Topics, k: int) -> None:
    tenant = "lat00001"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("INSERT INTO tenants (tenant_id, name) VALUES (%s, %s)", [tenant, tenant])
    run_topic, queue = topics.runs(tenant), topics.queue(tenant, "q")
    kafka.ensure_topics([run_topic], partitions=1, principal="dispatcher")
    kafka.ensure_topics([queue], partitions=1, principal="dispatcher")
    d = Dispatcher(config.role_url(url, config.PG_PLATFORM_USER), config.kafka_bootstrap(), topics,
                   doze_after_ms=1_000)  # fmt: skip
    stop = threading.Event()
    thread = threading.Thread(target=d.run, args=(stop,), daemon=True)
    thread.start()
    producer = kafka.producer(principal="relay")
    waker = Waker(producer, every_ms=0, produce=produce)
    reader = kafka.consumer("cronwheel-observer.bench-dozing", principal="observer")
    reader.assign([TopicPartition(queue, 0, OFFSET_END)])
    lat: dict[str, list[float]] = {"dozing": [], "awake": []}
    try:
        while (run_topic, 0) not in (d.assignment.assigned if d.assignment else set()):
            time.sleep(0.1)  # setup poll
        for i in range(2 * k):
            case = "dozing" if i % 2 == 0 else "awake"
            if case == "dozing":
                dozes_by = time.monotonic() + 60  # held 10 s once woken, then the broker is asked
                while (run_topic, 0) not in d.dozing.dozing:
                    if time.monotonic() > dozes_by:
                        raise SystemExit(f"case {i}: the partition did not doze in 60 s")
                    time.sleep(0.05)  # setup poll: the partition dozes before this case
            value = events.run_ready(
                run_id=f"r-{i}", tenant_id=tenant, partition_id=7, attempt=1,
                scheduled_ms=1_700_000_000_000, created_ms=1_700_000_000_003,
                priority="normal", target={"type": "queue", "queue": "q"}, payload="null",
            )  # fmt: skip
            sent = []
            waker.read(run_topic)  # as the relay, which wakes the topic as it reads the row
            produce(producer, topic=run_topic, key=f"r-{i}".encode(), value=value,
                    on_delivery=lambda err, m, sent=sent: sent.append(m.timestamp()[1]))  # fmt: skip
            producer.flush(10)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                m = reader.poll(0.5)
                if m is not None and not m.error() and m.key() == f"r-{i}".encode():
                    lat[case].append(m.timestamp()[1] - sent[0])
                    break
        for case, values in lat.items():
            say(f"a run due at once, partition {case}: {describe(values)} (n={len(values)})")
        say(f"missed wakes (found by the sweep instead): {d.dozing.missed_total}")
    finally:
        stop.set()
        thread.join(60)
        reader.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tenants", type=int, default=1000)
    ap.add_argument("--window", type=float, default=30.0)
    ap.add_argument("--doze-after-ms", type=int, default=2000)
    ap.add_argument("--latency", type=int, default=0, metavar="K")
    args = ap.parse_args()
    if args.latency:
        header(f"dozing: a run due at once, {args.latency} times dozing and awake")
        prefix = f"bl{uuid.uuid4().hex[:8]}"
        grant(prefix)
        with fresh_database() as admin_url:
            try:
                _latency(admin_url, Topics(prefix), args.latency)
            finally:
                delete_topics(prefix_topics(prefix))
        return
    header(f"dozing: {args.tenants} idle tenants, nothing due")
    prefix = f"bd{uuid.uuid4().hex[:8]}"
    grant(prefix)
    topics = Topics(prefix)
    with fresh_database() as admin_url:
        url = config.role_url(admin_url, config.PG_PLATFORM_USER)
        try:
            started = time.monotonic()
            _tenants(admin_url, topics, args.tenants)
            say(
                f"{args.tenants} tenants and their run topics in {time.monotonic() - started:.0f} s"
            )
            for doze in (args.doze_after_ms, 0, args.doze_after_ms, 0):
                _measure(url, topics, args.tenants, doze, args.window)
        finally:
            delete_topics(prefix_topics(prefix))


if __name__ == "__main__":
    main()
