"""Tenants: what a new tenant's first run costs in punctuality, and what idle
tenants cost the platform.

`--first-run` (the default case): timer, relay and dispatcher run as
processes, and a gateway. Tenants are created one at a time (`--tenants`,
one every `--pace-ms`), each with a one-off queue job due `--due-ms` after
its tenant's creation answered, as a user makes them: POST /v1/tenants, then
POST /v1/jobs (`--via store`: through the store calls the API makes,
create_tenant and Jobs.create, in this process, with no gateway); what each
POST took is printed. A run's lateness is its queue record's timestamp (the
dispatcher's produce()) minus its scheduled instant; the same for the run
topic's record (the relay's produce()). Printed: p50 / p99 / max of both, and
how many records arrived. `--beside N` first registers N tenants with a queue
job every minute each (at second i % 60: 50 runs a second at 3,000), waits
until their topics exist and each has fired once, then creates the
new tenants among them, and prints the runs of the N over the same seconds
beside the first runs: a new tenant on a platform that already holds
thousands, against the steady lateness of that platform. `--target webhook`:
the new tenants' jobs are webhook jobs, the webhook service runs too and
delivers to a local receiver (bench_webhook.Receiver); printed besides, each
first run's delivery (the receiver got it) minus its scheduled instant.
Then (unless `--no-again`) the same tenants each get a second one-off job,
at the same pace and due, measured the same way: the same path once every
topic is assigned and every cache warm, which is the steady p99 the first
runs are held to (`--target managed`: the run's start instead of delivery).

`--idle N[,N...]`: for each N, a fresh database and prefix with every
service but the gateway running (timer, relay, dispatcher, workflow, webhook,
executor); N tenants, each with a queue job firing every minute, made through
the store (create_tenant, Jobs.create_many). Once every tenant's run and queue
topics exist, the first minute boundary has passed (so every tenant's run
has gone through once: a topic's first record costs its producer and
consumer more than the next, and that is setup, not idling) and 5 s more,
`--window` seconds (180: three firings of every job, which all fire at the
top of the minute; with `--spread`, tenant i's at second i % 60 of every
minute instead; one firing's window, 60 s, gave the dispatcher's per-tenant
ratio anywhere from 1.01x to 1.92x for the same code, docs/dispatcher.md)
are measured: the broker's partitions (this prefix's and the whole
cluster's), its resident memory and, after the window, its heap in use
right after a full collection (`jcmd`: the resident memory is the JVM's
high mark, so it tells more of the runs before than of the tenants), and
every process's CPU, with what fired meanwhile
(~N runs a minute), and the dispatchers' CPU per thread name (librdkafka's
rdk:main, rdk:broker<N>; Python's threads are all `python`), and the offset
commits every consumer made, as records written to __consumer_offsets a
minute (one per partition a commit names), and the minute's herd: each
tenant's run of the window's last top of the minute (with `--spread`, each
tenant's last run before the window ended), due -> the relay's
produce() (its run-topic record's timestamp) and -> the dispatcher's (its
queue record's), p50 / p99 / max (the floor under it: `bench_kafka_floor.py
--case herd`). The cost per
tenant is (figure at N - figure at the smallest N) / (N - smallest N).
Each step first waits until the broker has removed the topics deleted
before it (a deleted topic's logs go `file.delete.delay.ms`, 60 s, later:
common.wait_deletions_done), so no step counts the last one's clean-up.
`--dispatchers K` runs K dispatcher instances, which share the tenants
through their leases.

`--restart N`: N tenants whose run topics each hold one waiting RunReady,
and then `cronwheel serve dispatcher` starts (as after a crash and the
supervisor's restart). Printed: the time from the process's start until the
first and until the last of the N runs is forwarded (recorded in the
`processed` table), so the cost of assigning N tenants' topics at start.

It prints figures and asserts nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time
import uuid
from pathlib import Path

import httpx
import psycopg
from bench_lifecycle import OPERATOR_KEY, Platform
from common import (
    Services,
    broker_live_heap_mb,
    broker_pauses,
    cpu_seconds,
    create_topics,
    delete_topics,
    describe,
    fresh_database,
    grant,
    header,
    in_a_pause,
    kafka_broker_pid,
    machine_load,
    observer_group,
    percentile,
    prefix_topics,
    say,
    thread_cpu,
    wait_deletions_done,
)
from confluent_kafka import OFFSET_BEGINNING, TopicPartition

from cronwheel import kafka
from cronwheel.core import events
from cronwheel.core.avro import default_registry
from cronwheel.core.clock import iso, now_ms
from cronwheel.kafka import Topics
from cronwheel.store.jobs import Jobs, create_tenant


def first_run(
    tenants: int,
    pace_ms: int,
    due_ms: int,
    beside: int = 0,
    target: str = "queue",
    again: bool = True,
    via: str = "api",
) -> None:
    """`beside`: that many tenants registered first, each with a queue job
    every minute at its own second (i % 60: 50 runs a second at 3,000), their
    topics made and each fired once, so the
    new tenants arrive on a platform that already holds them; their runs of
    the same minute are the steady p99 the first runs are set against.
    `target` "webhook": the new tenants' jobs are webhook jobs, delivered by
    the webhook service to a local receiver (bench_webhook.Receiver), and
    the lateness of the delivery is printed too; "managed": managed jobs
    (`true`, sandboxed), started by the executor, and the lateness of the
    run's start (its `started_at`, the database's clock on this host).
    `via` "api": tenants and jobs made through a gateway process; "store":
    by the store calls it makes, in this process (no topics made before the
    answer: CRONWHEEL_GATEWAY_MAKES_TOPICS)."""
    header(
        f"first runs of {tenants} new tenants, each {target} job due {due_ms} ms after its"
        " tenant" + (f", beside {beside} tenants with a job a minute each" if beside else "")
    )
    prefix = f"bt{uuid.uuid4().hex[:8]}"
    topics = Topics(prefix)
    if beside:
        wait_deletions_done()  # an earlier run's thousands of topics, removed while idle
    grant(prefix)
    second: tuple = ()
    names: tuple[str, ...] = ("timer", "relay", "dispatcher")
    receiver = None
    if target == "webhook":
        from bench_webhook import Receiver

        receiver = Receiver()
        os.environ["CRONWHEEL_WEBHOOK_ALLOW_CIDRS"] = "127.0.0.0/8"  # the receiver's address
        names += ("webhook",)
    elif target == "managed":
        names += ("executor",)
    try:
        with (
            fresh_database() as url,
            Services(url, prefix, names) as svc,
            psycopg.connect(url, autocommit=True) as conn,
            contextlib.ExitStack() as gateway,
        ):
            api = None
            if via == "api":
                gw = gateway.enter_context(Platform(url, prefix, ("gateway",), None))
                api = gateway.enter_context(httpx.Client(base_url=gw.base, timeout=30))
            old, made_s = _minutely_tenants(url, topics, svc, beside, True) if beside else ([], 0)
            if old:
                time.sleep(_fired_once_by(made_s, True) - time.time())
            say(f"load before: {machine_load()}")
            maker = _ThroughStore(conn, topics) if via == "store" else _ThroughApi(api)
            say(f"tenants and jobs made through the {via}")
            started_s = time.time()
            body = {"name": "first", "target": _target(target, receiver)}
            made = _one_offs(maker, body, due_ms, pace_ms, [None] * tenants)
            if api is not None:
                maker.say_took(f"{tenants} new tenants' first runs, ")
            dest = {
                "webhook": topics.webhook,
                "managed": topics.managed,
            }.get(target, lambda t: topics.queue(t, "q"))
            first = _outcome(url, topics, made, due_ms, dest, receiver, target)
            queue_late, relay_late, delivered, _runs, _hops = first
            if again:
                # The same tenants again, at the same pace and due: their
                # topics assigned and every cache warm, so the same path's
                # steady lateness, measured the same way.
                body["name"] = "again"
                again_made = _one_offs(maker, body, due_ms, pace_ms, [t for t, _at in made])
                if api is not None:
                    maker.say_took("the same tenants' second runs, ")
                second = _outcome(url, topics, again_made, due_ms, dest, receiver, target)
            steady: list[float] = []
            if old:
                # The runs of the tenants beside, over the same seconds: each
                # one's firing in the minute before now, if it came after the
                # first new tenant.
                now_s = int(time.time()) - 1
                fired = {
                    t["tenant_id"]: at
                    for i, t in enumerate(old)
                    if (at := _last_firing(i, True, now_s)) >= 1000 * started_s
                }
                steady, _runs = _herd(topics, fired)
            svc.check_alive()
    finally:
        if receiver is not None:
            receiver.close()
        if mine := prefix_topics(prefix):
            delete_topics(mine)
    _print_outcome(f"{tenants} new tenants' first runs, ", receiver, target, *first[:3], first[4])
    if old:
        say(
            f"the {len(steady)} runs of the tenants beside over the same seconds,"
            f" due -> dispatcher produce() (ms): {describe(steady) if steady else 'none'}"
        )
    if second:
        _print_outcome("the same tenants' second runs, ", receiver, target, *second[:3], second[4])
    late = delivered if target != "queue" else queue_late
    if second:  # the same path's steady runs: the target the issue sets
        steady = second[2] if target != "queue" else second[0]
    goal = f"the steady p99, {_p99(steady)} ms" if steady else "the steady p99"
    say(f"RESULT first-run lateness ({target}) p99 {_p99(late)} ms (target: {goal})")


def _print_outcome(
    what: str, receiver, target: str, queue_late, relay_late, delivered, hops
) -> None:
    say(f"{what}{target} records {len(queue_late)}; run-topic records {len(relay_late)}")
    say(f"{what}due -> relay produce() (ms): {describe(relay_late)}")
    say(f"{what}due -> dispatcher produce() (ms): {describe(queue_late)}")
    say(f"{what}the slowest forwards (ms): {_slowest_hops(hops)}")
    if receiver is not None:
        say(f"{what}due -> the receiver got the webhook (ms): {describe(delivered)}")
    elif target == "managed":
        say(f"{what}due -> the executor started the run (ms): {describe(delivered)}")
    # Which runs were slow (the earliest tenants'?): always for a few,
    # on request (CW_BENCH_EACH=1) for more.
    if len(queue_late) <= 20 or os.environ.get("CW_BENCH_EACH") == "1":
        for name, values in (("forwarded", queue_late), ("delivered/started", delivered)):
            if values:  # a run missing shifts the rest: said so
                each = " ".join(f"{v:.0f}" for v in values)
                gaps = (
                    "" if len(values) == len(queue_late) == len(relay_late) else " (runs missing)"
                )
                say(f"{what}{name}, each in the tenants' order{gaps} (ms): {each}")


def _slowest_hops(hops: list[tuple[float, float, float]], n: int = 5) -> str:
    """The `n` slowest forwards (due -> the dispatcher's produce()), each
    marked where the broker's collector stopped it between the relay's
    produce() and the dispatcher's: a slow forward the broker's pause
    explains rather than the dispatcher; and how often the broker paused
    over the phase. `hops`: (lateness, the relay's produce() ms, the
    dispatcher's produce() ms)."""
    if not hops:
        return "none"
    pauses = broker_pauses(min(h[1] for h in hops), max(h[2] for h in hops))
    if pauses is None:
        return " ".join(f"{late:.0f}" for late, _s, _r in sorted(hops)[-n:][::-1]) + (
            " (no collector log: not the local stack's broker)"
        )
    paused = sum(in_a_pause(pauses, sent, read) for _l, sent, read in hops)
    slowest = ", ".join(
        f"{late:.0f}" + (" (broker paused)" if in_a_pause(pauses, sent, read) else "")
        for late, sent, read in sorted(hops)[-n:][::-1]
    )
    span_s = (max(h[2] for h in hops) - min(h[1] for h in hops)) / 1000
    return (
        f"{slowest}; {paused} of {len(hops)} forwards had a broker pause in flight;"
        f" the broker paused {len(pauses)} times ({sum(ms for _s, ms in pauses):.0f} ms)"
        f" over these {span_s:.0f} s"
    )


class _ThroughStore:
    """Tenants and jobs made by the store calls the API makes, in this process."""

    def __init__(self, conn, topics: Topics):
        self.conn, self.jobs = conn, Jobs(topics)

    def tenant(self, name: str) -> dict:
        return create_tenant(self.conn, name)

    def job(self, tenant: dict, body: dict) -> None:
        with self.conn.transaction():
            self.jobs.create(self.conn, tenant, body, now_ms())


class _ThroughApi:
    """Tenants and jobs made as a user makes them: POST /v1/tenants (operator),
    POST /v1/jobs (the tenant's key), answered by a gateway process."""

    def __init__(self, client: httpx.Client):
        self.client = client
        self.took: dict[str, list[float]] = {"tenant": [], "job": []}  # ms per call

    def tenant(self, name: str) -> dict:
        return self._call("tenant", "/v1/tenants", {"name": name}, OPERATOR_KEY)

    def job(self, tenant: dict, body: dict) -> None:
        self._call("job", "/v1/jobs", body, tenant["api_key"])

    def _call(self, kind: str, path: str, body: dict, key: str) -> dict:
        start = time.perf_counter()
        r = self.client.post(path, json=body, headers=_bearer(key))
        r.raise_for_status()
        self.took[kind].append((time.perf_counter() - start) * 1000)
        return r.json()

    def say_took(self, what: str) -> None:
        for kind, took in self.took.items():
            if took:
                say(f"{what}POST for each {kind} took (ms): {describe(took)}")
            took.clear()


def _bearer(key: str) -> dict:
    return {"Authorization": f"Bearer {key}"}


def _one_offs(
    maker, body: dict, due_ms: int, pace_ms: int, tenants: list[dict | None]
) -> list[tuple[dict, int]]:
    """One one-off job each, due `due_ms` after the tenant was made (or, for
    a tenant made before, after the job is sent), one every `pace_ms`; a
    None tenant is created first (the new tenant). Returns (tenant,
    scheduled_ms) in order."""
    made = []
    for i, t in enumerate(tenants):
        if t is None:
            t = maker.tenant(f"new-{i}")
        at = now_ms() + due_ms
        maker.job(t, body | {"schedule": {"at": iso(at)}})
        made.append((t, at))
        time.sleep(pace_ms / 1000)  # the pace of tenant creation, not a wait
    return made


def _outcome(url, topics, made, due_ms, dest, receiver, target):
    """The runs of `made` (tenant, scheduled_ms): lateness on the destination
    topic, on the run topic, and delivered or started (empty for queue jobs),
    and the destination records' runs."""
    ids = [(t["tenant_id"], at) for t, at in made]
    queue_late, relay_late, runs, hops = _read(topics, ids, due_ms / 1000 + 30, dest)
    delivered: list[float] = []
    if receiver is not None:
        delivered = _delivered(receiver, runs, timeout_s=30)
    elif target == "managed":
        delivered = _started(url, runs, timeout_s=30)
    return queue_late, relay_late, delivered, runs, hops


def idle(counts: list[int], window_s: int, dispatchers: int = 1, spread: bool = False) -> None:
    rows = []
    when = "at a second of its own" if spread else "at the top of"
    for n in counts:
        header(f"idle cost: {n} tenants, each with a queue job {when} every minute")
        rows.append(_idle_once(n, window_s, dispatchers, spread))
    base = rows[0]
    say(
        "tenants | prefix partitions | cluster partitions | broker RSS MB | broker heap MB"
        " | broker CPU % | services CPU % | dispatcher CPU %"
    )
    for r in rows:
        say(
            f"{r['tenants']:>7} | {r['partitions']:>17} | {r['cluster_partitions']:>18} |"
            f" {r['broker_rss_mb']:>13.0f} | {_mb(r['broker_heap_mb']):>14} | {r['broker_cpu']:>12.1f}"
            f" | {r['services_cpu']:>14.1f}"
            f" | {r['dispatcher_cpu']:>16.1f}"
        )
    slopes = []
    for r in rows[1:]:
        extra = r["tenants"] - base["tenants"]
        slope = {
            k: None if r[k] is None or base[k] is None else (r[k] - base[k]) / extra
            for k in FIGURES
        }
        slopes.append((r["tenants"], slope))
        say(
            f"per extra tenant ({base['tenants']} -> {r['tenants']}):"
            f" {slope['partitions']:.1f} partitions,"
            f" {_mb(slope['broker_heap_mb'], 1000)} KB of the broker's heap after a full collection,"
            f" {1000 * slope['broker_cpu']:.2f} m% broker CPU,"
            f" {1000 * slope['services_cpu']:.2f} m% services CPU"
            f" ({1000 * slope['dispatcher_cpu']:.2f} m% the dispatcher's)"
        )
    # Flat: the cost per tenant at the largest count against the first step's
    # (issue 21: within 20%). At small steps the CPU figures are mostly noise.
    if len(slopes) > 1:
        (first_n, first), (last_n, last) = slopes[0], slopes[-1]
        say(
            f"per-tenant cost at {last_n} over that at {first_n}: "
            + ", ".join(
                f"{k} {last[k] / first[k]:.2f}" if first[k] and last[k] is not None else f"{k} n/a"
                for k in FIGURES
            )
        )


# The broker's resident memory is left out: it is the JVM's high mark
# (grown towards -Xmx by earlier work and never given back), so its growth
# per tenant says nothing of the tenants; its heap after a full collection does.
FIGURES = (
    "partitions",
    "broker_heap_mb",
    "broker_cpu",
    "services_cpu",
    "dispatcher_cpu",
)


SERVICES = ("timer", "relay", "dispatcher", "workflow", "webhook", "executor")


def _idle_once(n: int, window_s: int, dispatchers: int, spread: bool) -> dict:
    """One measurement; its topics are deleted however it ends (thousands of
    tenants' topics left behind exhausted the broker's open files)."""
    prefix = f"bi{uuid.uuid4().hex[:8]}"
    wait_deletions_done()  # the last step's topics, removed while idle
    grant(prefix)
    try:
        return _measure_idle(prefix, n, window_s, dispatchers, spread)
    finally:
        if mine := prefix_topics(prefix):
            delete_topics(mine)


def _second(i: int, spread: bool) -> int:
    """The second of every minute tenant i's job fires at."""
    return i % 60 if spread else 0


def _cron(i: int, spread: bool) -> str:
    """Tenant i's schedule: every minute at its top, or at its own second."""
    return f"{_second(i, spread)} * * * * *" if spread else "* * * * *"


def _last_firing(i: int, spread: bool, before_s: int) -> int:
    """Tenant i's last instant (epoch ms) strictly before `before_s`."""
    second = _second(i, spread)
    return ((before_s - 1 - second) // 60 * 60 + second) * 1000


def _fired_once_by(made_s: float, spread: bool) -> float:
    """When every job made by `made_s` has fired once, and 5 s more: at the
    top of the minute, the first minute boundary from now (their topics
    exist by now); at a second each, a whole minute after the last was made
    (one made at :58 whose second is :57 fires 59 s later)."""
    now = time.time()
    return max(now, made_s + 60) + 5 if spread else now + 60 - now % 60 + 5


def _minutely_tenants(
    url: str, topics: Topics, svc: Services, n: int, spread: bool
) -> tuple[list, float]:
    """`n` tenants with a queue job every minute each (at its top, or with
    `spread` at second i % 60), made through the store; returned, with the
    time the last job was made, once the platform has made every one's run
    and queue topics."""
    jobs = Jobs(topics)
    t0 = time.monotonic()
    with psycopg.connect(url, autocommit=True) as conn:
        tenants = [create_tenant(conn, f"idle-{i}") for i in range(n)]
        for i, t in enumerate(tenants):
            body = {
                "name": "minutely",
                "schedule": {"cron": _cron(i, spread), "timezone": "UTC"},
                "target": {"type": "queue", "queue": "q"},
            }
            with conn.transaction():
                jobs.create_many(conn, t, [body], now_ms())
    made_s = time.time()
    wanted = {topics.runs(t["tenant_id"]) for t in tenants}
    wanted |= {topics.queue(t["tenant_id"], "q") for t in tenants}
    admin = kafka.admin(principal="observer")  # sees every topic of the prefix
    while True:
        present = set(admin.list_topics(timeout=30).topics)
        svc.check_alive()
        if wanted <= present:
            break
        if time.monotonic() - t0 > 600:
            say(f"only {len(wanted & present)} of {len(wanted)} topics after 600 s")
            break
        time.sleep(1)  # a poll of the broker's topic list, bounded above
    say(f"{n} tenants and their {len(wanted)} topics ready in {time.monotonic() - t0:.0f} s")
    return tenants, made_s


def _measure_idle(prefix: str, n: int, window_s: int, dispatchers: int, spread: bool) -> dict:
    topics = Topics(prefix)
    with (
        fresh_database() as url,
        Services(url, prefix, SERVICES + ("dispatcher",) * (dispatchers - 1)) as svc,
    ):
        tenants, made_s = _minutely_tenants(url, topics, svc, n, spread)
        admin = kafka.admin(principal="observer")  # sees every topic of the prefix
        # Every step's broker starts from a full collection (the heap measured
        # after the window forces one), so its resident memory is comparable.
        if broker := kafka_broker_pid():
            broker_live_heap_mb(broker)
        # Settling: every job has fired once (first produce and fetch of each
        # topic), and 5 s more.
        time.sleep(_fired_once_by(made_s, spread) - time.time())
        meta = admin.list_topics(timeout=30).topics
        partitions = sum(len(t.partitions) for name, t in meta.items() if name.startswith(prefix))
        # The whole broker's partitions, other prefixes' and internal topics
        # included: only the admin principal may see them all (an operator's
        # figure; the observer sees only granted prefixes).
        everything = kafka.admin(principal="admin").list_topics(timeout=30).topics
        cluster = sum(len(t.partitions) for t in everything.values())
        broker = kafka_broker_pid()
        before = svc.cpu()
        b0 = cpu_seconds(broker) if broker else 0.0
        dispatchers = [
            pid
            for name, pid in svc.pids.items()
            if name.startswith("dispatcher") and "-pg" not in name
        ]
        threads0 = thread_cpu(dispatchers)
        commits0 = _offset_records()
        time.sleep(window_s)  # the measured window
        after = svc.cpu()
        b1 = cpu_seconds(broker) if broker else 0.0
        threads1 = thread_cpu(dispatchers)
        commits = _offset_records() - commits0
        # Each tenant's last run before now (less a second: the last second's
        # runs may not be forwarded yet), inside the window (window_s >= 60).
        now_s = int(time.time()) - 1
        fired = {t["tenant_id"]: _last_firing(i, spread, now_s) for i, t in enumerate(tenants)}
        queue_late, relay_late = _herd(topics, fired)
        used = {k: 100 * (after[k] - before.get(k, 0.0)) / window_s for k in after}
        used.pop("kafka-broker(shared)", None)
        used.pop("bench-reader", None)
        say("CPU % per process: " + ", ".join(f"{k} {v:.1f}" for k, v in sorted(used.items())))
        per_thread = {k: 100 * (v - threads0.get(k, 0.0)) / window_s for k, v in threads1.items()}
        say(
            "dispatcher CPU % per thread: "
            + ", ".join(f"{k} {v:.1f}" for k, v in sorted(per_thread.items()) if v >= 0.05)
        )
        rss = _rss_mb(broker) if broker else 0.0
        heap = broker_live_heap_mb(broker) if broker else None
        row = {
            "tenants": n,
            "partitions": partitions,
            "cluster_partitions": cluster,
            "broker_rss_mb": rss,
            "broker_heap_mb": heap,
            "broker_cpu": 100 * (b1 - b0) / window_s,
            "services_cpu": sum(used.values()),
            "dispatcher_cpu": sum(
                v for k, v in used.items() if k.startswith("dispatcher") and "-pg" not in k
            ),
        }
        say(
            f"partitions {partitions} (cluster {cluster}), broker RSS {rss:.0f} MB,"
            f" its heap after a full collection {_mb(heap)} MB,"
            f" broker CPU {row['broker_cpu']:.1f}%, services CPU {row['services_cpu']:.1f}%,"
            f" offset commits {60 * commits / window_s:.0f} a minute"
        )
        say(
            f"the minute's {'runs' if spread else 'herd'} ({len(queue_late)}/{n} forwarded): due -> relay produce() (ms):"
            f" {describe(relay_late) if relay_late else 'none'}; due -> dispatcher produce() (ms):"
            f" {describe(queue_late) if queue_late else 'none'}"
        )
    return row


def _herd(topics: Topics, fired_ms: dict[str, int], timeout_s: float = 60.0):
    """The run fired at `fired_ms[tenant_id]` of each tenant, on its run topic
    and on its queue topic: each record's timestamp (the relay's, the
    dispatcher's produce()) minus that instant. Read from a few seconds before
    it, found by the records' timestamps."""
    c = kafka.consumer(observer_group(), principal="observer")
    decode = default_registry().decode
    wanted = {topics.queue(t, "q"): at for t, at in fired_ms.items()}
    wanted |= {topics.runs(t): at for t, at in fired_ms.items()}
    got: dict[str, float] = {}
    try:
        asked = [TopicPartition(name, 0, wanted[name] - 5000) for name in sorted(wanted)]
        starts = []
        for i in range(0, len(asked), 500):
            starts += c.offsets_for_times(asked[i : i + 500], timeout=30)
        c.assign([tp for tp in starts if tp.offset >= 0])
        deadline = time.monotonic() + timeout_s
        while len(got) < len(wanted) and time.monotonic() < deadline:
            for m in c.consume(1000, timeout=0.5):
                if m.error() is not None or m.topic() in got:
                    continue
                _n, d = decode(m.value())
                if d.get("scheduled_at") == wanted[m.topic()]:
                    got[m.topic()] = m.timestamp()[1] - wanted[m.topic()]
    finally:
        c.close()
    queue = [v for k, v in got.items() if ".q." in k]
    runs = [v for k, v in got.items() if ".runs." in k]
    return queue, runs


_asker = None  # kafka.asker, made when first needed


def _offset_records() -> int:
    """Records written to __consumer_offsets so far (the sum of its partitions'
    end offsets): every consumer's offset commits on the broker, one record per
    partition named, whichever consumer made them."""
    global _asker
    if _asker is None:  # one client for the run: each new one connects to the coordinator too
        _asker = kafka.asker(principal="admin", group="bench-tenants.ask")
    # The internal topic is the operator's to see.
    meta = _asker.list_topics("__consumer_offsets", timeout=30).topics["__consumer_offsets"]
    ends = kafka.end_offsets(_asker, [("__consumer_offsets", p) for p in meta.partitions], 30)
    return sum(end for end in ends.values() if end)


def restart(n: int) -> None:
    header(f"a dispatcher starting with {n} tenants, each with one run waiting")
    prefix = f"br{uuid.uuid4().hex[:8]}"
    topics = Topics(prefix)
    grant(prefix)
    try:
        with fresh_database() as url:
            with psycopg.connect(url, autocommit=True) as conn:
                tenants = [create_tenant(conn, f"waiting-{i}")["tenant_id"] for i in range(n)]
            # Run topics, and the queue topics their jobs' creation would have made.
            names = [topics.runs(t) for t in tenants]
            queues = [topics.queue(t, "q") for t in tenants]
            # Created by the dispatcher's principal; the runs written by the relay's.
            create_topics(names)
            create_topics(queues, partitions=kafka.QUEUE_PARTITIONS)
            producer = kafka.producer(principal="relay")
            for t in tenants:
                value = events.run_ready(
                    run_id=f"run-{t}",
                    tenant_id=t,
                    partition_id=0,
                    attempt=1,
                    scheduled_ms=now_ms(),
                    created_ms=now_ms(),
                    priority="normal",
                    target={"type": "queue", "queue": "q"},
                    payload="null",
                )
                producer.produce(topics.runs(t), key=f"run-{t}".encode(), value=value)
            producer.flush(60)
            say(f"load before: {machine_load()}")
            with (
                psycopg.connect(url, autocommit=True) as conn,
                Services(url, prefix, ("dispatcher",)) as svc,
            ):
                t0 = time.monotonic()
                first = None
                while True:
                    done = conn.execute(
                        "SELECT count(*) FROM processed WHERE consumer = 'dispatcher'"
                    ).fetchone()[0]
                    if done and first is None:
                        first = time.monotonic() - t0
                    if done >= n or time.monotonic() - t0 > 600:
                        break
                    svc.check_alive()
                    time.sleep(0.05)  # a poll of the processed table, bounded above
                last = time.monotonic() - t0
        say(f"forwarded {done} of {n}: first after {first or 0:.1f} s, last after {last:.1f} s")
        say(
            f"RESULT dispatcher start with {n} tenants: every waiting run forwarded in {last:.1f} s"
        )
    finally:
        if mine := prefix_topics(prefix):
            delete_topics(mine)


def _mb(value: float | None, scale: float = 1.0) -> str:
    """A memory figure, or n/a where the broker's heap could not be read."""
    return "n/a" if value is None else f"{scale * value:.0f}"


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _p99(values: list[float]) -> str:
    return f"{percentile(values, 99):.0f}" if values else "n/a"


def _read(topics: Topics, made: list[tuple[str, int]], timeout_s: float, dest):
    """Each tenant's first record on its destination topic (`dest(tenant)`)
    and on its run topic scheduled at or after the instant in `made`
    (an earlier pass's runs are passed over): their timestamps minus the
    scheduled instant; and the destination records' (run id, scheduled
    instant) by topic; and each forward as (its lateness, the run topic
    record's timestamp, the destination record's), in ms."""
    c = kafka.consumer(observer_group(), principal="observer")
    decode = default_registry().decode
    wanted = {dest(t): at for t, at in made} | {topics.runs(t): at for t, at in made}
    got: dict[str, float] = {}
    stamps: dict[str, int] = {}
    runs: dict[str, tuple[str, int]] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while len(got) < len(wanted) and time.monotonic() < deadline:
            meta = c.list_topics(timeout=10).topics
            parts = [
                TopicPartition(name, p, OFFSET_BEGINNING)
                for name in wanted
                if name not in got and name in meta
                for p in meta[name].partitions
            ]
            if not parts:
                time.sleep(0.2)  # the topics are not there yet: asked again
                continue
            c.assign(parts)
            end = time.monotonic() + 2
            while time.monotonic() < end:
                for m in c.consume(500, timeout=0.2):
                    if m.error() is None and m.topic() not in got:
                        _n, d = decode(m.value())
                        if d.get("scheduled_at", -1) < wanted[m.topic()]:
                            continue  # an earlier pass's run, or not a run's record
                        stamps[m.topic()] = m.timestamp()[1]
                        got[m.topic()] = stamps[m.topic()] - d["scheduled_at"]
                        runs[m.topic()] = (d["run_id"], d["scheduled_at"])
    finally:
        c.close()
    # In the tenants' order (`made`'s), not the order they were read in.
    forwarded = [got[dest(t)] for t, _at in made if dest(t) in got]
    fired = [got[topics.runs(t)] for t, _at in made if topics.runs(t) in got]
    hops = [
        (got[dest(t)], stamps[topics.runs(t)], stamps[dest(t)])
        for t, _at in made
        if dest(t) in got and topics.runs(t) in got
    ]
    runs_by_dest = {dest(t): runs[dest(t)] for t, _at in made if dest(t) in runs}
    return forwarded, fired, runs_by_dest, hops


def _target(target: str, receiver) -> dict:
    if target == "webhook":
        return {"type": "webhook", "url": f"http://127.0.0.1:{receiver.port}/h"}
    if target == "managed":
        return {"type": "managed", "command": ["true"]}
    return {"type": "queue", "queue": "q"}


def _started(url: str, runs: dict[str, tuple[str, int]], timeout_s: float) -> list[float]:
    """When the executor started each run (`started_at`), minus its scheduled
    instant (ms), polled until all started or `timeout_s` passed."""
    ids = [r for r, _at in runs.values()]
    deadline = time.monotonic() + timeout_s
    with psycopg.connect(url, autocommit=True) as conn:
        while True:
            started = dict(
                conn.execute(
                    "SELECT run_id, (extract(epoch FROM started_at) * 1000)::bigint"
                    " FROM runs_daily WHERE run_id::text = ANY(%s) AND started_at IS NOT NULL",
                    [ids],
                ).fetchall()
            )
            if len(started) == len(ids) or time.monotonic() > deadline:
                break
            time.sleep(0.5)  # a poll of the database, bounded by the deadline
    return [started[r] - at for r, at in runs.values() if r in started]


def _delivered(receiver, runs: dict[str, tuple[str, int]], timeout_s: float) -> list[float]:
    """When the receiver got each run's webhook, minus its scheduled instant
    (ms), polled until all came or `timeout_s` passed."""
    deadline = time.monotonic() + timeout_s
    while True:
        receiver.collect()
        if all(r in receiver.arrived for r, _at in runs.values()):
            break
        if time.monotonic() > deadline:
            break
        time.sleep(0.5)  # a poll of the receiver, bounded by the deadline
    return [1000 * receiver.arrived[r] - at for r, at in runs.values() if r in receiver.arrived]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tenants", type=int, default=20)
    ap.add_argument("--pace-ms", type=int, default=500)
    ap.add_argument("--due-ms", type=int, default=3000)
    ap.add_argument(
        "--target",
        choices=("queue", "webhook", "managed"),
        default="queue",
        help="the new tenants' jobs' target (first-run case)",
    )
    ap.add_argument(
        "--beside",
        type=int,
        default=0,
        help="first runs: tenants with a job a minute each, registered first",
    )
    ap.add_argument(
        "--again",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="first runs: then the same tenants' second runs, the same way (the steady p99)",
    )
    ap.add_argument(
        "--via",
        choices=("api", "store"),
        default="api",
        help="first runs: tenants and jobs made through a gateway, or by its store calls here",
    )
    ap.add_argument("--idle", help="tenant counts, comma-separated: the idle-cost case")
    ap.add_argument("--window", type=int, default=180, help="seconds measured (--idle)")
    ap.add_argument("--dispatchers", type=int, default=1, help="dispatcher instances (--idle)")
    ap.add_argument(
        "--spread", action="store_true", help="--idle: jobs at a second each, not all at :00"
    )
    ap.add_argument("--restart", type=int, help="tenants: the dispatcher-start case")
    args = ap.parse_args()
    if args.restart:
        restart(args.restart)
        return
    if args.idle:
        idle(
            [int(x) for x in args.idle.split(",")],
            args.window,
            max(1, args.dispatchers),
            args.spread,
        )
        return
    if min(args.tenants, args.pace_ms, args.due_ms) < 1 or args.beside < 0:
        ap.error("--tenants, --pace-ms and --due-ms must be at least 1, --beside at least 0")
    first_run(
        args.tenants, args.pace_ms, args.due_ms, args.beside, args.target, args.again, args.via
    )


if __name__ == "__main__":
    main()
