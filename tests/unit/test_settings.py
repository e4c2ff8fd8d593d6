"""Settings: one typed object per service, read once at start-up, each default in
one place (cronwheel/config.py, services/*/main.py), listed in docs/settings.md."""

from __future__ import annotations

import ast
import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cronwheel import config
from cronwheel.config import SettingsError
from services.entrypoints import SERVICES, service_settings
from services.executor.main import SandboxSettings
from services.executor.sandbox import Policy
from services.webhook.main import TuningSettings
from services.webhook.service import Settings as WebhookTunables

ROOT = Path(__file__).resolve().parents[2]
NAME = re.compile(r"^(CRONWHEEL_[A-Z0-9_]+|DATABASE_URL|KAFKA_BOOTSTRAP)$")

COMMON = {
    "DATABASE_URL": "postgresql://cronwheel_platform:cronwheel_platform@127.0.0.1:25432/cronwheel",
    "KAFKA_BOOTSTRAP": "127.0.0.1:29092",
    "CRONWHEEL_TOPIC_PREFIX": "cw",
    "CRONWHEEL_LOG_LEVEL": "INFO",
}
METRICS = {
    "CRONWHEEL_METRICS_ADDR": None,
    "CRONWHEEL_METRICS_PORT": None,
    "CRONWHEEL_KAFKA_STATS_MS": 0,
}
FIRING = {"CRONWHEEL_LEASE_TTL_MS": 10_000, "CRONWHEEL_FIRE_AHEAD_MS": 1_000}
PROCESSED = {"CRONWHEEL_PROCESSED_RETENTION_MS": 7 * 24 * 3600 * 1000}
RENEWAL = {
    "CRONWHEEL_PRODUCER_SHARDS": 4,
    "CRONWHEEL_PRODUCER_HOT_TOPICS": 16,
    "CRONWHEEL_PRODUCER_HOT_RATE": 20.0,
    "CRONWHEEL_PRODUCER_RENEW_S": 600.0,
    "CRONWHEEL_PRODUCER_RENEW_TOPICS": 500,
}

# Each service's variables and defaults as they were before settings objects
# (README, deploy/ and tests set them): names and defaults are public.
DEFAULTS = {
    "gateway": {
        **COMMON,
        "CRONWHEEL_CELL": "local",
        "CRONWHEEL_HTTP_ADDR": "127.0.0.1:8080",
        "CRONWHEEL_WEBHOOK_ALLOW_CIDRS": (),
        "CRONWHEEL_OPERATOR_KEY": None,
        "CRONWHEEL_RATE_LIMIT": 1000.0,
        "CRONWHEEL_RATE_BURST": 2000.0,
        "CRONWHEEL_AUTH_FAILURES_PER_MINUTE": 30,
        "CRONWHEEL_AUTH_CACHE_S": 30.0,
        "CRONWHEEL_QUOTA_JOBS": 10_000,
        "CRONWHEEL_QUOTA_WORKFLOWS": 1_000,
        "CRONWHEEL_QUOTA_KEYS": 100,
        "CRONWHEEL_GATEWAY_POOL": 10,
        "CRONWHEEL_WEBHOOK_DNS_TIMEOUT_MS": 2000,
        "CRONWHEEL_GATEWAY_FASTPATH": True,
        "CRONWHEEL_GATEWAY_MAKES_TOPICS": True,
        "CRONWHEEL_GATEWAY_TOPICS_WAIT_MS": 2000,
        "CRONWHEEL_GATEWAY_WORKERS": None,
        "CRONWHEEL_GATEWAY_LISTEN_FD": None,
        "CRONWHEEL_GATEWAY_RATE_LIMIT_TABLE": None,
    },
    "timer": {
        **COMMON,
        **METRICS,
        **FIRING,
        "CRONWHEEL_TIMER_BATCH": 500,
        "CRONWHEEL_TIMER_CRITICAL_BATCH": 0,
        "CRONWHEEL_PENDING_DEADLINE_CRITICAL_MS": 60_000,
        "CRONWHEEL_PENDING_DEADLINE_HIGH_MS": 120_000,
        "CRONWHEEL_PENDING_DEADLINE_NORMAL_MS": 300_000,
        "CRONWHEEL_PENDING_DEADLINE_LOW_MS": 600_000,
        "CRONWHEEL_PENDING_SWEEP_MS": 10_000,
    },
    "relay": {
        **COMMON,
        **METRICS,
        **FIRING,
        **RENEWAL,
        "CRONWHEEL_RELAY_BATCH": 5000,
        "CRONWHEEL_RELAY_WAKE_EVERY_MS": 500,
        "CRONWHEEL_RELAY_DELIVERY_WATCH_S": 15.0,
    },
    "dispatcher": {
        **COMMON,
        **METRICS,
        **PROCESSED,
        **RENEWAL,
        "CRONWHEEL_DISPATCHER_BATCH": 500,
        "CRONWHEEL_DISPATCHER_MAX_WAIT_MS": 5,
        "CRONWHEEL_DISPATCHER_IN_FLIGHT": 4,
        "CRONWHEEL_DISPATCHER_DOZE_AFTER_MS": 1_000,
        "CRONWHEEL_DISPATCHER_WAKE_HOLDS_MS": 3_000,
        "CRONWHEEL_DISPATCHER_RESUME_AHEAD_MS": 250,
        "CRONWHEEL_DISPATCHER_DOZE_SWEEP_MS": 15_000,
        "CRONWHEEL_DISPATCHER_FETCH_WATCH_S": 15.0,
    },
    "workflow": {
        **COMMON,
        **METRICS,
        **PROCESSED,
        "CRONWHEEL_WORKFLOW_INSTANCE_ID": None,
        "CRONWHEEL_WORKFLOW_BATCH": 500,
        "CRONWHEEL_WORKFLOW_COMMIT_INTERVAL_MS": 0,
        "CRONWHEEL_WORKFLOW_SESSION_TIMEOUT_MS": 10_000,
    },
    "webhook": {
        **COMMON,
        **METRICS,
        "CRONWHEEL_WEBHOOK_ALLOW_CIDRS": (),
        "CRONWHEEL_WEBHOOK_INSTANCE": None,
        "CRONWHEEL_WEBHOOK_PER_ENDPOINT": 16,
        "CRONWHEEL_WEBHOOK_MAX_IN_FLIGHT": 512,
        "CRONWHEEL_WEBHOOK_TENANT_SLOTS": 64,
        "CRONWHEEL_WEBHOOK_BREAKER_FAILURES": 5,
        "CRONWHEEL_WEBHOOK_BREAKER_COOLDOWN_MS": 30_000,
        "CRONWHEEL_WEBHOOK_CONNECT_TIMEOUT_MS": 5_000,
        "CRONWHEEL_WEBHOOK_DEFAULT_TIMEOUT_MS": 30_000,
        "CRONWHEEL_WEBHOOK_MAX_RESPONSE_BYTES": 65_536,
        "CRONWHEEL_WEBHOOK_RETRY_AFTER_CAP_MS": 3_600_000,
        "CRONWHEEL_WEBHOOK_DB_WORKERS": 2,
        "CRONWHEEL_WEBHOOK_DB_GROUP": 128,
        "CRONWHEEL_WEBHOOK_BATCH": 500,
        "CRONWHEEL_WEBHOOK_MAX_WAITING_PER_PARTITION": 1000,
        "CRONWHEEL_WEBHOOK_SHUTDOWN_GRACE_MS": 10_000,
        "CRONWHEEL_WEBHOOK_KEEPALIVE_MS": 30_000,
        "CRONWHEEL_WEBHOOK_FETCH_WATCH_MS": 15_000,
    },
    "executor": {
        **COMMON,
        **METRICS,
        "CRONWHEEL_EXECUTOR_CONCURRENCY": 4,
        "CRONWHEEL_EXECUTOR_TENANT_CONCURRENCY": 2,
        "CRONWHEEL_EXECUTOR_SESSION_TIMEOUT_MS": 10_000,
        "CRONWHEEL_EXECUTOR_SHUTDOWN_GRACE_MS": 10_000,
        "CRONWHEEL_EXECUTOR_FETCH_WATCH_S": 15.0,
        "CRONWHEEL_EXECUTOR_ALLOW_NETWORK": False,
        "CRONWHEEL_EXECUTOR_MEMORY_MB": 512,
        "CRONWHEEL_EXECUTOR_MAX_MEMORY_MB": 4096,
        "CRONWHEEL_EXECUTOR_CPU_MS": 600_000,
        "CRONWHEEL_EXECUTOR_MAX_CPU_MS": 86_400_000,
        "CRONWHEEL_EXECUTOR_PIDS": 64,
        "CRONWHEEL_EXECUTOR_MAX_PIDS": 1024,
        "CRONWHEEL_EXECUTOR_FSIZE_MB": 64,
        "CRONWHEEL_EXECUTOR_NOFILE": 256,
        "CRONWHEEL_EXECUTOR_SCRATCH_MB": 64,
        "CRONWHEEL_EXECUTOR_MAX_WALL_MS": 3_600_000,
        "CRONWHEEL_EXECUTOR_UID_BASE": 200_000,
        "CRONWHEEL_EXECUTOR_UID_RANGE": 10_000,
        "CRONWHEEL_EXECUTOR_CGROUP": None,
        "CRONWHEEL_EXECUTOR_LOCK_DIR": None,
        "CRONWHEEL_EXECUTOR_EGRESS_ALLOW": (),
        "CRONWHEEL_EXECUTOR_EGRESS_DNS": None,
        "CRONWHEEL_EXECUTOR_EGRESS_SUBNET": "10.254.0.0/16",
    },
}
STACK = {
    "CRONWHEEL_HOME": None,
    "CRONWHEEL_PG_PORT": 25432,
    "CRONWHEEL_KAFKA_PORT": 29092,
    "CRONWHEEL_KAFKA_CONTROLLER_PORT": 29093,
    "CRONWHEEL_KAFKA_JVM_OPTS": None,
}


def flat(settings) -> dict:
    """{variable: value} of a settings object, its groups' included."""
    out = {}
    for f in dataclasses.fields(settings):
        value = getattr(settings, f.name)
        if "group" in f.metadata:
            out.update(flat(value))
        else:
            out[f.metadata["setting"].env] = value
    return out


@pytest.fixture
def no_stack_ports(monkeypatch):
    """The database and broker defaults follow the stack's ports: unset them."""
    for name in ("CRONWHEEL_PG_PORT", "CRONWHEEL_KAFKA_PORT"):
        monkeypatch.delenv(name, raising=False)


def test_services__each_has_a_settings_class_in_its_main():
    assert set(DEFAULTS) == set(SERVICES)
    for name in SERVICES:
        assert dataclasses.is_dataclass(service_settings(name)), name


@pytest.mark.parametrize("service", SERVICES)
def test_load__nothing_set__the_public_defaults(service, no_stack_ports):
    cls = service_settings(service)
    assert flat(config.load(cls, {})) == DEFAULTS[service]
    assert dict(config.variables(cls)) == DEFAULTS[service]


def test_load__stack_nothing_set__the_public_defaults():
    assert flat(config.load(config.Stack, {})) == STACK


@pytest.mark.parametrize(
    ("service", "env", "raw", "message"),
    [
        ("timer", "CRONWHEEL_TIMER_BATCH", "abc", "expected an integer >= 1"),
        ("timer", "CRONWHEEL_FIRE_AHEAD_MS", "-5", "expected an integer >= 0"),
        ("relay", "CRONWHEEL_LEASE_TTL_MS", "1.5", "expected an integer >= 1"),
        ("gateway", "CRONWHEEL_RATE_LIMIT", "0", "expected a number > 0"),
        ("gateway", "CRONWHEEL_RATE_BURST", "nan", "expected a number >= 1"),
        ("gateway", "CRONWHEEL_GATEWAY_WORKERS", "0", "expected an integer >= 1"),
        ("gateway", "CRONWHEEL_GATEWAY_FASTPATH", "maybe", "expected 1 or 0 (true/false"),
        ("gateway", "CRONWHEEL_HTTP_ADDR", "localhost", "expected host:port"),
        ("gateway", "CRONWHEEL_WEBHOOK_ALLOW_CIDRS", "10.0.0.0/8,x", "expected comma-separated"),
        ("webhook", "CRONWHEEL_WEBHOOK_DB_GROUP", "129", "expected an integer from 1 to 128"),
        ("executor", "CRONWHEEL_EXECUTOR_ALLOW_NETWORK", "2", "expected 1 or 0"),
        ("dispatcher", "CRONWHEEL_METRICS_PORT", "70000", "expected a TCP port (1-65535)"),
        ("workflow", "CRONWHEEL_LOG_LEVEL", "loud", "expected one of DEBUG, INFO, WARNING"),
    ],
)
def test_load__bad_value__one_line_naming_the_variable_and_what_it_accepts(
    service, env, raw, message
):
    with pytest.raises(SettingsError) as e:
        config.load(service_settings(service), {env: raw})
    text = str(e.value)
    assert text.startswith(f"{env}={raw!r}: {message}")
    assert "\n" not in text


def test_load__values_given__typed():
    got = config.load(
        service_settings("gateway"),
        {
            "CRONWHEEL_RATE_LIMIT": "2.5",
            "CRONWHEEL_GATEWAY_FASTPATH": "off",
            "CRONWHEEL_GATEWAY_WORKERS": " 3 ",
            "CRONWHEEL_LOG_LEVEL": "warning",
            "CRONWHEEL_WEBHOOK_ALLOW_CIDRS": "127.0.0.0/8, ::1/128",
            "DATABASE_URL": "postgresql://elsewhere/db",
        },
    )
    assert (got.rate_limit, got.fastpath, got.workers) == (2.5, False, 3)
    assert got.common.log_level == "WARNING"
    assert got.common.database_url == "postgresql://elsewhere/db"
    assert [str(n) for n in got.destinations.allow] == ["127.0.0.0/8", "::1/128"]


def test_load__empty_value__is_the_default():
    got = config.load(
        service_settings("timer"), {"CRONWHEEL_TIMER_BATCH": "", "KAFKA_BOOTSTRAP": " "}
    )
    assert got.batch == 500
    assert got.common.kafka_bootstrap == config.local_kafka_bootstrap()


def test_webhook_tuning__one_variable_per_field_of_the_service_settings__same_defaults():
    tuning = {f.name: f.default for f in dataclasses.fields(TuningSettings)}
    assert tuning == dataclasses.asdict(WebhookTunables())


def test_executor_sandbox__one_variable_per_policy_field__same_defaults():
    sandbox = {f.name: f.default for f in dataclasses.fields(SandboxSettings)}
    assert sandbox == dataclasses.asdict(Policy())


def serve(*names: str, **env: str) -> subprocess.CompletedProcess:
    """`cronwheel serve NAMES` with `env` added, to its exit."""
    return subprocess.run(
        [sys.executable, "-m", "services.entrypoints", "serve", *names],
        env={**os.environ, "CRONWHEEL_LOG_LEVEL": "INFO", **env},
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )


def test_serve__bad_value__exit_1_and_one_line():
    p = serve("timer", CRONWHEEL_TIMER_BATCH="lots")
    assert p.returncode == 1
    assert p.stderr == "cronwheel: CRONWHEEL_TIMER_BATCH='lots': expected an integer >= 1\n"


def test_serve_several__one_bad__none_starts():
    # Checked before the supervisor starts (its state would go to CRONWHEEL_HOME).
    p = serve("timer", "relay", CRONWHEEL_RELAY_BATCH="0", CRONWHEEL_HOME="/nonexistent/cw")
    assert p.returncode == 1
    assert p.stderr == "cronwheel: CRONWHEEL_RELAY_BATCH='0': expected an integer >= 1\n"


# -- docs/settings.md -------------------------------------------------------------


def documented() -> dict[str, str]:
    """{variable: default cell} from the table in docs/settings.md."""
    rows = {}
    for line in (ROOT / "docs" / "settings.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and (m := re.fullmatch(r"`([A-Z0-9_]+)`", cells[0])):
            assert m[1] not in rows, f"{m[1]} is listed twice"
            rows[m[1]] = cells[2]
    return rows


def read_in_code() -> set[str]:
    """Every variable the platform's code reads by name: a literal passed to
    `.get`, `getenv` or `setting`, an `environ[...]`, or a module constant
    holding one. (The SDK, a library with its own arguments, is not scanned;
    a name built in an f-string is not seen, which the settings classes cover.)"""
    names = set()
    files = [*(ROOT / "cronwheel").rglob("*.py"), *(ROOT / "services").rglob("*.py")]
    for path in files:
        if "sdk" in path.relative_to(ROOT).parts:
            continue
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            lit = None
            if isinstance(node, ast.Call) and node.args:
                fn = node.func
                called = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", None)
                if called in ("get", "getenv", "setting"):
                    lit = node.args[0]
            elif isinstance(node, ast.Subscript):
                target = node.value
                name = target.attr if isinstance(target, ast.Attribute) else None
                if name == "environ":
                    lit = node.slice
            elif isinstance(node, ast.Assign) and node in tree.body:
                lit = node.value
            if isinstance(lit, ast.Constant) and NAME.match(str(lit.value)):
                names.add(lit.value)
    return names


def test_docs_table__lists_every_variable_the_code_reads():
    table = documented()
    declared = {env for service in DEFAULTS.values() for env in service} | set(STACK)
    assert declared - set(table) == set()
    assert read_in_code() - set(table) == set()


def test_docs_table__lists_nothing_the_code_does_not_read():
    declared = {env for service in DEFAULTS.values() for env in service} | set(STACK)
    assert set(documented()) - declared - read_in_code() == set()


def _cell_for(default) -> str | None:
    """How the table writes a default (None: in words, not compared)."""
    if default is None or default == ():
        return "unset"
    if isinstance(default, bool):
        return f"`{int(default)}`"
    if isinstance(default, float) and default.is_integer():
        return f"`{int(default)}`"
    if isinstance(default, int | str):
        return f"`{default}`"
    return None


def test_docs_table__defaults_are_the_codes(no_stack_ports):
    table = documented()
    defaults = {**STACK}
    for service in SERVICES:
        defaults.update(config.variables(service_settings(service)))
    for env, default in defaults.items():
        if env in ("DATABASE_URL", "KAFKA_BOOTSTRAP"):
            assert COMMON[env] in table[env]
            continue
        want = _cell_for(default)
        assert table[env].startswith(want), (env, table[env], want)
