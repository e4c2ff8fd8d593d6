"""What the dispatcher's doze sweep pays to ask the end offsets of its dozing
partitions (issue 21): `kafka.end_offsets` over `--topics` (3,000) topics of
one partition, with the partitions in one request (`--chunks` 0: all) or in
requests of N. librdkafka matches a request's answer by comparing every
answered partition with every asked one, so one request costs the square of
its partitions. Printed per chunk size: this process's CPU per ask
(CLOCK_PROCESS_CPUTIME_ID: librdkafka's threads and Python's) and its wall
time, the median of `--asks` (9) asks, alternating the sizes.

Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import time

from common import delete_topics, header, machine_load, make_run_topics, say

from cronwheel import kafka


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topics", type=int, default=3000)
    parser.add_argument("--chunks", default="0,500", help="partitions per call; 0: all in one")
    parser.add_argument("--asks", type=int, default=9)
    args = parser.parse_args()
    header("bench_end_offsets: the doze sweep's ask for its partitions' end offsets")
    topics = make_run_topics(args.topics)
    try:
        prefix = topics[0].split(".")[0]
        asker = kafka.asker(principal="dispatcher", group=f"{prefix}.dispatcher.ask")
        keys = [(t, 0) for t in topics]
        chunks = [int(c) or len(keys) for c in args.chunks.split(",")]
        cpu: dict[int, list[float]] = {c: [] for c in chunks}
        wall: dict[int, list[float]] = {c: [] for c in chunks}
        # Outside the figures: the client's metadata, and the partitions' leaders
        # (a topic just made answers NOT_LEADER_FOR_PARTITION for a few seconds).
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            ends = kafka.end_offsets(asker, keys, 30)
            if all(v is not None for v in ends.values()):
                break
        else:
            say("some partitions never answered within 60 s; figures include their errors")
        for _ in range(args.asks):
            for c in chunks:
                c0, w0 = time.process_time(), time.monotonic()
                ends = kafka.end_offsets(asker, keys, 30, chunk=c)
                cpu[c].append(time.process_time() - c0)
                wall[c].append(time.monotonic() - w0)
                missing = sum(1 for v in ends.values() if v is None)
                if missing:
                    say(f"chunk {c}: {missing} partitions unanswered")
        for c in chunks:
            say(
                f"RESULT {args.topics} partitions in calls of {c}: "
                f"CPU {statistics.median(cpu[c]) * 1000:.0f} ms per ask, "
                f"wall {statistics.median(wall[c]) * 1000:.0f} ms (median of {args.asks})"
            )
        say(f"machine after: {machine_load()}")
    finally:
        delete_topics(topics)


if __name__ == "__main__":
    main()
