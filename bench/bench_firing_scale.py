"""Scale: the firing rate of a 10k storm with 10k jobs registered, and with 1M
registered (the other 990k due a day ahead). Target: the rate at 1M within 20%
of the rate at 10k.

The 1M database is built once and cloned for each storm; storms of the two
cases alternate, each in a fresh database, and the best of each case is
compared, so that the shared machine's changing load distorts the ratio less.
"""

from __future__ import annotations

import statistics
import time
import uuid

import psycopg
from common import (
    JobBatch,
    Reader,
    Services,
    bulk_jobs,
    check_like_create,
    create_tenants,
    database_name,
    delete_topics,
    fresh_database,
    grant,
    header,
    machine_load,
    now_ms,
    say,
    storm,
    vacuum_analyze,
)

from cronwheel.kafka import Topics

DUE = 10_000
IDLE = 990_000
TENANTS = 10
ROUNDS = 2
DAY_MS = 86_400_000
HOUR_MS = 3_600_000


def load_idle(url: str) -> None:
    """990k every_ms jobs of one day, created over the last hour: due 23-24 h ahead."""
    with psycopg.connect(url, autocommit=True) as conn:
        tenants = create_tenants(conn, TENANTS)
        t0 = time.monotonic()
        batch = JobBatch(IDLE, now_ms() - HOUR_MS, every_ms=DAY_MS, spread_ms=HOUR_MS, name="idle")
        seed = bulk_jobs(conn, tenants, batch)
        check_like_create(conn, Topics("bench"), tenants, batch, seed)
        loaded = time.monotonic() - t0
        vac = vacuum_analyze(url)
        size = conn.execute(
            "SELECT pg_size_pretty(pg_total_relation_size('jobs')),"
            " pg_size_pretty(pg_total_relation_size('timers'))"
        ).fetchone()
    say(
        f"setup: {IDLE:,} idle jobs loaded in {loaded:.0f} s, VACUUM ANALYZE {vac:.0f} s;"
        f" jobs {size[0]}, timers {size[1]} with their indexes"
    )


def one_storm(label: str, template: str | None) -> float:
    prefix = f"bench{uuid.uuid4().hex[:8]}"
    topics = Topics(prefix)
    grant(prefix)
    with fresh_database(template) as url:
        with psycopg.connect(url, autocommit=True) as conn:
            tenants = conn.execute("SELECT tenant_id FROM tenants ORDER BY name").fetchall()
            tenants = [{"tenant_id": t, "priority_classes": ["normal"]} for (t,) in tenants]
            if not tenants:
                tenants = create_tenants(conn, TENANTS)
            registered = conn.execute("SELECT count(*) FROM jobs").fetchone()[0] + DUE
        names = [topics.runs(t["tenant_id"]) for t in tenants]
        try:
            with Reader(names) as reader, Services(url, prefix) as services:
                r = storm(url, services, reader, tenants, topics, DUE)
        finally:
            delete_topics(names)
    say(f"{label}: {registered:,} jobs registered, {DUE:,} of them due at one instant")
    for line in r.lines(label):
        say(line)
    say(f"{label}: machine after: {machine_load()}")
    return r.rate


def main() -> None:
    header("bench_firing_scale: a 10k storm with 10k vs 1M jobs registered")
    say(
        f"setup: per storm a fresh database, {TENANTS} tenants, `cronwheel serve timer` and"
        " `cronwheel serve relay` as processes, a confluent-kafka reader in this process;"
        f" {ROUNDS} rounds alternating the two cases"
    )
    rates: dict[str, list[float]] = {"10k": [], "1M": []}
    with fresh_database() as big:
        load_idle(big)
        for i in range(1, ROUNDS + 1):
            rates["10k"].append(one_storm(f"10k registered #{i}", None))
            rates["1M"].append(one_storm(f"1M registered #{i}", database_name(big)))
    for case, rs in rates.items():
        say(
            f"{case} registered: runs/s per round {', '.join(f'{r:,.0f}' for r in rs)};"
            f" best {max(rs):,.0f}, median {statistics.median(rs):,.0f}"
        )
    ratio = max(rates["1M"]) / max(rates["10k"])
    say(
        f"RESULT scale: best {max(rates['1M']):,.0f} runs/s with 1M registered vs"
        f" {max(rates['10k']):,.0f} runs/s with 10k = {100 * ratio:.0f}%"
        f" (target >= 80%: {'met' if ratio >= 0.8 else 'MISSED'})"
    )


if __name__ == "__main__":
    main()
