"""Workers for a benchmark, as a process: every run readable on the given run
topics is started and completed (SUCCEEDED) through the worker protocol's
store calls, `Lifecycle.start_many` then `complete_many`, in batches of up to
32 gathered for at most 50 ms, as the gateway does for the SDK's batches (the
HTTP hop left out: it costs the database nothing).

A script rather than a function so that a benchmark can run it with an
earlier release's tree first on PYTHONPATH (bench_evolution_load's `expand`
case: the release still running while the next one's expand steps apply);
it uses only calls every release since v0.1.0 has. On SIGTERM it writes to
`--out`, as JSON, every completion ([run_id, scheduled_ms, completed_ms])
and the count of each refusal's kind.

    python bench/complete_runs.py --database-url URL --prefix P --out F TOPIC...
"""

from __future__ import annotations

import argparse
import json
import signal
import threading

from common import now_ms, observer_group, topics_ready
from confluent_kafka import OFFSET_BEGINNING, TopicPartition

from cronwheel import config, kafka
from cronwheel.core.avro import default_registry
from cronwheel.kafka import Topics
from cronwheel.store import db
from cronwheel.store.lifecycle import CompleteCall, Lifecycle, StartCall

BATCH = 32
WORKER_ID = "bench-completer"


def complete(url: str, prefix: str, names: list[str], stop: threading.Event) -> dict:
    consumer = kafka.consumer(observer_group("completer"), principal="observer")
    meta = topics_ready(consumer, names)
    consumer.assign(
        [TopicPartition(t, p, OFFSET_BEGINNING) for t in names for p in sorted(meta[t].partitions)]
    )
    conn = db.connect(config.role_url(url, config.PG_PLATFORM_USER))
    life, decode = Lifecycle(Topics(prefix)), default_registry().decode
    done: list[tuple[str, int, int]] = []
    refused: dict[str, int] = {}

    def refusal(e: Exception) -> None:
        refused[type(e).__name__] = refused.get(type(e).__name__, 0) + 1

    while not stop.is_set():
        records = [m for m in consumer.consume(num_messages=BATCH, timeout=0.05) if not m.error()]
        if not records:
            continue
        runs = [decode(m.value())[1] for m in records]
        calls = [StartCall(r["tenant_id"], r["run_id"], WORKER_ID, r["attempt"]) for r in runs]
        ends, which = [], []
        for run, got in zip(runs, life.start_many(conn, calls, now_ms()), strict=True):
            if isinstance(got, Exception):
                refusal(got)
                continue
            tenant, run_id = run["tenant_id"], run["run_id"]
            ends.append(
                CompleteCall(tenant, run_id, got["attempt"], got["start_token"], "SUCCEEDED")
            )
            which.append((run_id, run["scheduled_at"]))
        if ends:
            answers = life.complete_many(conn, ends, now_ms())
            for (run_id, at), got in zip(which, answers, strict=True):
                if isinstance(got, Exception):
                    refusal(got)
                else:
                    done.append((run_id, at, now_ms()))
    consumer.close()
    conn.close()
    return {"done": done, "refused": refused}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--database-url", required=True, help="the owner's URL (the platform role's is derived)"
    )
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("topics", nargs="+")
    args = parser.parse_args()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    got = complete(args.database_url, args.prefix, args.topics, stop)
    with open(args.out, "w") as f:
        json.dump(got, f)


if __name__ == "__main__":
    main()
