"""The classification table of a delivery attempt, Retry-After, and what of a
response is kept on the run."""

from __future__ import annotations

from datetime import UTC, datetime
from email.utils import format_datetime

import pytest

from services.webhook import delivery, http
from services.webhook.guard import DestinationRefused

NOW = 1_800_000_000_000


@pytest.mark.parametrize(
    ("status", "outcome", "retryable", "breaker"),
    [
        (200, "SUCCEEDED", False, "success"),
        (204, "SUCCEEDED", False, "success"),
        (299, "SUCCEEDED", False, "success"),
        (301, "FAILED", False, "neutral"),
        (302, "FAILED", False, "neutral"),
        (307, "FAILED", False, "neutral"),
        (400, "FAILED", False, "neutral"),
        (401, "FAILED", False, "neutral"),
        (404, "FAILED", False, "neutral"),
        (410, "FAILED", False, "neutral"),
        (408, "FAILED", True, "failure"),
        (429, "FAILED", True, "failure"),
        (500, "FAILED", True, "failure"),
        (502, "FAILED", True, "failure"),
        (503, "FAILED", True, "failure"),
        (599, "FAILED", True, "failure"),
        (100, "FAILED", False, "neutral"),
        (600, "FAILED", False, "neutral"),
    ],
)
def test_classify_status__the_table(status, outcome, retryable, breaker):
    got = delivery.classify_status(status)
    assert (got.outcome, got.retryable, got.breaker) == (outcome, retryable, breaker)


def test_classify_status__redirect__says_not_followed():
    assert delivery.classify_status(302).error == "HTTP 302: redirect not followed"


@pytest.mark.parametrize(
    ("exc", "retryable", "breaker", "starts"),
    [
        (http.ConnectTimeout("x"), True, "failure", "timed out"),
        (http.ReadTimeout("x"), True, "failure", "timed out"),
        (TimeoutError(), True, "failure", "timed out"),
        (http.ConnectError("refused"), True, "failure", "connection failed"),
        (http.ReadError("eof"), True, "failure", "connection failed"),
        (http.ProtocolError("bad status line"), True, "failure", "connection failed"),
        (ConnectionResetError(), True, "failure", "connection failed"),
        (DestinationRefused("127.0.0.1 is a loopback address"), False, None, "destination refused"),
        (http.UnsupportedURL("header 'x' cannot be sent"), False, None, "request not sendable"),
        (RuntimeError("bug"), True, None, "delivery error"),
    ],
)
def test_classify_error__the_table(exc, retryable, breaker, starts):
    got = delivery.classify_error(exc, 500)
    assert (got.outcome, got.retryable, got.breaker) == ("FAILED", retryable, breaker)
    assert got.error.startswith(starts)


def test_no_secret__fails_without_retry_or_breaker():
    got = delivery.no_secret()
    assert (got.outcome, got.retryable, got.breaker) == ("FAILED", False, None)


@pytest.mark.parametrize(
    ("value", "want"),
    [
        (None, None),
        ("", None),
        ("0", 0),
        ("7", 7000),
        (" 12 ", 12000),
        ("soon", None),
        ("-5", None),
        ("999999", 3_600_000),  # capped
        (format_datetime(datetime.fromtimestamp((NOW + 30_000) / 1000, UTC), usegmt=True), 30_000),
        (format_datetime(datetime.fromtimestamp((NOW - 30_000) / 1000, UTC), usegmt=True), 0),
    ],
)
def test_parse_retry_after__seconds_or_http_date(value, want):
    assert delivery.parse_retry_after(value, NOW) == want


def test_classify_status__retry_after_only_on_retryable_statuses():
    assert delivery.classify_status(503, "4", NOW).retry_after_ms == 4000
    assert delivery.classify_status(429, "4", NOW).retry_after_ms == 4000
    assert delivery.classify_status(404, "4", NOW).retry_after_ms is None
    assert delivery.classify_status(503, "999", NOW, cap_ms=60_000).retry_after_ms == 60_000


def test_response_result__first_4_kib_a_few_headers():
    headers = {"content-type": "text/plain", "set-cookie": "s=1", "retry-after": "3"}
    got = delivery.response_result(503, headers, "é".encode() * 3000, False, 12, 3000)
    assert got["status"] == 503
    assert got["headers"] == {"content-type": "text/plain", "retry-after": "3"}
    assert len(got["body"].encode()) <= 4096 and got["body_truncated"] is True
    assert got["duration_ms"] == 12 and got["retry_after_ms"] == 3000
    small = delivery.response_result(200, {}, b"ok", False, 1)
    assert small["body"] == "ok" and small["body_truncated"] is False
    assert "retry_after_ms" not in small
