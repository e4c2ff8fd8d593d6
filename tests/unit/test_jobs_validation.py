"""cronwheel.core.jobs.parse_job: bad input names the exact field (the API's 4xx
points the user at it), and a minimal job gets the documented defaults."""

from __future__ import annotations

import copy
import json

import pytest

from cronwheel.core.errors import ValidationError
from cronwheel.core.jobs import MAX_PAYLOAD_BYTES, Catchup, Retry, parse_job
from services.gateway.problems import status_of  # what the answer would be

NOW = 1_800_000_000_000


def good() -> dict:
    return {
        "name": "nightly",
        "schedule": {"cron": "0 3 * * *", "timezone": "Europe/Berlin"},
        "target": {"type": "queue", "queue": "billing"},
    }


def _with(path: str, value):
    """A good body with the value at the dotted `path` replaced."""
    body = copy.deepcopy(good())
    *parents, leaf = path.split(".")
    node = body
    for key in parents:
        node = node.setdefault(key, {})
    node[leaf] = value
    return body


def _schedule(**schedule):
    return {**good(), "schedule": schedule}


def _target(**target):
    return {**good(), "target": target}


BAD = [
    ("empty name", _with("name", ""), "name"),
    ("name not a string", _with("name", 7), "name"),
    ("name too long", _with("name", "x" * 201), "name"),
    ("bad cron", _schedule(cron="61 * * * *"), "schedule.cron"),
    ("cron never fires", _schedule(cron="0 0 30 2 *"), "schedule.cron"),
    ("unknown zone", _schedule(cron="0 3 * * *", timezone="Mars/Olympus"), "schedule.timezone"),
    ("every_ms below 100", _schedule(every_ms=99), "schedule.every_ms"),
    ("every_ms a bool", _schedule(every_ms=True), "schedule.every_ms"),
    ("at without offset", _schedule(at="2027-01-15T08:00:00"), "schedule.at"),
    ("at not a date", _schedule(at="2027-02-30T08:00:00Z"), "schedule.at"),
    ("two kinds", _schedule(every_ms=1000, at="2027-01-15T08:00:00Z"), "schedule"),
    (
        "catch-up policy",
        _schedule(every_ms=1000, catchup={"policy": "some"}),
        "schedule.catchup.policy",
    ),
    (
        "catch-up max_runs",
        _schedule(every_ms=1000, catchup={"max_runs": 0}),
        "schedule.catchup.max_runs",
    ),
    ("overlap", _schedule(every_ms=1000, overlap="queue"), "schedule.overlap"),
    ("negative jitter", _schedule(every_ms=1000, jitter_ms=-1), "schedule.jitter_ms"),
    ("target type", _target(type="email"), "target.type"),
    ("queue name", _target(type="queue", queue="has space"), "target.queue"),
    ("webhook scheme", _target(type="webhook", url="ftp://example.com/x"), "target.url"),
    ("webhook without host", _target(type="webhook", url="https:///x"), "target.url"),
    ("empty command", _target(type="managed", command=[]), "target.command"),
    ("command not strings", _target(type="managed", command=["ls", 1]), "target.command"),
    ("zero attempts", _with("retry", {"max_attempts": 0}), "retry.max_attempts"),
    ("attempts a string", _with("retry", {"max_attempts": "3"}), "retry.max_attempts"),
    ("priority class", _with("priority", "urgent"), "priority"),
    ("lease too short", _with("lease_ms", 999), "lease_ms"),
    ("unknown top-level field", _with("colour", "red"), "colour"),
    ("unknown schedule field", _schedule(every_ms=1000, colour="red"), "schedule.colour"),
    ("unknown target field", _target(type="queue", queue="q", colour="red"), "target.colour"),
    ("unknown retry field", _with("retry", {"colour": "red"}), "retry.colour"),
]


@pytest.mark.parametrize(("body", "field"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_parse_job__bad_body__raises_naming_the_field(body, field):
    with pytest.raises(ValidationError) as err:
        parse_job(body, now_ms=NOW)
    assert err.value.field == field
    assert (err.value.code, status_of(err.value)) == ("INVALID_FIELD", 422)


def test_parse_job__body_not_an_object__names_the_body():
    with pytest.raises(ValidationError) as err:
        parse_job(["name"], now_ms=NOW)
    assert err.value.field == "body"


def test_parse_job__payload_over_256_kib__is_413():
    body = {**good(), "payload": "x" * MAX_PAYLOAD_BYTES}  # plus quotes: just over
    with pytest.raises(ValidationError) as err:
        parse_job(body, now_ms=NOW)
    assert (err.value.field, status_of(err.value), err.value.code) == (
        "payload",
        413,
        "PAYLOAD_TOO_LARGE",
    )


def test_parse_job__payload_at_the_limit__accepted():
    body = {**good(), "payload": "x" * (MAX_PAYLOAD_BYTES - 2)}  # quotes make it 256 KiB
    assert len(parse_job(body, now_ms=NOW).payload.encode()) == MAX_PAYLOAD_BYTES


def test_parse_job__priority_the_tenant_may_not_use__priority_not_allowed():
    body = {**good(), "priority": "critical"}
    with pytest.raises(ValidationError) as err:
        parse_job(body, now_ms=NOW, allowed_priorities=("high", "normal", "low"))
    assert (err.value.field, err.value.code, status_of(err.value)) == (
        "priority",
        "PRIORITY_NOT_ALLOWED",
        403,
    )
    assert parse_job(body, now_ms=NOW).priority == "critical"  # allowed by default


def test_parse_job__minimal_body__documented_defaults():
    spec = parse_job(good(), now_ms=NOW)
    assert spec.name == "nightly"
    assert spec.schedule == {"cron": "0 3 * * *", "timezone": "Europe/Berlin"}
    assert spec.target == {"type": "queue", "queue": "billing"}
    assert spec.payload == "null"
    assert spec.priority == "normal"
    assert spec.retry == Retry(max_attempts=3, initial_backoff_ms=1000, max_backoff_ms=60_000)
    assert spec.retry.multiplier == 2.0
    assert spec.timeout_ms is None
    assert spec.lease_ms == 30_000
    assert spec.overlap == "allow"
    assert spec.catchup == Catchup(window_ms=300_000, policy="all", max_runs=100)
    assert spec.jitter_ms == 0


def test_parse_job__schedule_extras__split_from_the_schedule_proper():
    body = _schedule(
        every_ms=1000,
        jitter_ms=250,
        overlap="buffer_one",
        catchup={"window_ms": 5000, "policy": "latest"},
    )
    body["payload"] = {"n": 1, "s": "é"}
    spec = parse_job(body, now_ms=NOW)
    assert spec.schedule == {"every_ms": 1000}
    assert (spec.jitter_ms, spec.overlap) == (250, "buffer_one")
    assert spec.catchup == Catchup(window_ms=5000, policy="latest", max_runs=100)
    assert json.loads(spec.payload) == {"n": 1, "s": "é"}


def test_parse_job__webhook_and_managed_targets__normalised():
    hook = parse_job(_target(type="webhook", url="https://example.com/hook"), now_ms=NOW)
    assert hook.target == {
        "type": "webhook",
        "url": "https://example.com/hook",
        "method": "POST",
        "headers": {},
    }
    managed = parse_job(_target(type="managed", command=["echo", "hi"]), now_ms=NOW)
    assert managed.target == {"type": "managed", "command": ["echo", "hi"], "env": {}, "limits": {}}
