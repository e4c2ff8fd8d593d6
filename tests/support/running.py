"""Run a service loop in a background thread for a test, and stop it cleanly."""

from __future__ import annotations

import contextlib
import threading

from prometheus_client import REGISTRY

from cronwheel.consumer import run_restarting


@contextlib.contextmanager
def running(service):
    """`service.run(stop)` in a thread; stopped and joined when the block ends.
    An exception in the service fails the test at exit."""
    stop = threading.Event()
    errors: list[BaseException] = []

    def target():
        try:
            service.run(stop)
        except BaseException as e:  # reported below, in the test's thread
            errors.append(e)

    thread = threading.Thread(target=target, daemon=True, name=type(service).__name__)
    thread.start()
    try:
        yield service
    finally:
        stop.set()
        thread.join(30)
        if thread.is_alive():
            raise AssertionError(f"{type(service).__name__} did not stop within 30 s")
        if errors:
            raise errors[0]


class Restarting:
    """A service as its `cronwheel serve` runs it: `make()` made and run again
    with new Kafka clients when its clients are stuck (run_restarting)."""

    def __init__(self, make) -> None:
        self.make = make

    def run(self, stop: threading.Event) -> None:
        run_restarting(self.make, stop)


def clients_restarted(service: str) -> float:
    """cronwheel_kafka_clients_restarted_total of `service` (run_restarting's count)."""
    labels = {"service": service}
    return REGISTRY.get_sample_value("cronwheel_kafka_clients_restarted_total", labels) or 0.0
