"""What one pass of the `processed` pruner costs (cronwheel.store.dispatch.Pruner):
`--rows` (60,000: a minute of a dispatcher forwarding 1,000 runs a second)
rows past the retention among `--kept` (500,000) recent ones, pruned in
bites of 5,000, ten bites a pass, as the dispatcher's and the workflow
service's pruners do. Printed: the pass's wall time and a bite's on average, the
median of `--rounds` (3), each on freshly inserted rows (a pass
takes at most ten bites: 50,000 rows). Before the pruner
had a thread of its own this was how long a pass held the service's loop
every minute (docs/dispatcher.md).

Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import time

import psycopg
from common import fresh_database, header, machine_load, say

from cronwheel.store.dispatch import Processed, Pruner

DAY_MS = 86_400_000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=60_000)
    parser.add_argument("--kept", type=int, default=500_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    header("bench_processed_prune: one pass of the processed pruner")
    passes, bites = [], []
    with fresh_database() as url, psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO processed (consumer, message_key, processed_at)"
            " SELECT 'dispatcher', 'kept-' || i, now() - i * interval '1 ms'"
            "   FROM generate_series(1, %s) i",
            [args.kept],
        )
        pruner = Pruner(Processed("dispatcher"), 7 * DAY_MS)
        for r in range(args.rounds):
            conn.execute(
                "INSERT INTO processed (consumer, message_key, processed_at)"
                " SELECT 'dispatcher', 'old-' || %s || '-' || i,"
                "        now() - interval '8 days' - i * interval '1 ms'"
                "   FROM generate_series(1, %s) i",
                [r, args.rows],
            )
            conn.execute("VACUUM ANALYZE processed")
            t0 = time.monotonic()
            n = pruner.run(conn, int(time.time() * 1000))
            passes.append((time.monotonic() - t0) * 1000)
            bites.append(passes[-1] / max(1, -(-n // 5_000)))
            say(f"round {r + 1}: {n} rows pruned in one pass, {passes[-1]:.0f} ms")
    say(
        f"RESULT a pass over {args.rows} rows past the retention:"
        f" median {statistics.median(passes):.0f} ms, about {statistics.median(bites):.0f} ms a bite"
    )
    say(f"load after: {machine_load()}")


if __name__ == "__main__":
    main()
