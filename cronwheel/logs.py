"""Log lines: one JSON object a line for a log collector, or plain text for a
terminal (CRONWHEEL_LOG_FORMAT), set up once per process by
cronwheel.runtime.setup_logging.

A JSON line holds `time` (UTC, ISO-8601 with milliseconds), `level`,
`logger`, `message` and `service`; a line about one run adds `tenant_id`,
`run_id` and `attempt` as fields of their own, given by the call site:

    log.info("run %s refused: %s", run_id, e, extra=run_fields(tenant_id=t, run_id=run_id))

and a line with an exception adds its `traceback`. The text form appends the
same run fields as `key=value`. python-json-logger encodes the objects (a
stdlib logging.Formatter, so every logger of the process, the libraries'
included, writes the same lines).

What a line holds is the call site's choice: messages and fields name ids,
counts and outcomes, never an API key, a signing secret, a managed job's `env`
or output, or a connection string with its password
(tests/e2e/test_log_secrets.py greps a whole flow's lines for them).
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from pythonjsonlogger.core import RESERVED_ATTRS
from pythonjsonlogger.json import JsonFormatter

from cronwheel.config import LOG_FORMATS

RUN_FIELDS = ("tenant_id", "run_id", "attempt")


def run_fields(
    *, tenant_id: str | None = None, run_id: str | None = None, attempt: int | None = None
) -> dict:
    """`extra=` for a log line about one run: the fields known at the call site."""
    given = {"tenant_id": tenant_id, "run_id": run_id, "attempt": attempt}
    return {k: v for k, v in given.items() if v is not None}


def utc_iso_ms(created: float) -> str:
    """A record's time as `2026-12-02T07:03:26.123Z`."""
    return datetime.fromtimestamp(created, UTC).isoformat(timespec="milliseconds")[:-6] + "Z"


class JsonLines(JsonFormatter):
    """One JSON object a line: time, level, logger, message, service, then the
    record's extra fields (the run's among them) and any traceback."""

    def __init__(self, service: str):
        super().__init__(
            "%(asctime)s %(levelname)s %(name)s %(message)s",
            rename_fields={
                "asctime": "time",
                "levelname": "level",
                "name": "logger",
                "exc_info": "traceback",
                "stack_info": "stack",
            },
            static_fields={"service": service},
            # uvicorn's `color_message`: its message again, with terminal colours.
            reserved_attrs=[*RESERVED_ATTRS, "color_message"],
        )

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return utc_iso_ms(record.created)


class TextLines(logging.Formatter):
    """`<time> <service> <LEVEL> <message>` and the run's fields as `key=value`;
    a traceback on the lines after, as the standard formatter writes it."""

    def __init__(self, service: str):
        super().__init__(f"%(asctime)s {service} %(levelname)s %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:
        line = super().formatMessage(record)
        fields = [f"{k}={record.__dict__[k]}" for k in RUN_FIELDS if k in record.__dict__]
        return " ".join([line, *fields])


def formatter(service: str, log_format: str) -> logging.Formatter:
    """The formatter of `log_format` (one of config.LOG_FORMATS) for `service`'s lines."""
    if log_format == "json":
        return JsonLines(service)
    if log_format == "text":
        return TextLines(service)
    raise ValueError(f"log format {log_format!r}: expected one of {', '.join(LOG_FORMATS)}")
