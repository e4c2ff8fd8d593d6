"""What every service process shares: logging, signal handling, a stop flag,
and its heap left out of the garbage collector's passes once started."""

from __future__ import annotations

import faulthandler
import gc
import logging
import signal
import sys
import threading

from cronwheel import config, logs


def setup_logging(service: str, level: str) -> logging.Logger:
    """Log lines on stderr at `level` (the service's CRONWHEEL_LOG_LEVEL), JSON
    or text as CRONWHEEL_LOG_FORMAT says (cronwheel/logs.py). Every logger of
    the process, the libraries' included, writes through the one handler set
    here, and warnings go through it too. With JSON, an exception nothing caught
    is logged as well (its traceback a field), so the stream stays one object a
    line; text keeps the interpreter's own report."""
    log_format = config.load(config.Logs).format
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logs.formatter(service, log_format))
    logging.basicConfig(level=level, handlers=[handler], force=True)
    logging.captureWarnings(True)
    log = logging.getLogger(f"cronwheel.{service}")
    if log_format == "json":
        _log_uncaught(log)
    return log


def _log_uncaught(log: logging.Logger) -> None:
    """Exceptions that end the main thread or another thread, as one log line each."""

    def main_thread(kind, value, tb) -> None:
        if issubclass(kind, KeyboardInterrupt):
            sys.__excepthook__(kind, value, tb)
            return
        log.critical("uncaught %s: %s", kind.__name__, value, exc_info=(kind, value, tb))

    def other_thread(args: threading.ExceptHookArgs) -> None:
        if args.exc_type is SystemExit:  # as the default hook: a thread's quiet exit
            return
        name = args.thread.name if args.thread is not None else "?"
        log.critical(
            "thread %s died: %s: %s",
            name,
            args.exc_type.__name__,
            args.exc_value,
            exc_info=(args.exc_type, args.exc_value, args.exc_traceback),
        )

    sys.excepthook = main_thread
    threading.excepthook = other_thread


def freeze_heap() -> None:
    """Called once a service is made, before it runs: every object the
    process holds now (its modules, classes and functions, its settings, the
    service and its clients: about 50,000 in a dispatcher) is left out of the
    cyclic garbage collector's later passes (gc.freeze), which otherwise walk
    them all each time. A dispatcher with 3,000 tenants spent 18-52 ms (once
    121 ms) in each full pass, one every 2-20 s, and a run due meanwhile
    waited for it (docs/dispatcher.md, "Runs at a second each"). What is made later is
    collected as before. A frozen object is still freed when its last
    reference goes; only a cycle among frozen objects is never collected, so
    what is garbage now is collected first, and a service made again (run
    again with new clients) unfreezes the last one's objects before that."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()


def stop_on_signals() -> threading.Event:
    """An event set by SIGTERM or SIGINT: loops finish their batch and exit.
    SIGUSR1 and SIGUSR2 ask for a diagnosis (diagnose_on_signals)."""
    stop = threading.Event()

    def handler(*_):
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    diagnose_on_signals()
    return stop


_DESCRIBE = threading.Event()


def diagnose_on_signals() -> None:
    """What an operator asks of a service that runs but does nothing
    (docs/reliability.md, "Asking a service what it is doing"):

    - SIGUSR1: every thread's stack on stderr, written by faulthandler from
      the signal itself, so it comes even from a loop stuck inside a C call;
    - a fatal signal (SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL: a crash in a
      C library such as librdkafka): every thread's stack on stderr before
      the process dies, so its log says where it was, beside the
      supervisor's line with the signal;
    - SIGUSR2: a consuming service logs its Kafka state (assignment,
      positions, committed offsets, what it holds back) at its loop's next
      pass (`describe_requested`). Not from the signal handler: that runs
      between two bytecodes of the main thread, possibly inside a librdkafka
      callback, where a call on the same client aborts the process
      (cronwheel/consuming.py)."""
    faulthandler.enable(all_threads=True)
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    signal.signal(signal.SIGUSR2, lambda *_: _DESCRIBE.set())


def describe_requested() -> bool:
    """True once per SIGUSR2."""
    if not _DESCRIBE.is_set():
        return False
    _DESCRIBE.clear()
    return True
