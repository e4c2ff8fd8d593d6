"""A job's runs across two cells while a move takes its tenant from one to the
other (tests/e2e/cells/test_move.py, tests/e2e/cells/test_workers_follow.py):
what each cell's database held at any time, since the move deletes the
source's rows, and the check that every instant has exactly one run."""

from __future__ import annotations

import threading

import psycopg

from cronwheel.core.clock import to_ms


def runs_of(url: str, job_id: str) -> dict[str, tuple[int, int]]:
    """run_id -> (scheduled_at, created_at), in ms, in the database at `url`."""
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT run_id, scheduled_at, created_at FROM runs_daily WHERE job_id = %s", [job_id]
        ).fetchall()
    return {r[0]: (to_ms(r[1]), to_ms(r[2])) for r in rows}


class RunsSeen:
    """Every run of `job_id` each cell's database (`urls`: cell -> URL) held
    while the block runs, polled every 100 ms in a thread."""

    def __init__(self, urls: dict[str, str], job_id: str):
        self.urls = urls
        self.job_id = job_id
        self.seen: dict[str, dict[str, tuple[int, int]]] = {cell: {} for cell in urls}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True, name="runs-seen")

    def __enter__(self) -> RunsSeen:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(10)

    def _watch(self) -> None:
        while not self._stop.is_set():
            for cell, url in self.urls.items():
                self.seen[cell].update(runs_of(url, self.job_id))
            self._stop.wait(0.1)


def assert_each_instant_once(runs: dict[str, tuple[int, int]], every_ms: int) -> None:
    """Across `runs` (run_id -> (instant, created)): no instant with two runs,
    and none missing between the first and the last (`every_ms` apart)."""
    by_instant: dict[int, set[str]] = {}
    for run_id, (instant, _) in runs.items():
        by_instant.setdefault(instant, set()).add(run_id)
    assert all(len(ids) == 1 for ids in by_instant.values()), "an instant fired twice"
    instants = sorted(by_instant)
    gaps = [b - a for a, b in zip(instants, instants[1:], strict=False)]
    assert gaps == [every_ms] * len(gaps), f"an instant is missing: gaps {sorted(set(gaps))}"
