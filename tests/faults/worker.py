"""The fault harness's SDK worker: `python -m tests.faults.worker TOPIC`.

Every execution of its handler appends to the effect log EFFECT_LOG
(effect_log.py) a `start` line when it begins and an `effect` line when its
effect is done, and a `not_due` line for each StartRun refused as not due
yet.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import time

from cronwheel.sdk import Run, Worker
from cronwheel.sdk import worker as sdk_worker
from tests.faults import effect_log

_LOG = effect_log.opened(os.environ["EFFECT_LOG"])


def _record(run: Run, phase: str) -> None:
    # `pid`: which worker process ran it (several take turns in a rebalance storm).
    effect_log.append(_LOG, [effect_log.line(run.run_id, run.attempt, phase, os.getpid())])


def handle(run: Run) -> dict:
    _record(run, "start")
    payload = run.payload if isinstance(run.payload, dict) else {}
    time.sleep(float(payload.get("sleep_s", 0)))  # the work itself: keeps calls in flight
    _record(run, "effect")
    return {"attempt": run.attempt}


def _count_not_due(refused_as_not_due):
    """The SDK's test for a StartRun refused as "not due yet", logging each
    refusal it recognises (phase "not_due"): a due run refused so is a clock
    judged on the wrong host, which the checker counts."""

    def wrapped(status, body, run: Run) -> bool:
        if refused := refused_as_not_due(status, body, run):
            _record(run, "not_due")
        return refused

    return wrapped


sdk_worker._not_due_yet = _count_not_due(sdk_worker._not_due_yet)


def _print_consumers(*_) -> None:
    """Each Kafka consumer's state (cronwheel.consuming.describe) on SIGUSR2,
    run by Python in the main thread between two of its steps: what a worker
    that stopped taking runs is assigned and where it stands."""
    import gc
    import json

    from confluent_kafka import Consumer

    from cronwheel.consuming import describe

    for c in (o for o in gc.get_objects() if isinstance(o, Consumer)):
        print(f"consumer {json.dumps(describe(c), default=str)}", flush=True)


if __name__ == "__main__":
    # The harness asks for every thread's stack and the consumer's state when
    # the platform does not catch up (harness.wait_recovered): where a worker
    # that stopped taking runs waits, and what it is assigned.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    signal.signal(signal.SIGUSR2, _print_consumers)
    worker = Worker(sys.argv[1], handle, concurrency=int(os.environ.get("SDK_CONCURRENCY", "8")))
    print(f"worker {os.getpid()} consuming", flush=True)  # the rebalance storm waits for it
    worker.run()
