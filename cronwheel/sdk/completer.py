"""Completions sent as group commits: one complete-batch request at a time, holding
whatever queued up while the previous one was in flight.

An idle completer sends a completion at once (no added latency); under load the
batches grow by themselves, so the per-request cost (HTTP, auth, a transaction)
is shared by many runs. A batch is capped at MAX_BATCH items and about
MAX_BYTES of JSON (the gateway refuses bodies over 512 KiB).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from cronwheel.sdk.api import MAX_BATCH, WorkerApi

log = logging.getLogger("cronwheel.sdk")

MAX_BYTES = 256 * 1024


class Completer:
    def __init__(self, api: WorkerApi, on_answer: Callable[[Any, int], None]):
        """`on_answer(tag, status)` is called for each completion once answered."""
        self._api = api
        self._on_answer = on_answer
        self._cond = threading.Condition()
        self._queue: list[tuple[Any, dict, int]] = []  # (tag, body, size estimate)
        self._in_flight = 0
        self._closed = False
        self._thread = threading.Thread(target=self._loop, daemon=True, name="cronwheel-complete")
        self._thread.start()

    def submit(self, tag: Any, body: dict) -> None:
        size = 200 + len(body.get("error") or "")
        if body.get("result") is not None:
            size += len(json.dumps(body["result"]))
        with self._cond:
            self._queue.append((tag, body, size))
            self._cond.notify()

    def pending(self) -> int:
        """Completions queued or in flight."""
        with self._cond:
            return len(self._queue) + self._in_flight

    def close(self, timeout: float) -> None:
        """Send what is queued (waiting up to `timeout`), then stop."""
        deadline = time.monotonic() + timeout
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            while (self._queue or self._in_flight) and time.monotonic() < deadline:
                self._cond.wait(max(0.0, deadline - time.monotonic()))
            if self._queue or self._in_flight:
                log.error("%d completions unsent at exit", len(self._queue) + self._in_flight)

    def _take(self) -> list[tuple[Any, dict, int]] | None:
        with self._cond:
            while not self._queue:
                if self._closed:
                    return None
                self._cond.wait()
            n, size = 0, 0
            for _tag, _body, s in self._queue[:MAX_BATCH]:
                if n and size + s > MAX_BYTES:
                    break
                n, size = n + 1, size + s
            batch, self._queue = self._queue[:n], self._queue[n:]
            self._in_flight = n
            return batch

    def _loop(self) -> None:
        while (batch := self._take()) is not None:
            try:
                answers = self._api.complete_many([body for _tag, body, _s in batch])
            except Exception as e:  # their leases will expire and the runs come back
                log.error("could not complete %d runs: %s", len(batch), e)
                answers = [(0, None)] * len(batch)
            for (tag, _body, _s), (status, _doc) in zip(batch, answers, strict=True):
                try:
                    self._on_answer(tag, status)
                except Exception:
                    log.exception("on_answer failed")
            with self._cond:
                self._in_flight = 0
                self._cond.notify_all()
