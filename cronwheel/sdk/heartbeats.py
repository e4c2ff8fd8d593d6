"""Heartbeats for every run a worker holds, from one thread: about three per
lease, each when due. (A thread per run cost more than the beats of a short
handler, which mostly needs none.)"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time

from cronwheel.sdk.api import WorkerApi

log = logging.getLogger("cronwheel.sdk")


class Heartbeats:
    def __init__(self, api: WorkerApi):
        self._api = api
        self._cond = threading.Condition()
        self._due: list[tuple[float, int, object]] = []  # (when, seq, run)
        self._held: set[int] = set()  # id() of runs still beating
        self._seq = itertools.count()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, daemon=True, name="cronwheel-beat")
        self._thread.start()

    @staticmethod
    def interval(run) -> float:
        return max(0.05, run.lease_ms / 3000)

    def hold(self, run) -> None:
        with self._cond:
            self._held.add(id(run))
            heapq.heappush(self._due, (time.monotonic() + self.interval(run), next(self._seq), run))
            self._cond.notify()

    def release(self, run) -> None:
        with self._cond:
            self._held.discard(id(run))

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()

    def _next(self):
        """The next run due to beat, waiting until it is due; None when closed."""
        with self._cond:
            while not self._closed:
                while self._due and id(self._due[0][2]) not in self._held:
                    heapq.heappop(self._due)  # released
                if not self._due:
                    self._cond.wait()
                    continue
                wait = self._due[0][0] - time.monotonic()
                if wait > 0:
                    self._cond.wait(wait)
                    continue
                return heapq.heappop(self._due)[2]
            return None

    def _loop(self) -> None:
        while (run := self._next()) is not None:
            try:
                resp = self._api.heartbeat(run.run_id, run.attempt, run.start_token)
                lost = resp.status_code == 409
            except Exception as e:  # network, 429, 5xx: the next beat may get through
                log.warning("heartbeat of %s failed: %s", run.run_id, e)
                lost = False
            with self._cond:
                if lost:
                    self._held.discard(id(run))
                    run.lost.set()
                elif id(run) in self._held:
                    when = time.monotonic() + self.interval(run)
                    heapq.heappush(self._due, (when, next(self._seq), run))
