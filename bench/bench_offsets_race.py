"""The race that crashed the dispatcher with SIGSEGV (issue 21), reproduced:
librdkafka's admin ListOffsets (confluent-kafka's AdminClient.list_offsets)
looks up the partitions' leaders on the caller's thread; when one is not in
the client's metadata cache it registers the request to be run again on the
next metadata change, and a metadata answer arriving before the caller's
thread is done with it runs it on librdkafka's main thread at the same time.
The main thread can finish it and clear what the caller's thread then locks
(SIGSEGV in rd_kafka_topic_partition_list_query_leaders_async_worker, a NULL
mutex). `kafka.end_offsets` asks through a consumer's offsets_for_times
instead, whose leader lookup stays on the caller's thread.

Each way runs in `--procs` child processes at once (two cores: the threads
get preempted inside the window), each making `--clients` clients in turn;
each new client is connected and knows one topic, then asks the end offsets
of `--topics` topics of one partition in chunks of `--chunk` (the dozing
sweep's shape: its client had not seen the tenants' new topics). Printed per
way: the children killed by a signal, and the asks made before.

    python bench/bench_offsets_race.py [--ways list_offsets,end_offsets]

Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import time
from pathlib import Path

from common import delete_topics, header, machine_load, make_run_topics, say

from cronwheel import kafka

HERE = Path(__file__).resolve().parent


def _admin_list_offsets(client, keys, chunk: int) -> None:
    """The way the platform asked before: every chunk sent, then every answer waited for."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import OffsetSpec

    futures = {}
    for start in range(0, len(keys), chunk):
        specs = {TopicPartition(t, p): OffsetSpec.latest() for t, p in keys[start : start + chunk]}
        futures.update(client.list_offsets(specs, request_timeout=10))
    for f in futures.values():
        f.result(timeout=20)


def child(way: str, topics: list[str], clients: int, chunk: int) -> None:
    prefix = topics[0].split(".")[0]
    keys = [(t, 0) for t in topics]
    for i in range(clients):
        if way == "list_offsets":
            client = kafka.admin(principal="dispatcher")
            client.list_topics(topic=topics[0], timeout=10)
            _admin_list_offsets(client, keys, chunk)
        else:
            client = kafka.asker(principal="dispatcher", group=f"{prefix}.dispatcher.ask")
            client.list_topics(topic=topics[0], timeout=10)
            kafka.end_offsets(client, keys, 20, chunk=chunk)
            client.close()
        print(i + 1, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topics", type=int, default=3000)
    parser.add_argument("--chunk", type=int, default=100)
    parser.add_argument("--clients", type=int, default=150, help="per child process")
    parser.add_argument("--procs", type=int, default=3)
    parser.add_argument("--ways", default="list_offsets,end_offsets")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--names", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, Path(args.names).read_text().split(), args.clients, args.chunk)
        return
    header("bench_offsets_race: librdkafka's ListOffsets leader-lookup race, each way")
    topics = make_run_topics(args.topics)
    names = Path(f"/tmp/bench_offsets_race.{topics[0].split('.')[0]}.txt")
    names.write_text("\n".join(topics))
    try:
        time.sleep(5)  # a topic just made answers NOT_LEADER for a few seconds
        for way in args.ways.split(","):
            t0 = time.monotonic()
            procs = [
                subprocess.Popen(
                    [
                        sys.executable,
                        __file__,
                        "--child",
                        way,
                        "--names",
                        str(names),
                        "--clients",
                        str(args.clients),
                        "--chunk",
                        str(args.chunk),
                    ],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL,
                    text=True,
                    cwd=HERE,
                )  # fmt: skip
                for _ in range(args.procs)
            ]
            ends = []
            for p in procs:
                out, _ = p.communicate()
                done = out.split()
                ends.append((p.returncode, int(done[-1]) if done else 0))
            killed = [(rc, n) for rc, n in ends if rc < 0]
            said = ", ".join(f"{signal.Signals(-rc).name} after {n} clients" for rc, n in killed)
            say(
                f"RESULT {way}: {len(killed)} of {args.procs} processes killed by a signal"
                f"{' (' + said + ')' if said else ''}; clients asked in all "
                f"{sum(n for _, n in ends)} of {args.procs * args.clients}, "
                f"{args.topics} partitions each in chunks of {args.chunk}, "
                f"{time.monotonic() - t0:.0f} s"
            )
        say(f"machine after: {machine_load()}")
    finally:
        names.unlink(missing_ok=True)
        delete_topics(topics)


if __name__ == "__main__":
    main()
