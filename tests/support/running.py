"""Run a service loop in a background thread for a test, and stop it cleanly."""

from __future__ import annotations

import contextlib
import threading


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
