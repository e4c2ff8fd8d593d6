"""What one delivery attempt means for the run: the classification table, and
the bounded record of the response kept on the run's result.

| response or error                            | outcome   | retry | breaker   |
|----------------------------------------------|-----------|-------|-----------|
| 2xx                                          | SUCCEEDED |       | success   |
| 3xx (never followed)                         | FAILED    | no    | neutral   |
| 408, 429, 5xx (Retry-After honoured)         | FAILED    | yes   | failure   |
| other 4xx, and any other status              | FAILED    | no    | neutral   |
| timeout: connect, read, write or total       | FAILED    | yes   | failure   |
| connection, DNS or protocol error            | FAILED    | yes   | failure   |
| destination refused (SSRF guard)             | FAILED    | no    | none      |
| request not sendable (URL, header value)     | FAILED    | no    | none      |
| no signing secret for the run's owner        | FAILED    | no    | none      |
| any other error (a bug of the service)       | FAILED    | yes   | none      |

"neutral": the endpoint answered, so it is up (the breaker counts it as a
success); "none": no request was made, the breaker is not told anything.
"""

from __future__ import annotations

import email.utils
from collections.abc import Mapping
from dataclasses import dataclass

from services.webhook.guard import DestinationRefused
from services.webhook.http import HTTPError, UnsupportedURL

KEEP_BODY_BYTES = 4096  # the first 4 KiB of the response body go on the run
KEPT_HEADERS = ("content-type", "content-length", "location", "retry-after")
RETRYABLE_STATUS = frozenset({408, 429})
DEFAULT_RETRY_AFTER_CAP_MS = 3_600_000  # a Retry-After never holds a run back more than 1 h

SUCCESS, FAILURE, NEUTRAL = "success", "failure", "neutral"


@dataclass(frozen=True)
class Outcome:
    outcome: str  # SUCCEEDED | FAILED, as CompleteRun takes it
    retryable: bool
    error: str | None
    breaker: str | None  # SUCCESS | FAILURE | NEUTRAL, or None: no request was made
    retry_after_ms: int | None = None


def parse_retry_after(
    value: str | None, now_ms: int, cap_ms: int = DEFAULT_RETRY_AFTER_CAP_MS
) -> int | None:
    """Milliseconds to wait, from delay-seconds or an HTTP-date; None when absent
    or unreadable. Capped, so an endpoint cannot park a run indefinitely."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        ms = int(value) * 1000
    else:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when is None or when.tzinfo is None:
            return None
        ms = int(when.timestamp() * 1000) - now_ms
    return max(0, min(ms, cap_ms))


def classify_status(
    status: int,
    retry_after: str | None = None,
    now_ms: int = 0,
    cap_ms: int = DEFAULT_RETRY_AFTER_CAP_MS,
) -> Outcome:
    if 200 <= status < 300:
        return Outcome("SUCCEEDED", False, None, SUCCESS)
    if 300 <= status < 400:
        return Outcome("FAILED", False, f"HTTP {status}: redirect not followed", NEUTRAL)
    if status in RETRYABLE_STATUS or 500 <= status < 600:
        wait = parse_retry_after(retry_after, now_ms, cap_ms)
        return Outcome("FAILED", True, f"HTTP {status}", FAILURE, wait)
    return Outcome("FAILED", False, f"HTTP {status}", NEUTRAL)


def classify_error(exc: BaseException, timeout_ms: int | None = None) -> Outcome:
    """An attempt that got no response."""
    if isinstance(exc, DestinationRefused):
        return Outcome("FAILED", False, f"destination refused: {exc}", None)
    if isinstance(exc, UnsupportedURL):  # the URL or a header of the job: no retry mends it
        return Outcome("FAILED", False, f"request not sendable: {exc}", None)
    if isinstance(exc, TimeoutError):
        after = f" after {timeout_ms} ms" if timeout_ms else ""
        kind = type(exc).__name__ if isinstance(exc, HTTPError) else "total timeout"
        return Outcome("FAILED", True, f"timed out{after} ({kind})", FAILURE)
    if isinstance(exc, HTTPError | OSError):
        return Outcome("FAILED", True, f"connection failed: {type(exc).__name__}: {exc}", FAILURE)
    # Not the endpoint's doing (a bug of ours): retry, and leave the breaker alone.
    return Outcome("FAILED", True, f"delivery error: {type(exc).__name__}: {exc}", None)


def no_secret() -> Outcome:
    return Outcome("FAILED", False, "no signing secret for this job: rotate its secret", None)


def response_result(
    status: int,
    headers: Mapping[str, str],
    body: bytes,
    truncated: bool,
    duration_ms: int,
    retry_after_ms: int | None = None,
) -> dict:
    """The run's `result` for an attempt that got a response: the status, a few
    headers and the first 4 KiB of the body (as text)."""
    kept = {h: headers[h] for h in KEPT_HEADERS if h in headers}
    out = {
        "status": status,
        "headers": kept,
        "body": body[:KEEP_BODY_BYTES].decode("utf-8", errors="replace"),
        "body_truncated": truncated or len(body) > KEEP_BODY_BYTES,
        "duration_ms": duration_ms,
    }
    if retry_after_ms is not None:
        out["retry_after_ms"] = retry_after_ms
    return out


def error_result(outcome: Outcome, duration_ms: int) -> dict:
    """The run's `result` for an attempt that got no response."""
    return {"status": None, "error": outcome.error, "duration_ms": duration_ms}
