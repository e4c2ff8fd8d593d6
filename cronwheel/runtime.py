"""What every service process shares: logging, signal handling and a stop flag."""

from __future__ import annotations

import logging
import signal
import threading


def setup_logging(service: str, level: str) -> logging.Logger:
    """Log lines on stderr at `level` (the service's CRONWHEEL_LOG_LEVEL)."""
    logging.basicConfig(
        level=level,
        format=f"%(asctime)s {service} %(levelname)s %(message)s",
    )
    return logging.getLogger(f"cronwheel.{service}")


def stop_on_signals() -> threading.Event:
    """An event set by SIGTERM or SIGINT: loops finish their batch and exit."""
    stop = threading.Event()

    def handler(*_):
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    return stop
