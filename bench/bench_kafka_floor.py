"""The floor under the latency targets: what Kafka alone, on this machine, with
the clients and settings cronwheel uses, takes to move a record, with no
cronwheel code, no database and no Python work per record beyond the client.

Each stage is its own process, as the services are:

- one hop (issue 3's steady case: 1k runs/s, p99 lateness <= 25 ms): a
  producer sends 1,000 records/s to 10 topics of PARTITIONS partitions (10
  tenants' run topics), `spread` evenly over each second or `aligned` (all
  1,000 at the top of the second); one consumer reads all their partitions,
  as the bench's reader does. Latency: the producer's produce() call -> the
  consumer's poll returning the record; aligned, also the top of the second
  -> that poll, counted as bench_firing_steady.py counts a run's lateness
  from its instant (so the producer's wake and its loop over the 1,000
  count, as the relay's do there).
- two hops (issue 4's dispatch latency: 200 runs/s, p99 <= 50 ms): the same
  producer at 200/s spread; a forwarder (consumer of those partitions and
  producer, like the dispatcher, without its database) sends each record on
  to 10 queue topics as many; a last consumer reads those, as the tenants'
  SDK workers do between them. Latency: first produce() -> last poll.
- a herd (`--case herd`, the aligned case at `--tenants` tenants, 3,000 by
  default): `--tenants` run topics and as many queue topics of one partition
  each; every HERD_EVERY_S the producer sends one record to each run topic at
  the top of a second (a minute's firing of that many tenants, each with a
  job every minute); the forwarder sends each on to a queue topic, the last
  consumer reads them all (`--consumers K` splits the forwarder's topics
  between K consumers, a thread each). Latency from the herd's instant (so the
  producer's own loop over the herd counts, as the relay's does in
  bench_tenants.py): to the forwarder's produce() (the forwarded record's
  timestamp: what bench_tenants.py reports for cronwheel's dispatcher) and
  to the last poll.

Producers are cronwheel.kafka.producer() (idempotent, acks=all, lz4) with the
relay's linger of 1 ms; consumers are cronwheel.kafka.consumer() polled the
way bench/common.py's Reader polls. Records carry 200 bytes, about a RunReady.
Each stage authenticates as the platform role whose part it plays (the
broker requires SASL and ACLs): the producer as the relay (it writes run
topics), the forwarder as the dispatcher (its consumer group included), the
last consumer as the observer; the topics are the case's own prefix's run
and queue topics, created by the dispatcher's principal.
Topics are fresh per case, and the stages run WARMUP_S before the window
opens: fresh partitions written at the same time stall the broker's request
handlers once, for 100-1,700 ms, 8-15 s after their first records, in writes
to their memory-mapped index files (page faults on this disk; none on tmpfs),
and then not again in 90 s (docs/architecture.md, "Fresh partitions stall
once").

`--pin` puts the broker and every stage (every thread) on the last CPU from
two seconds after the stages start (their clients made) to the end of the
case: the floor to compare with `bench_firing_steady.py --pin`, whose Kafka
hop gets that same CPU while PostgreSQL and the timer have the others.

`--beside-firing` runs the spread and aligned cases beside the firing's
database work (`common.firing_beside`: the timer service firing 1,000 jobs a
second into a fresh database, spread or aligned as the case is, with no
relay): Kafka alone on a machine that also does what the firing path does
besides the Kafka hop, the part of the gap between this floor and
bench_firing_steady.py that is the two cores' sharing with PostgreSQL and
the timer rather than the relay's hop (docs/architecture.md, "The floor
beside the firing's database work").

If the floor's p99 is above a target, no change to cronwheel's own code can
meet that target on this machine. Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import multiprocessing as mp
import threading
import time
import uuid

from common import (
    broker_pause_share,
    cpu_seconds,
    create_topics,
    delete_topics,
    describe,
    firing_beside,
    grant,
    header,
    hop_cpu,
    kafka_broker_pid,
    machine_load,
    now_precise_ms,
    observer_group,
    percentile,
    pinned,
    say,
    topics_ready,
)
from confluent_kafka import OFFSET_END, TopicPartition

from cronwheel import kafka
from cronwheel.producer_shards import ShardedProducer

TOPICS = 10
# Per topic: the layout the floor's figures in docs/ were measured on (run
# topics had 8 then); `--partitions 1` is a tenant's run and queue topic now
# (kafka.RUN_PARTITIONS, QUEUE_PARTITIONS; docs/dispatcher.md).
PARTITIONS = 8
WARMUP_S = 20  # past the fresh partitions' one-time stall (docstring)
HERD_EVERY_S = 10  # the herd case: one firing of every tenant this often
HERD_TENANTS = 3000
WINDOW_S = 30
PAD = b"x" * 186  # the record: "<produce ms, to the microsecond>|" + padding, about 200 bytes


def _producers(count: int, principal: str, topics: list[str], **overrides) -> ShardedProducer:
    """`count` producers, each topic always through the same one, as the relay
    and the dispatcher send (cronwheel.producer_shards: librdkafka puts one
    partition in each ProduceRequest, confluentinc/librdkafka#1700, and the
    broker answers a connection's requests in order); `--shards` compares
    counts (docs/dispatcher.md, "A minute's herd, end to end")."""
    producer = ShardedProducer(lambda: kafka.producer(principal=principal, **overrides), count)
    for shard in producer.shards:
        topics_ready(shard, topics)
    return producer


def _produce_loop(
    topics: list[str], rate: int, aligned: bool, until: float, partitions: int,
    every_s: int = 1, shards: int = 1,
) -> None:  # fmt: skip
    """Aligned: `rate` records at the top of a second, every `every_s`; a
    herd (every_s > 1) stamps its records with that instant, not with the
    time each was produced."""
    producer = _producers(shards, "relay", topics, **{"linger.ms": 1})
    targets = [(t, p) for t in topics for p in range(partitions)]
    i = 0
    start = int(time.time())
    while time.time() < until:
        if aligned:
            second = start + (i // rate + 1) * every_s
            time.sleep(max(0.0, second - time.time()))  # the pace itself: the next instant
            for _ in range(rate):
                topic, partition = targets[i % len(targets)]
                stamp = second * 1000 if every_s > 1 else now_precise_ms()
                producer.produce(topic, b"%.3f|" % stamp + PAD, partition=partition)
                i += 1
        else:
            topic, partition = targets[i % len(targets)]
            producer.produce(topic, b"%.3f|" % now_precise_ms() + PAD, partition=partition)
            i += 1
            time.sleep(max(0.0, start + i / rate - time.time()))  # the pace itself
        producer.poll(0)
    producer.flush(10)


def _consume_loop(
    topics: list[str], until: float, out, forward_to: list[str] | None, prefix: str,
    partitions: int, shards: int = 1, consumers: int = 1,
) -> None:  # fmt: skip
    """Read every partition of `topics`; with forward_to, produce each record on
    (same value, partition by its index) and report nothing, as the dispatcher
    (its principal and consumer group); else report (sent ms, read ms) pairs,
    as the observer. A forwarder of `consumers` > 1 splits the topics between
    that many consumers, each polled by a thread of its own, sending through
    one (sharded) producer: what splitting the dispatcher's consumer would save."""
    producer = _producers(shards, "dispatcher", forward_to) if forward_to else None
    parts = [topics[i::consumers] for i in range(consumers)] if forward_to else [topics]
    seen: list[tuple[float, float, int]] = []  # (sent, read, the record's timestamp) in ms
    forwarded = itertools.count()

    def read(names: list[str]) -> None:
        if forward_to:
            consumer = kafka.consumer(f"{prefix}.dispatcher", principal="dispatcher")
        else:
            consumer = kafka.consumer(observer_group("floor"), principal="observer")
        meta = topics_ready(consumer, names)
        consumer.assign(
            [TopicPartition(t, p, OFFSET_END) for t in names for p in meta[t].partitions]
        )
        while time.time() < until:
            first = consumer.poll(0.05)
            if first is None:
                continue
            at = now_precise_ms()
            for m in [first, *consumer.consume(num_messages=2000, timeout=0)]:
                if m.error():
                    continue
                if producer is not None:
                    n = next(forwarded)
                    out_topic = forward_to[n % len(forward_to)]
                    producer.produce(
                        out_topic, m.value(), partition=(n // len(forward_to)) % partitions
                    )
                else:
                    seen.append((float(m.value().split(b"|", 1)[0]), at, m.timestamp()[1]))
            if producer is not None:
                producer.poll(0)
        consumer.close()

    threads = [threading.Thread(target=read, args=(part,)) for part in parts[1:]]
    for thread in threads:
        thread.start()
    read(parts[0])
    for thread in threads:
        thread.join()
    if producer is not None:
        producer.flush(10)
    out.put((producer is not None, seen))


def case(
    label: str, rate: int, window_s: int, aligned: bool = False, hops: int = 1,
    partitions: int = PARTITIONS, topics: int = TOPICS, every_s: int = 1, shards: int = 1,
    consumers: int = 1, pin: bool = False,
) -> tuple[float, float | None]:  # fmt: skip
    """The p99 from produce() to readable, and for the aligned case (one
    instant a second) from the instant to readable, what the firing bench's
    aligned lateness compares with."""
    prefix = f"floor{uuid.uuid4().hex[:8]}"
    first = [f"{prefix}.runs.t{i}" for i in range(topics)]
    second = [f"{prefix}.q.t{i}" for i in range(topics)] if hops == 2 else []
    grant(prefix)
    create_topics(first + second, partitions=partitions)
    topics_ready(kafka.admin(principal="observer"), first + second)
    ctx = mp.get_context("spawn")  # no librdkafka handle crosses a fork
    out = ctx.Queue()
    t0 = time.time() + 3  # the processes' start-up, then the warm-up
    window = (t0 + WARMUP_S, t0 + WARMUP_S + window_s)
    end = window[1] + 2
    last = (second or first, end, out, None, prefix, partitions)
    procs = [ctx.Process(target=_consume_loop, args=last)]
    if hops == 2:
        forwarder = (first, end, out, second, prefix, partitions, shards, consumers)
        procs.append(ctx.Process(target=_consume_loop, args=forwarder))
    producing = (first, rate, aligned, window[1], partitions, every_s, shards)
    procs.append(ctx.Process(target=_produce_loop, args=producing))
    broker = kafka_broker_pid()
    stack = contextlib.ExitStack()

    def cpu() -> dict[int, float]:
        """CPU seconds per stage process, and the broker's under key 0."""
        return {p.pid: cpu_seconds(p.pid) for p in procs} | {
            0: cpu_seconds(broker) if broker else 0
        }

    try:
        for p in procs:
            p.start()
        if pin:
            time.sleep(2)  # the stages' clients and their threads made
            stack.enter_context(
                pinned(
                    {"the broker and the stages": ([broker, *(p.pid for p in procs)], hop_cpu())}
                )
            )
        time.sleep(max(0.0, window[0] - time.time()))  # until the window opens
        cpu0 = cpu()
        time.sleep(max(0.0, window[1] - time.time()))  # the window itself
        cpu1 = cpu()
        results = [out.get(timeout=60) for _ in range(hops)]
        for p in procs:
            p.join(30)
    finally:
        stack.close()
        for p in procs:
            if p.is_alive():
                p.kill()
        delete_topics(first + second)
    seen = next(pairs for forwarded, pairs in results if not forwarded)
    lo, hi = int(window[0] * 1000), int(window[1] * 1000)
    late = [read - sent for sent, read, _ts in seen if lo <= sent < hi]
    expected = rate * window_s // every_s
    names = ["consumer", "forwarder", "producer"] if hops == 2 else ["consumer", "producer"]
    shares = [
        f"{name} {100 * (cpu1[p.pid] - cpu0[p.pid]) / window_s:.0f}%"
        for name, p in zip(names, procs, strict=True)
    ] + [f"broker {100 * (cpu1[0] - cpu0[0]) / window_s:.0f}%"]
    say(
        f"{label}: {len(late):,} of ~{expected:,} records in the {window_s} s window;"
        f" produce() -> readable {describe(late)}"
    )
    if hops == 1:
        in_flight = [(read - sent, sent, read) for sent, read, _ts in seen if lo <= sent < hi]
        say(
            f"{label}:   the broker's collector over the window:"
            f" {broker_pause_share(in_flight, lo, hi)}"
        )
    if hops == 2:
        forwarded = [ts - sent for sent, _read, ts in seen if lo <= sent < hi]
        say(f"{label}:   -> the forwarder's produce() {describe(forwarded)}")
    instant_p99 = None
    if aligned and every_s == 1:
        # The firing bench counts from a run's instant, so the relay's wake
        # and its loop over the herd count there; here the producer's do.
        from_instant = [read - sent // 1000 * 1000 for sent, read, _ts in seen if lo <= sent < hi]
        say(f"{label}:   the top of the second (the instant) -> readable {describe(from_instant)}")
        instant_p99 = percentile(from_instant, 99)
    say(f"{label}:   CPU share of one core: {', '.join(shares)}")
    return percentile(late, 99), instant_p99


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--case", choices=["spread", "aligned", "two-hops", "herd"], action="append"
    )
    parser.add_argument("--tenants", type=int, default=HERD_TENANTS, help="the herd case's tenants")
    parser.add_argument("--shards", type=int, default=1, help="the herd case: producers per stage")
    parser.add_argument(
        "--consumers", type=int, default=1, help="the herd case: the forwarder's consumers"
    )
    parser.add_argument("--window", type=int, default=WINDOW_S, help="seconds measured per case")
    parser.add_argument(
        "--partitions", type=int, default=PARTITIONS, help=f"per topic ({PARTITIONS})"
    )
    parser.add_argument(
        "--pin", action="store_true", help="the broker and every stage on the last CPU"
    )
    parser.add_argument(
        "--beside-firing",
        action="store_true",
        help="spread and aligned beside the timer firing 1,000 jobs a second into PostgreSQL",
    )
    args = parser.parse_args()

    def beside(spread_ms: int):
        return firing_beside(spread_ms) if args.beside_firing else contextlib.nullcontext()

    w, n = args.window, args.partitions
    cases = args.case or ["spread", "aligned", "two-hops"]
    header("bench_kafka_floor: Kafka alone, the stages as processes")
    if set(cases) - {"herd"}:
        say(f"setup: {TOPICS} topics of {n} partitions per hop")
    figures = []
    near = ", beside the firing's database work" if args.beside_firing else ""
    if "spread" in cases:
        with beside(1000):
            p99, _ = case("spread", 1000, w, partitions=n, pin=args.pin)
        figures.append((f"one hop, 1,000/s spread{near}", p99, 25))
    if "aligned" in cases:
        with beside(1):
            p99, from_instant = case("aligned", 1000, w, aligned=True, partitions=n, pin=args.pin)
        figures.append((f"one hop, 1,000/s aligned{near}", p99, 25))
        figures.append((f"one hop, 1,000/s aligned, from the instant{near}", from_instant, 25))
    if "two-hops" in cases:
        figures.append(
            ("two hops, 200/s spread", case("two hops", 200, w, hops=2, partitions=n)[0], 50)
        )
    if "herd" in cases:
        t = args.tenants
        say(
            f"herd: {t:,} run and {t:,} queue topics of 1 partition, a firing every {HERD_EVERY_S} s"
        )
        k = max(1, args.shards)
        c = max(1, args.consumers)
        say(f"herd: {k} producer(s) in each producing stage, {c} consumer(s) in the forwarder")
        p99, _ = case(
            "herd", t, w, aligned=True, hops=2, partitions=1, topics=t, every_s=HERD_EVERY_S,
            shards=k, consumers=c,
        )  # fmt: skip
        figures.append((f"two hops, a herd of {t:,} tenants", p99, 0))
    say(f"machine after: {machine_load()}")
    for label, p99, target in figures:
        aim = f" (cronwheel's target on this path: <= {target} ms)" if target else ""
        say(f"RESULT floor {label}: p99 {p99:.1f} ms{aim}")


if __name__ == "__main__":
    main()
