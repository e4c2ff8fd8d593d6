"""The worker loop: consume a queue topic, StartRun, heartbeat while the handler
runs, CompleteRun with its outcome.

A record's offset is committed once StartRun answered (won, or refused because
another worker has it or it is stale): from then on the platform tracks the run,
and if this process dies the lease expires and the run comes back as the next
attempt. Offsets are committed in order per partition (OffsetTracker), so a
crash never skips a record whose run was not started.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx
from confluent_kafka import Consumer, KafkaError, TopicPartition

from cronwheel.core.avro import UndecodableRecord, default_registry
from cronwheel.sdk.offsets import OffsetTracker

log = logging.getLogger("cronwheel.sdk")


class Fail(Exception):
    """Raise from a handler to fail the attempt; `retryable=False` skips retries."""

    def __init__(self, message: str, retryable: bool = True, result: Any = None):
        super().__init__(message)
        self.retryable = retryable
        self.result = result


@dataclass
class Run:
    run_id: str
    attempt: int
    payload: Any
    scheduled_at: int  # UTC milliseconds
    priority: str
    job_id: str | None
    workflow_run_id: str | None
    node: str | None
    covers: list[int] | None
    start_token: str = ""
    lease_ms: int = 30_000
    # Set when the platform says this attempt is no longer ours (lease lost,
    # cancelled): a long handler may check it and stop early.
    lost: threading.Event = field(default_factory=threading.Event)


class _Stopping(Exception):
    pass


class Worker:
    def __init__(
        self,
        topic: str,
        handler: Callable[[Run], Any],
        *,
        api_url: str | None = None,
        api_key: str | None = None,
        bootstrap: str | None = None,
        group_id: str | None = None,
        concurrency: int = 1,
        worker_id: str | None = None,
        drain_seconds: float = 30.0,
        consumer_config: dict | None = None,
    ):
        self.topic = topic
        self.handler = handler
        self.api_url = (
            api_url or os.environ.get("CRONWHEEL_URL") or "http://127.0.0.1:8080"
        ).rstrip("/")
        self.api_key = api_key or os.environ.get("CRONWHEEL_API_KEY", "")
        self.bootstrap = bootstrap or os.environ.get("KAFKA_BOOTSTRAP") or "127.0.0.1:39092"
        self.group_id = group_id or f"cronwheel-worker.{topic}"
        self.concurrency = max(1, concurrency)
        self.worker_id = worker_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.drain_seconds = drain_seconds
        self.consumer_config = consumer_config or {}
        self._stop = threading.Event()
        self._offsets = OffsetTracker()
        self._slots = threading.Semaphore(self.concurrency)
        self._active: dict[str, Run] = {}
        self._active_lock = threading.Lock()
        self._http = httpx.Client(
            base_url=self.api_url,
            headers={"Authorization": f"Bearer {self.api_key}"},
            timeout=10.0,
            limits=httpx.Limits(max_connections=self.concurrency * 2 + 2),
        )
        self.completed = 0

    # -- lifecycle of the worker process ----------------------------------------
    def stop(self) -> None:
        self._stop.set()

    def run(self) -> None:
        """Consume until stop() or SIGTERM/SIGINT, then drain: finish what is held
        (or release it as a retryable failure after `drain_seconds`)."""
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, lambda *_: self.stop())
            signal.signal(signal.SIGINT, lambda *_: self.stop())
        consumer = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": self.group_id,
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "fetch.wait.max.ms": 10,
                # A crashed worker's partitions move to the others after 10 s.
                "session.timeout.ms": 10_000,
                "heartbeat.interval.ms": 2_000,
                "log_level": 3,
                **self.consumer_config,
            }
        )
        consumer.subscribe([self.topic], on_revoke=lambda c, parts: self._on_revoke(c, parts))
        pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="cronwheel-run")
        paused = False
        try:
            while not self._stop.is_set():
                full = self._offsets.in_flight() >= self.concurrency
                if full != paused and consumer.assignment():
                    (consumer.pause if full else consumer.resume)(consumer.assignment())
                    paused = full
                msg = consumer.poll(0.05)
                self._commit(consumer)
                if msg is None:
                    continue
                if msg.error():
                    if msg.error().code() != KafkaError._PARTITION_EOF:
                        log.warning("consumer error: %s", msg.error())
                    continue
                self._offsets.begin(msg.topic(), msg.partition(), msg.offset())
                self._slots.acquire()
                pool.submit(
                    self._handle_record, msg.topic(), msg.partition(), msg.offset(), msg.value()
                )
        finally:
            self._drain(pool)
            self._commit(consumer)
            consumer.close()
            self._http.close()

    def _drain(self, pool: ThreadPoolExecutor) -> None:
        deadline = time.monotonic() + self.drain_seconds
        while self._busy() and time.monotonic() < deadline:
            time.sleep(0.05)
        with self._active_lock:
            held = list(self._active.values())
        for run in held:  # still running after the grace period: hand them back
            run.lost.set()
            self._complete(run, "FAILED", None, "worker stopped before the handler finished", True)
        pool.shutdown(wait=False, cancel_futures=True)

    def _busy(self) -> bool:
        """Records being started or runs being handled."""
        with self._active_lock:
            return bool(self._active) or self._offsets.in_flight() > 0

    def _on_revoke(self, consumer: Consumer, partitions) -> None:
        self._commit(consumer)
        for p in partitions:
            self._offsets.forget(p.topic, p.partition)

    def _commit(self, consumer: Consumer) -> None:
        moved = self._offsets.committable()
        if moved:
            parts = [TopicPartition(t, p, off) for (t, p), off in moved.items()]
            try:
                consumer.commit(offsets=parts, asynchronous=True)
            except Exception as e:  # no assignment any more: the next owner re-reads
                log.debug("commit skipped: %s", e)

    # -- one record ------------------------------------------------------------
    def _handle_record(self, topic: str, partition: int, offset: int, value: bytes) -> None:
        try:
            run = self._start(value)
        except _Stopping:
            self._slots.release()
            return  # not started, not finished: the next consumer gets it again
        except Exception:
            log.exception("could not start a run; it will be redelivered")
            self._slots.release()
            return
        if run is not None:
            with self._active_lock:
                self._active[run.run_id] = run
        self._offsets.finish(topic, partition, offset)
        try:
            if run is not None:
                self._execute(run)
        finally:
            self._slots.release()

    def _start(self, value: bytes) -> Run | None:
        try:
            name, rec = default_registry().decode(value)
        except UndecodableRecord as e:
            log.error("skipping an undecodable record: %s", e.reason)
            return None
        if name != "RunReady":
            log.error("skipping a %s record on a queue topic", name)
            return None
        run = Run(
            run_id=rec["run_id"], attempt=rec["attempt"], payload=json.loads(rec["payload"]),
            scheduled_at=rec["scheduled_at"], priority=rec["priority"], job_id=rec["job_id"],
            workflow_run_id=rec["workflow_run_id"], node=rec["node"], covers=rec["covers"],
        )  # fmt: skip
        resp = self._call(
            "start", run.run_id, {"worker_id": self.worker_id, "attempt": run.attempt}
        )
        if resp.status_code != 200:
            return None  # ALREADY_STARTED, NOT_RUNNABLE, STALE_ATTEMPT, gone: not ours
        body = resp.json()
        run.start_token = body["start_token"]
        run.lease_ms = body.get("lease_ms", run.lease_ms)
        run.payload = body.get("payload", run.payload)
        return run

    def _execute(self, run: Run) -> None:
        done = threading.Event()
        threading.Thread(target=self._heartbeat, args=(run, done), daemon=True).start()
        try:
            result = self.handler(run)
            outcome, error, retryable = "SUCCEEDED", None, True
        except Fail as e:
            outcome, error, retryable, result = "FAILED", str(e), e.retryable, e.result
        except Exception as e:  # the handler's bug or a transient failure: retry
            outcome, error, retryable, result = "FAILED", f"{type(e).__name__}: {e}", True, None
        finally:
            done.set()
        with self._active_lock:
            still_ours = self._active.pop(run.run_id, None) is not None
        if still_ours:
            self._complete(run, outcome, result, error, retryable)

    def _heartbeat(self, run: Run, done: threading.Event) -> None:
        """About three beats per lease, until the handler returns."""
        interval = max(0.05, run.lease_ms / 3000)
        while not done.wait(interval):
            try:
                resp = self._call(
                    "heartbeat", run.run_id, {"attempt": run.attempt, "start_token": run.start_token},
                    retry=False,
                )  # fmt: skip
            except httpx.HTTPError as e:
                log.warning("heartbeat of %s failed: %s", run.run_id, e)
                continue
            if resp.status_code == 409:
                run.lost.set()
                return

    def _complete(
        self, run: Run, outcome: str, result: Any, error: str | None, retryable: bool
    ) -> None:
        body = {"attempt": run.attempt, "start_token": run.start_token, "outcome": outcome}
        if result is not None:
            body["result"] = result
        if error is not None:
            body["error"] = error
            body["retryable"] = retryable
        try:
            resp = self._call("complete", run.run_id, body, retry=True, give_up_on_stop=False)
        except Exception as e:  # the lease will expire and the run come back
            log.error("could not complete %s: %s", run.run_id, e)
            return
        if resp.status_code == 200:
            self.completed += 1

    def _call(
        self, verb: str, run_id: str, body: dict, retry: bool = True, give_up_on_stop: bool = True
    ) -> httpx.Response:
        """POST with retries on network errors, 429 and 5xx (bounded backoff)."""
        delay = 0.05
        deadline = time.monotonic() + 60
        while True:
            try:
                resp = self._http.post(f"/v1/runs/{run_id}/{verb}", json=body)
                if resp.status_code < 500 and resp.status_code != 429:
                    return resp
                err: Exception = httpx.HTTPStatusError(
                    f"{resp.status_code}", request=resp.request, response=resp
                )
            except httpx.HTTPError as e:
                err = e
            if not retry or time.monotonic() > deadline:
                raise err
            if give_up_on_stop and self._stop.is_set():
                raise _Stopping()
            time.sleep(delay)
            delay = min(delay * 2, 2.0)
