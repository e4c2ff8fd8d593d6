"""Python imports this module at start-up when its directory is on PYTHONPATH
(tests/faults/clockskew.py, `python_env`): the process's wall clock, as Python
code reads it (time.time, time.time_ns), runs CRONWHEEL_FAULT_SKEW_S seconds
off (+ ahead). Its C libraries (librdkafka's timers, libpq) read the kernel's
clock unchanged, which is what a host whose NTP is off looks like to them:
libfaketime, which shifts those too, also shifts the deadlines librdkafka
passes to its timed waits, so a producer's poll(0.1) in a process 2 s ahead
took 2.1 s, and a relay under it missed its lease renewals for reasons no
real host has (docs/reliability.md, "Clock skew")."""

import os
import time

_skew = os.environ.get("CRONWHEEL_FAULT_SKEW_S")
if _skew:
    _ns = round(float(_skew) * 1_000_000_000)
    _time, _time_ns = time.time, time.time_ns
    time.time = lambda: _time() + _ns / 1_000_000_000
    time.time_ns = lambda: _time_ns() + _ns
