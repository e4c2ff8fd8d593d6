"""Log lines (cronwheel/logs.py, runtime.setup_logging): JSON objects with the
service's and the run's fields, or text for a terminal, as
CRONWHEEL_LOG_FORMAT says."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cronwheel import logs
from cronwheel.logs import run_fields

ROOT = Path(__file__).resolve().parents[2]
TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")


def record(msg: str, *args, exc_info=None, **extra) -> logging.LogRecord:
    r = logging.LogRecord("cronwheel.executor", logging.WARNING, __file__, 1, msg, args, exc_info)
    r.__dict__.update(extra)
    r.created = 1_796_000_000.5  # 2026-11-30T00:53:20.500Z
    return r


def failure():
    try:
        raise RuntimeError("the disk is full")
    except RuntimeError:
        return sys.exc_info()


def test_run_fields__only_those_given():
    assert run_fields(run_id="r1") == {"run_id": "r1"}
    assert run_fields(tenant_id="t1", run_id="r1", attempt=2) == {
        "tenant_id": "t1",
        "run_id": "r1",
        "attempt": 2,
    }
    assert run_fields() == {}


def test_json__the_fields_of_every_line__the_run_s__a_traceback():
    fmt = logs.formatter("executor", "json")
    line = fmt.format(
        record(
            "run %s attempt %d: refused",
            "r1",
            2,
            exc_info=failure(),
            **run_fields(tenant_id="t1", run_id="r1", attempt=2),
        )
    )
    assert "\n" not in line
    got = json.loads(line)
    assert got.pop("traceback").splitlines()[-1] == "RuntimeError: the disk is full"
    assert got == {
        "time": "2026-11-30T00:53:20.500Z",
        "level": "WARNING",
        "logger": "cronwheel.executor",
        "message": "run r1 attempt 2: refused",
        "service": "executor",
        "tenant_id": "t1",
        "run_id": "r1",
        "attempt": 2,
    }


def test_json__a_line_about_no_run__no_run_fields():
    got = json.loads(logs.formatter("relay", "json").format(record("%d rows failed", 3)))
    assert set(got) == {"time", "level", "logger", "message", "service"}
    assert got["message"] == "3 rows failed"


def test_text__run_fields_as_key_value__traceback_below():
    fmt = logs.formatter("executor", "text")
    text = fmt.format(
        record("run %s refused", "r1", exc_info=failure(), **run_fields(run_id="r1", attempt=1))
    )
    first, *rest = text.splitlines()
    assert re.fullmatch(r".+ executor WARNING run r1 refused run_id=r1 attempt=1", first), first
    assert rest[0] == "Traceback (most recent call last):"
    assert rest[-1] == "RuntimeError: the disk is full"


def test_formatter__unknown_format__names_the_choices():
    with pytest.raises(ValueError, match="expected one of text, json"):
        logs.formatter("relay", "xml")


SCRIPT = textwrap.dedent(
    """
    import logging, threading, warnings
    from cronwheel.logs import run_fields
    from cronwheel.runtime import setup_logging

    log = setup_logging("relay", "INFO")
    log.debug("not at INFO")
    log.info("run %s done", "r1", extra=run_fields(run_id="r1", attempt=1))
    logging.getLogger("uvicorn.error").warning("a library's line")
    warnings.warn("a warning")
    t = threading.Thread(target=lambda: 1 / 0, name="runner-1")
    t.start()
    t.join()
    raise ValueError("the end")
    """
)


def run_script(**env: str) -> subprocess.CompletedProcess:
    """SCRIPT with `env` over the test's environment (CRONWHEEL_LOG_FORMAT unset)."""
    base = {k: v for k, v in os.environ.items() if k != "CRONWHEEL_LOG_FORMAT"}
    return subprocess.run(
        [sys.executable, "-c", SCRIPT],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )


def test_setup_logging__json__every_line_an_object__uncaught_exceptions_too():
    p = run_script(CRONWHEEL_LOG_FORMAT="json")
    assert p.returncode == 1
    lines = [json.loads(line) for line in p.stderr.splitlines()]
    assert [(r["logger"], r["level"]) for r in lines] == [
        ("cronwheel.relay", "INFO"),
        ("uvicorn.error", "WARNING"),
        ("py.warnings", "WARNING"),
        ("cronwheel.relay", "CRITICAL"),
        ("cronwheel.relay", "CRITICAL"),
    ]
    assert all(r["service"] == "relay" and TIME.fullmatch(r["time"]) for r in lines)
    assert (lines[0]["run_id"], lines[0]["attempt"]) == ("r1", 1)
    assert lines[3]["message"] == "thread runner-1 died: ZeroDivisionError: division by zero"
    assert lines[3]["traceback"].endswith("ZeroDivisionError: division by zero")
    assert lines[4]["message"] == "uncaught ValueError: the end"
    assert lines[4]["traceback"].endswith("ValueError: the end")


def test_setup_logging__text_by_default__the_interpreter_reports_uncaught_exceptions():
    p = run_script()
    assert p.returncode == 1
    assert " relay INFO run r1 done run_id=r1 attempt=1\n" in p.stderr
    assert " relay WARNING a library's line\n" in p.stderr
    assert "Exception in thread runner-1:" in p.stderr
    assert p.stderr.endswith("ValueError: the end\n")


def test_serve__bad_log_format__exit_1_and_one_line():
    p = subprocess.run(
        [sys.executable, "-m", "services.entrypoints", "serve", "relay"],
        env={**os.environ, "CRONWHEEL_LOG_FORMAT": "xml"},
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert p.returncode == 1
    assert p.stderr == "cronwheel: CRONWHEEL_LOG_FORMAT='xml': expected one of text, json\n"
