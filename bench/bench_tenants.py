"""Tenants: what a new tenant's first run costs in punctuality.

`--first-run` (the default case): timer, relay and dispatcher run as
processes. Tenants are created one at a time (`--tenants`, one every
`--pace-ms`), each with a one-off queue job due `--due-ms` after its tenant
was created, through the same store calls the API makes (create_tenant,
Jobs.create). A run's lateness is its queue record's timestamp (the
dispatcher's produce()) minus its scheduled instant; the same for the run
topic's record (the relay's produce()). Printed: p50 / p99 / max of both, and
how many records arrived.

It prints figures and asserts nothing.
"""

from __future__ import annotations

import argparse
import time
import uuid

import psycopg
from common import (
    Services,
    delete_topics,
    describe,
    fresh_database,
    header,
    machine_load,
    percentile,
    say,
)
from confluent_kafka import OFFSET_BEGINNING, TopicPartition

from cronwheel import kafka
from cronwheel.core.avro import default_registry
from cronwheel.core.clock import iso, now_ms
from cronwheel.kafka import Topics
from cronwheel.store.jobs import Jobs, create_tenant


def first_run(tenants: int, pace_ms: int, due_ms: int) -> None:
    header(f"first runs of {tenants} new tenants, each job due {due_ms} ms after its tenant")
    prefix = f"bt{uuid.uuid4().hex[:8]}"
    topics = Topics(prefix)
    made: list[tuple[str, int]] = []  # (tenant_id, scheduled_ms)
    with fresh_database() as url, Services(url, prefix, ("timer", "relay", "dispatcher")) as svc:
        say(f"load before: {machine_load()}")
        jobs = Jobs(topics)
        with psycopg.connect(url, autocommit=True) as conn:
            for i in range(tenants):
                t = create_tenant(conn, f"new-{i}")
                at = now_ms() + due_ms
                body = {
                    "name": "first",
                    "schedule": {"at": iso(at)},
                    "target": {"type": "queue", "queue": "q"},
                }
                with conn.transaction():
                    jobs.create(conn, t, body, now_ms())
                made.append((t["tenant_id"], at))
                time.sleep(pace_ms / 1000)  # the pace of tenant creation, not a wait
        queue_late, relay_late = _read(topics, made, timeout_s=due_ms / 1000 + 30)
        svc.check_alive()
    say(f"queue records {len(queue_late)}/{tenants}; run-topic records {len(relay_late)}")
    say(f"due -> relay produce() (ms): {describe(relay_late)}")
    say(f"due -> dispatcher produce() (ms): {describe(queue_late)}")
    delete_topics([topics.runs(t) for t, _ in made] + [topics.queue(t, "q") for t, _ in made])
    say(f"RESULT first-run lateness p99 {_p99(queue_late)} ms (target: the steady p99)")


def _p99(values: list[float]) -> str:
    return f"{percentile(values, 99):.0f}" if values else "n/a"


def _read(topics: Topics, made: list[tuple[str, int]], timeout_s: float):
    """Each tenant's first record on its queue topic and on its run topic:
    their timestamps minus the scheduled instant."""
    c = kafka.consumer(f"bench-{uuid.uuid4().hex[:8]}")
    decode = default_registry().decode
    wanted = {topics.queue(t, "q"): at for t, at in made} | {topics.runs(t): at for t, at in made}
    got: dict[str, float] = {}
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
                        got[m.topic()] = m.timestamp()[1] - d["scheduled_at"]
    finally:
        c.close()
    queue = [v for k, v in got.items() if ".q." in k]
    runs = [v for k, v in got.items() if ".runs." in k]
    return queue, runs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tenants", type=int, default=20)
    ap.add_argument("--pace-ms", type=int, default=500)
    ap.add_argument("--due-ms", type=int, default=3000)
    args = ap.parse_args()
    if min(args.tenants, args.pace_ms, args.due_ms) < 1:
        ap.error("--tenants, --pace-ms and --due-ms must be at least 1")
    first_run(args.tenants, args.pace_ms, args.due_ms)


if __name__ == "__main__":
    main()
