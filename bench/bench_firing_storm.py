"""Storm: 10k and then 50k one-off jobs due at one instant, measured from that
instant until every run's record is readable on Kafka and the outbox is empty.
Target: at least 5,000 runs/s end to end in the 50k storm."""

from __future__ import annotations

import uuid

import psycopg
from common import (
    Reader,
    Services,
    create_tenants,
    delete_topics,
    fresh_database,
    grant,
    header,
    machine_load,
    say,
    storm,
)

from cronwheel.kafka import Topics

SIZES = (10_000, 50_000)
TENANTS = 10
TARGET = 5_000


def main() -> None:
    header("bench_firing_storm: one-off jobs all due at one instant")
    prefix = f"bench{uuid.uuid4().hex[:8]}"
    topics = Topics(prefix)
    grant(prefix)
    with fresh_database() as url:
        with psycopg.connect(url, autocommit=True) as conn:
            tenants = create_tenants(conn, TENANTS)
        names = [topics.runs(t["tenant_id"]) for t in tenants]
        say(
            f"setup: fresh database, {TENANTS} tenants (one runs topic each, 8 partitions),"
            " `cronwheel serve timer` and `cronwheel serve relay` as processes with default"
            " batches, a confluent-kafka reader in this process; the 50k storm follows the"
            " 10k one in the same database"
        )
        try:
            with Reader(names) as reader, Services(url, prefix) as services:
                for n in SIZES:
                    r = storm(url, services, reader, tenants, topics, n)
                    for line in r.lines(f"storm {n // 1000}k"):
                        say(line)
                    say(f"storm {n // 1000}k: machine after: {machine_load()}")
            say(
                f"RESULT storm 50k: {r.rate:,.0f} runs/s end to end"
                f" (target >= {TARGET:,}: {'met' if r.rate >= TARGET else 'MISSED'})"
            )
        finally:
            delete_topics(names)


if __name__ == "__main__":
    main()
