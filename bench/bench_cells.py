"""Two cells on this machine (issue 24; docs/cells.md, "Two cells on one
machine"): each cell's firing throughput alone and with the other cell firing
at the same time, and the router's added latency per request.

The stack is the two-cell one the e2e tests use (tests/support/cells.py): a
private home on private ports, `cronwheel up --cells us,eu` (a PostgreSQL and
a Kafka per cell, the directory on the default cluster), and per cell
`cronwheel serve --cell NAME gateway timer relay` as processes, the router in
front. About two minutes to bring up.

- Firing storms: --jobs (20,000) one-off jobs due at one instant in us alone,
  in eu alone, then in both at once (the same count each, the same instant),
  --rounds (2) times. Per cell: runs/s created by its timer (the due instant,
  or its first run if the timer fired ahead, to its last run's commit) and
  end to end (to its outbox empty: every record acknowledged by its broker).
  The jobs are written by SQL into the cell's database as bench/common.py
  writes them (bulk_jobs), for one tenant per cell made through the router.
- The router's added latency: GET /v1/tenant of an eu tenant, one request at
  a time on a kept-alive connection, --requests (2,000) after 200 warm-up,
  straight to eu's gateway and then through the router, --rounds times;
  p50 / p99 of each and the difference.

It prints figures and asserts nothing; the machine's load is printed beside
them (this machine is shared).

    .venv/bin/python -m bench.bench_cells [--jobs N] [--rounds N] [--requests N]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `python bench/bench_cells.py`, as `make bench` runs it
    sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
import psycopg  # noqa: E402

from bench.common import JobBatch, bulk_jobs, header, machine_load, percentile, say  # noqa: E402
from cronwheel.core.clock import now_ms, to_dt, to_ms  # noqa: E402
from tests.support.cells import ROUTER, new_tenant, two_cells  # noqa: E402

CELLS = ("us", "eu")
LEAD_MS = 3_000  # from the last insert's commit to the storm's instant
WARM_UP = 200


def _leased(url: str) -> bool:
    """Whether the cell's timer and relay each lease all 1024 partitions."""
    with psycopg.connect(url, autocommit=True) as conn:
        held = dict(
            conn.execute(
                "SELECT service, count(*) FROM partition_leases"
                " WHERE owner IS NOT NULL AND expires_at > now() GROUP BY service"
            ).fetchall()
        )
    return held.get("timer", 0) == 1024 and held.get("relay", 0) == 1024


def _wait(check, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not after {timeout:.0f} s")
        time.sleep(0.2)


def storm(urls: dict[str, str], tenants: dict[str, dict], cells: tuple[str, ...], jobs: int):
    """`jobs` one-off jobs due at one instant in each of `cells`; per cell
    (fired runs/s, end-to-end runs/s)."""
    # The inserts at 2k jobs/s or more (a loaded machine's pace), then the lead:
    # every cell's jobs are committed before the instant.
    due = now_ms() + jobs // 2 * len(cells) + LEAD_MS
    for cell in cells:
        with psycopg.connect(urls[cell], autocommit=True) as conn:
            bulk_jobs(conn, [tenants[cell]], JobBatch(jobs, now_ms(), at_ms=due, name="storm"))
            conn.execute("ANALYZE timers")
    if now_ms() > due - 500:
        say(f"warning: the inserts ended {now_ms() - (due - 500)} ms past due - 500 ms")
    ended: dict[str, int] = {}
    busy: set[str] = set()
    conns = {c: psycopg.connect(urls[c], autocommit=True) for c in cells}
    try:
        deadline = time.monotonic() + 300
        while len(ended) < len(cells):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the storm did not end in 300 s: ended {sorted(ended)}")
            for cell, conn in conns.items():
                # Cheap while the storm runs (the outbox has rows): the runs
                # are counted only when the outbox, busy before, is empty.
                if cell in ended:
                    continue
                if conn.execute("SELECT EXISTS (SELECT 1 FROM outbox)").fetchone()[0]:
                    busy.add(cell)
                    continue
                if cell not in busy:
                    continue
                made = conn.execute(
                    "SELECT count(*) FROM runs_daily WHERE scheduled_at = %s", [to_dt(due)]
                ).fetchone()[0]
                if made == jobs:
                    ended[cell] = now_ms()
            time.sleep(0.02)
        out = {}
        for cell, conn in conns.items():
            n, first, last = conn.execute(
                "SELECT count(*), min(created_at), max(created_at) FROM runs_daily"
                " WHERE scheduled_at = %s",
                [to_dt(due)],
            ).fetchone()
            if n != jobs:
                raise RuntimeError(f"cell {cell}: {n} runs for {jobs} due jobs")
            start = min(due, to_ms(first))
            out[cell] = (
                jobs / max(to_ms(last) - start, 1) * 1000,
                jobs / max(ended[cell] - start, 1) * 1000,
            )
        return out
    finally:
        for conn in conns.values():
            conn.close()


def latencies(base: str, key: str, n: int) -> list[float]:
    """ms per GET /v1/tenant, one at a time on one kept-alive connection."""
    out = []
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {key}"}) as client:
        for i in range(WARM_UP + n):
            t0 = time.perf_counter()
            answer = client.get("/v1/tenant")
            took = (time.perf_counter() - t0) * 1000
            if answer.status_code != 200:
                raise RuntimeError(f"{base}: {answer.status_code} {answer.text}")
            if i >= WARM_UP:
                out.append(took)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--requests", type=int, default=2_000)
    args = ap.parse_args()
    header("bench_cells: two cells on one machine")
    logs = Path(tempfile.mkdtemp(prefix="cw-bench-cells-"))
    t0 = time.monotonic()
    with two_cells(logs, ("gateway", "timer", "relay")) as st:
        urls = {c: st.cell(c)["admin_database_url"] for c in CELLS}
        for cell in CELLS:
            _wait(lambda c=cell: _leased(urls[c]), 120, f"cell {cell}'s timer and relay leases")
        say(
            f"setup: two cells up in {time.monotonic() - t0:.0f} s (gateway, timer, relay per"
            f" cell, the router); service logs in {logs}"
        )
        tenants = {c: new_tenant(c, "bench") for c in CELLS}
        for r in range(args.rounds):
            for cells in (("us",), ("eu",), CELLS):
                rates = storm(urls, tenants, cells, args.jobs)
                together = "together" if len(cells) > 1 else "alone"
                for cell, (fired, end) in rates.items():
                    say(
                        f"round {r} storm {args.jobs} {cell} {together}: fired {fired:,.0f} runs/s,"
                        f" end to end {end:,.0f} runs/s"
                    )
                if len(cells) > 1:
                    say(
                        f"round {r} storm both cells: {sum(f for f, _ in rates.values()):,.0f}"
                        f" runs/s fired, {sum(e for _, e in rates.values()):,.0f} end to end"
                    )
            say(f"round {r}: machine after: {machine_load()}")
        key = tenants["eu"]["api_key"]
        for r in range(args.rounds):
            direct = latencies(st.cell("eu")["api_url"], key, args.requests)
            routed = latencies(ROUTER, key, args.requests)
            d50, d99 = percentile(direct, 50), percentile(direct, 99)
            r50, r99 = percentile(routed, 50), percentile(routed, 99)
            say(
                f"round {r} router: {args.requests} GET /v1/tenant of an eu tenant; eu's gateway"
                f" direct p50 {d50:.2f} / p99 {d99:.1f} ms, through the router p50 {r50:.2f}"
                f" / p99 {r99:.1f} ms: added p50 {r50 - d50:.2f} / p99 {r99 - d99:.1f} ms"
            )
        say(f"machine at the end: {machine_load()}")


if __name__ == "__main__":
    main()
