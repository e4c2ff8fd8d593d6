"""A service killed by a fatal signal from inside a C library (librdkafka,
psycopg's libpq) leaves every thread's Python stack in its log
(cronwheel.runtime.diagnose_on_signals), beside the supervisor's line with
the signal: where it was, not only that it died."""

from __future__ import annotations

import signal
import subprocess
import textwrap

from tests.support.procs import PYTHON, ROOT

CHILD = textwrap.dedent(
    """
    import ctypes, threading
    from cronwheel import runtime

    runtime.stop_on_signals()  # what every service's entry point does
    done = threading.Event()

    def waiting_beside():
        done.wait()

    threading.Thread(target=waiting_beside, name="beside", daemon=True).start()

    def reads_a_null_pointer():
        ctypes.string_at(0)  # SIGSEGV, as a crash inside a C call

    reads_a_null_pointer()
    """
)


def test_fatal_signal__every_threads_stack_on_stderr():
    child = subprocess.run(
        [PYTHON, "-c", CHILD], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert child.returncode == -signal.SIGSEGV, child
    assert "Fatal Python error: Segmentation fault" in child.stderr, child.stderr
    assert "reads_a_null_pointer" in child.stderr  # the crashing thread's stack
    assert "waiting_beside" in child.stderr  # and the others'
