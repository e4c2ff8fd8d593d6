"""Settings: the environment variables the platform reads, typed, checked once at
start-up, each default in one place. docs/settings.md is the table of them all.

A service's settings are one frozen dataclass (in its `main.py`) whose fields are
`setting(...)`s, plus the groups below that several services share (`Common`,
`Metrics`, `Firing`). `load(TimerSettings)` reads the environment once; a value
the service cannot use raises SettingsError, whose message is one line naming
the variable and what it accepts (the `cronwheel` command prints it and exits 1).
An empty variable counts as unset.

The local stack's addresses are the defaults, so `DATABASE_URL` /
`KAFKA_BOOTSTRAP` switch the whole system to external servers in one place.
"""

from __future__ import annotations

import dataclasses
import math
import os
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import quote, urlsplit, urlunsplit

from cronwheel.core.ssrf import Network, allowed_networks

if TYPE_CHECKING:
    from cronwheel.core.sealing import Keyring

T = TypeVar("T")

PG_USER = "cronwheel"  # the local stack's owner of the tables: migrations, tools
PG_PASSWORD = "cronwheel"
PG_DATABASE = "cronwheel"
# The roles services log in as (migration 0018, docs/tenancy.md "Roles"), with
# the local stack's passwords (it listens on loopback only, as for PG_PASSWORD).
PG_PLATFORM_USER = "cronwheel_platform"
PG_GATEWAY_USER = "cronwheel_gateway"
LOCAL_ROLE_PASSWORDS = {
    PG_PLATFORM_USER: "cronwheel_platform",
    PG_GATEWAY_USER: "cronwheel_gateway",
}
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
LOG_FORMATS = ("text", "json")


class SettingsError(ValueError):
    """A variable's value the process cannot use: `NAME='value': expected ...`."""

    def __init__(self, env: str, raw: str, accepts: str):
        super().__init__(f"{env}={raw!r}: expected {accepts}")
        self.env = env
        self.raw = raw
        self.accepts = accepts


@dataclass(frozen=True)
class Setting:
    """What a settings field reads: the variable, and how its text becomes a value
    (None: by the field's type)."""

    env: str
    parse: Callable[[str], Any] | None = None
    accepts: str | None = None
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] | None = None
    secret: bool = False  # a bad value's error does not repeat it


def setting(
    env: str,
    default: Any = dataclasses.MISSING,
    *,
    default_factory: Any = dataclasses.MISSING,
    minimum: float | None = None,
    maximum: float | None = None,
    choices: tuple[str, ...] | None = None,
    parse: Callable[[str], Any] | None = None,
    accepts: str | None = None,
    secret: bool = False,
) -> Any:
    """A settings field read from `env`. Integers and numbers may carry a
    `minimum` and `maximum`, text its `choices` (matched without case; the value
    is the choice); `parse` (raising ValueError) with `accepts` for anything else."""
    meta = {"setting": Setting(env, parse, accepts, minimum, maximum, choices, secret)}
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def group(cls: type) -> Any:
    """A field holding a settings group that several services share."""
    return dataclasses.field(default_factory=cls, metadata={"group": cls})


def load(cls: type[T], env: Mapping[str, str] | None = None) -> T:
    """`cls` with every field read from `env` (default: the process's
    environment); SettingsError for the first value it cannot use."""
    env = os.environ if env is None else env
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if "group" in f.metadata:
            values[f.name] = load(f.metadata["group"], env)
            continue
        spec: Setting = f.metadata["setting"]
        raw = env.get(spec.env, "")
        if raw.strip():
            values[f.name] = _parse(spec, hints[f.name], raw)
    return cls(**values)


def variables(cls: type) -> Iterator[tuple[str, Any]]:
    """(variable, default) for every setting of `cls`, its groups' included."""
    for f in dataclasses.fields(cls):
        if "group" in f.metadata:
            yield from variables(f.metadata["group"])
        else:
            default = f.default
            if f.default_factory is not dataclasses.MISSING:
                default = f.default_factory()
            yield f.metadata["setting"].env, default


def _parse(spec: Setting, kind: Any, raw: str) -> Any:
    text = raw.strip()
    if spec.parse is not None:
        try:
            return spec.parse(text)
        except ValueError as e:
            if spec.secret:  # name the fault, never the value
                raise SettingsError(spec.env, "(not shown)", f"{spec.accepts} ({e})") from None
            raise SettingsError(spec.env, raw, spec.accepts or "a valid value") from None
    base = _without_none(kind)
    if spec.choices is not None:
        for choice in spec.choices:
            if text.upper() == choice.upper():
                return choice
        raise SettingsError(spec.env, raw, "one of " + ", ".join(spec.choices))
    if base is bool:
        if text.lower() in ("1", "true", "yes", "on"):
            return True
        if text.lower() in ("0", "false", "no", "off"):
            return False
        raise SettingsError(spec.env, raw, "1 or 0 (true/false, yes/no, on/off)")
    if base in (int, float):
        low, high = spec.minimum, spec.maximum
        what = "an integer" if base is int else "a number"
        if low is not None and high is not None:
            what += f" from {low:g} to {high:g}"
        elif low is not None:
            what += f" >= {low:g}"
        elif high is not None:
            what += f" <= {high:g}"
        try:
            value = base(text)
        except ValueError:
            raise SettingsError(spec.env, raw, what) from None
        if (
            not math.isfinite(value)
            or (low is not None and value < low)
            or (high is not None and value > high)
        ):
            raise SettingsError(spec.env, raw, what)
        return value
    if base is str:
        return text
    raise TypeError(f"{spec.env}: no parser for {kind!r}")


def _without_none(kind: Any) -> Any:
    """`int` for `int | None`; `kind` itself otherwise."""
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        return next(a for a in typing.get_args(kind) if a is not type(None))
    return kind


def host_port(text: str) -> str:
    """`host:port` (host may be empty or [v6]); ValueError otherwise."""
    _host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(text)
    return text


def port(text: str) -> int:
    n = int(text)
    if not 0 < n < 65536:
        raise ValueError(text)
    return n


PORT = "a TCP port (1-65535)"
HOST_PORT = "host:port"


# -- the local stack (`cronwheel up`) ------------------------------------------


@dataclass(frozen=True)
class Stack:
    """Where the local stack runs. Ports below Linux's ephemeral range
    (32768-60999): a client that keeps reconnecting to a stopped server on a
    port inside it can be handed that very port as its own, connect to itself,
    and hold the port (then TIME_WAIT for 60 s), so the next `cronwheel up`
    fails with "Address already in use"."""

    home: str | None = setting("CRONWHEEL_HOME", None)
    pg_port: int = setting("CRONWHEEL_PG_PORT", 25432, parse=port, accepts=PORT)
    kafka_port: int = setting("CRONWHEEL_KAFKA_PORT", 29092, parse=port, accepts=PORT)
    kafka_controller_port: int = setting(
        "CRONWHEEL_KAFKA_CONTROLLER_PORT", 29093, parse=port, accepts=PORT
    )
    # Split on spaces; unset: stack/kafka.py's heap and collector options.
    kafka_jvm_opts: str | None = setting("CRONWHEEL_KAFKA_JVM_OPTS", None)


@dataclass(frozen=True)
class KafkaAuth:
    """How this process authenticates to Kafka (docs/kafka-auth.md). Unset
    `username` on the local stack: each client takes its role's password from
    the stack's credentials file (`cronwheel up` writes it). In a deployment
    each service's environment holds its own principal: `username` and
    `password` (the ACLs of `cronwheel kafka grant` name `cronwheel-<role>`)."""

    security_protocol: str | None = setting(
        "CRONWHEEL_KAFKA_SECURITY_PROTOCOL",
        None,
        choices=("PLAINTEXT", "SASL_PLAINTEXT", "SASL_SSL", "SSL"),
    )
    mechanism: str = setting(
        "CRONWHEEL_KAFKA_SASL_MECHANISM",
        "SCRAM-SHA-512",
        choices=("SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN"),
    )
    username: str | None = setting("CRONWHEEL_KAFKA_USERNAME", None)
    password: str | None = setting("CRONWHEEL_KAFKA_PASSWORD", None, secret=True)
    ca_file: str | None = setting("CRONWHEEL_KAFKA_CA_FILE", None)
    # Off: the gateway creates no Kafka principal for a new tenant (an operator
    # provisions tenants' principals out of band).
    tenants: bool = setting("CRONWHEEL_KAFKA_TENANTS", True)


def local_kafka_credentials() -> Path:
    """The local stack's Kafka passwords by role (mode 0600), written by `cronwheel up`."""
    return project_home() / "kafka" / "principals.json"


def local_database_url() -> str:
    """The local stack's URL for the services: the platform's role."""
    return local_role_url(PG_PLATFORM_USER)


def local_role_url(user: str) -> str:
    """The local stack's URL as `user`: the owner (PG_USER) or a services' role."""
    password = PG_PASSWORD if user == PG_USER else LOCAL_ROLE_PASSWORDS[user]
    pg_port = _one(Stack, "pg_port")
    return f"postgresql://{user}:{password}@127.0.0.1:{pg_port}/{PG_DATABASE}"


def local_kafka_bootstrap() -> str:
    return f"127.0.0.1:{_one(Stack, 'kafka_port')}"


def __getattr__(name: str) -> Any:
    """PG_PORT, KAFKA_PORT, KAFKA_CONTROLLER_PORT, LOCAL_DATABASE_URL and
    LOCAL_KAFKA_BOOTSTRAP, read when asked (so a bad port is the command's
    one-line error, not an import's traceback)."""
    match name:
        case "PG_PORT":
            return load(Stack).pg_port
        case "KAFKA_PORT":
            return load(Stack).kafka_port
        case "KAFKA_CONTROLLER_PORT":
            return load(Stack).kafka_controller_port
        case "LOCAL_DATABASE_URL":
            return local_database_url()
        case "LOCAL_KAFKA_BOOTSTRAP":
            return local_kafka_bootstrap()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# -- what the services share -----------------------------------------------------


@dataclass(frozen=True)
class Common:
    """Every service: its servers, topic names and log level."""

    database_url: str = setting("DATABASE_URL", default_factory=local_database_url)
    kafka_bootstrap: str = setting("KAFKA_BOOTSTRAP", default_factory=local_kafka_bootstrap)
    topic_prefix: str = setting("CRONWHEEL_TOPIC_PREFIX", "cw")
    log_level: str = setting("CRONWHEEL_LOG_LEVEL", "INFO", choices=LOG_LEVELS)


@dataclass(frozen=True)
class Logs:
    """How every service writes its log lines (cronwheel/logs.py), read by
    runtime.setup_logging. Text by default: the readers a checkout has are a
    terminal (`cronwheel dev`, `cronwheel serve`) and tools that read text (the
    supervisor's last-line report of a death); a deployment's collector gets
    JSON by setting the variable (deploy/README.md, "Logs")."""

    format: str = setting("CRONWHEEL_LOG_FORMAT", "text", choices=LOG_FORMATS)


@dataclass(frozen=True)
class DatabaseRoles:
    """Beside the services' DATABASE_URL: the owner's URL, for what changes the
    schema or makes databases (`cronwheel migrate`, the tests' and benchmarks'
    databases), and the passwords `cronwheel migrate` gives the roles the
    services log in as (docs/tenancy.md, "Roles"). A password left unset leaves
    that role's login as it is."""

    admin_url: str | None = setting("CRONWHEEL_ADMIN_DATABASE_URL", None)
    platform_password: str | None = setting("CRONWHEEL_DB_PLATFORM_PASSWORD", None)
    gateway_password: str | None = setting("CRONWHEEL_DB_GATEWAY_PASSWORD", None)


@dataclass(frozen=True)
class Metrics:
    """Where a service other than the gateway serves /metrics: `addr`
    (host:port, one service per container), else 127.0.0.1 at `port` plus the
    service's offset (`cronwheel dev`), else nowhere."""

    addr: str | None = setting("CRONWHEEL_METRICS_ADDR", None, parse=host_port, accepts=HOST_PORT)
    port: int | None = setting("CRONWHEEL_METRICS_PORT", None, parse=port, accepts=PORT)
    # librdkafka's statistics of the services' producers, every this many ms
    # (cronwheel/kafka_stats.py); 0: off.
    kafka_stats_ms: int = setting("CRONWHEEL_KAFKA_STATS_MS", 0, minimum=0, maximum=86_400_000)


@dataclass(frozen=True)
class Firing:
    """The timer's and the relay's: partition leases and firing ahead."""

    lease_ttl_ms: int = setting("CRONWHEEL_LEASE_TTL_MS", 10_000, minimum=1)
    # How long before a job's instant the timer may create its run
    # (docs/architecture.md, "Firing ahead"); the relay publishes it at the
    # instant. 0: create each run at its instant.
    fire_ahead_ms: int = setting("CRONWHEEL_FIRE_AHEAD_MS", 1_000, minimum=0)


@dataclass(frozen=True)
class Processed:
    """The dispatcher's and the workflow service's record of what they consumed."""

    # How long a (run_id, attempt) stays recorded as processed (7 days): longer
    # than any topic keeps a record (the local broker keeps 24 h), so a
    # redelivery always finds its row.
    retention_ms: int = setting("CRONWHEEL_PROCESSED_RETENTION_MS", 7 * 86_400_000, minimum=1)


@dataclass(frozen=True)
class ProducerRenewal:
    """The relay's and the dispatcher's producers: how many each sends
    through (cronwheel.producer_shards), and made anew when most topics they
    met went quiet (cronwheel.topics_met)."""

    # Producers, each a connection the broker serves beside the others; a
    # topic always goes through the same one.
    shards: int = setting("CRONWHEEL_PRODUCER_SHARDS", 4, minimum=1, maximum=32)
    # One more producer for at most this many of the busiest topics, those at
    # CRONWHEEL_PRODUCER_HOT_RATE records a second or more (the others'
    # producers walk every idle tenant's partitions per record); 0: none.
    hot_topics: int = setting("CRONWHEEL_PRODUCER_HOT_TOPICS", 16, minimum=0, maximum=1024)
    hot_rate: float = setting("CRONWHEEL_PRODUCER_HOT_RATE", 20.0, minimum=0.1)

    # How often a producer is looked at; 0: never renewed.
    every_s: float = setting("CRONWHEEL_PRODUCER_RENEW_S", 600.0, minimum=0)
    # Renewed only once it has met at least this many topics, at most half of
    # them used since the last look.
    at_least_topics: int = setting("CRONWHEEL_PRODUCER_RENEW_TOPICS", 500, minimum=1)


# The longest a tenant's own run retention may be (tenants.run_retention_days).
MAX_RUN_RETENTION_DAYS = 3650


@dataclass(frozen=True)
class RunRetention:
    """Run history's retention (docs/migrations.md, "Worked example: run
    retention"): `cronwheel retention` drops the days past it, the gateway's
    run reads stop at it."""

    # Days a run is kept after its scheduled instant, unless its tenant has a
    # `run_retention_days` of its own; a run not yet finished is kept anyway.
    days: int = setting(
        "CRONWHEEL_RUN_RETENTION_DAYS", 30, minimum=1, maximum=MAX_RUN_RETENTION_DAYS
    )
    # Day partitions `cronwheel retention` keeps made ahead of today.
    ahead_days: int = setting("CRONWHEEL_RUN_PARTITIONS_AHEAD_DAYS", 7, minimum=1, maximum=90)


def _cidrs(text: str) -> tuple[Network, ...]:
    return tuple(allowed_networks(text))


@dataclass(frozen=True)
class Destinations:
    """Where webhooks may go beyond public addresses: the gateway checks a job's
    URL against it, the webhook service every connection (core/ssrf.py)."""

    allow: tuple[Network, ...] = setting(
        "CRONWHEEL_WEBHOOK_ALLOW_CIDRS",
        (),
        parse=_cidrs,
        accepts="comma-separated CIDRs, e.g. 10.0.0.0/8,fd00::/8",
    )


@dataclass(frozen=True)
class Serving:
    """The gateway's address and the cell it serves (`cronwheel dev` prints the
    address too)."""

    cell: str = setting("CRONWHEEL_CELL", "local")
    http_addr: str = setting(
        "CRONWHEEL_HTTP_ADDR", "127.0.0.1:8080", parse=host_port, accepts=HOST_PORT
    )


@dataclass(frozen=True)
class Cells:
    """The directory of cells (docs/cells.md), for the gateways and the router.
    Unset `directory_url`: one cell, no directory (a gateway serves every
    tenant its database has, as before cells)."""

    directory_url: str | None = setting("CRONWHEEL_DIRECTORY_URL", None)
    # How long a directory answer is used before it is read again; while the
    # directory is away, the last answer is used on (cronwheel/directory.py).
    directory_ttl_ms: int = setting("CRONWHEEL_DIRECTORY_TTL_MS", 5_000, minimum=0)


@dataclass(frozen=True)
class Secrets:
    """The keys that seal secrets at rest (webhook signing secrets): the first
    seals, all of them open (cronwheel/core/sealing.py). Unset: one key generated
    on first use and kept in the stack's state directory (`.cronwheel/secret-keys`),
    which suits one machine only: every process of a deployment needs the same
    keys, so deploy/ sets the variable."""

    keys: tuple | None = setting(
        "CRONWHEEL_SECRET_KEYS",
        None,
        parse=lambda text: _sealing().parse_keys(text),
        accepts="comma-separated KEY_ID:KEY (KEY: base64 of 32 random bytes), the first seals",
        secret=True,
    )


def _sealing():
    """cronwheel.core.sealing, imported when keys are wanted (it loads
    `cryptography`, which the services that seal nothing need not)."""
    from cronwheel.core import sealing

    return sealing


_keyring: Keyring | None = None


def secret_keyring() -> Keyring:
    """The process's keyring, read once: CRONWHEEL_SECRET_KEYS, else the local
    stack's generated key. SettingsError (one line, no key material) for a bad value."""
    global _keyring
    if _keyring is None:
        keys = _one(Secrets, "keys")
        if keys is None:
            keys = _sealing().parse_keys(_local_secret_keys())
        _keyring = _sealing().Keyring(keys)
    return _keyring


def deployment_secret_keys() -> str:
    """The keys every process of this deployment seals with, as text:
    CRONWHEEL_SECRET_KEYS, else the local stack's key file. A local cell's
    services are given these (cronwheel/stack/cells.py), not their cell home's:
    the router's mover opens what a cell's gateway sealed."""
    return os.environ.get("CRONWHEEL_SECRET_KEYS", "").strip() or _local_secret_keys()


def _local_secret_keys() -> str:
    """The local stack's key file, made (mode 0600) with one fresh key if absent."""
    sealing = _sealing()
    path = project_home() / "secret-keys"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        material = sealing.new_key()
        raw = sealing.parse_keys(f"x:{material}")[0].secret
        tmp = path.with_name(f".secret-keys.{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(f"{sealing.derived_id(raw)}:{material}\n")
        try:
            os.link(tmp, path)  # first writer wins; the others read its key
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
    return path.read_text().strip()


# -- one value, for callers outside a service (the CLI, tests, benchmarks) -------


def project_home() -> Path:
    """Where the local stack keeps its state: `CRONWHEEL_HOME`, else `.cronwheel/`
    beside the checkout this package runs from, else in the working directory."""
    if home := _one(Stack, "home"):
        return Path(home).resolve()
    checkout = Path(__file__).resolve().parents[1]
    if (checkout / "pyproject.toml").exists():
        return checkout / ".cronwheel"
    return Path.cwd() / ".cronwheel"


def database_url() -> str:
    """The owner's URL, for the tools (see DatabaseRoles; services take theirs
    from Common): CRONWHEEL_ADMIN_DATABASE_URL, else DATABASE_URL when set (a
    deployment whose one URL is the owner's), else the local stack's owner."""
    if admin := _one(DatabaseRoles, "admin_url"):
        return admin
    if external_database():
        return _one(Common, "database_url")
    return local_role_url(PG_USER)


def role_url(url: str, role: str) -> str:
    """`url` (same server and database) logged in as a services' role, with its
    password from CRONWHEEL_DB_*_PASSWORD, else the local stack's."""
    password = {**LOCAL_ROLE_PASSWORDS, **role_passwords()}[role]
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    login = f"{quote(role, safe='')}:{quote(password, safe='')}@{host}"
    return urlunsplit(parts._replace(netloc=login))


def role_passwords() -> dict[str, str]:
    """{role: password} for the services' roles: those the environment sets
    (CRONWHEEL_DB_*_PASSWORD), over the local stack's where the database is
    the local stack's (no DATABASE_URL)."""
    roles = load(DatabaseRoles)
    given = {PG_PLATFORM_USER: roles.platform_password, PG_GATEWAY_USER: roles.gateway_password}
    local = {} if external_database() else LOCAL_ROLE_PASSWORDS
    return {**local, **{role: password for role, password in given.items() if password}}


def kafka_bootstrap() -> str:
    return _one(Common, "kafka_bootstrap")


def external_database() -> bool:
    return bool(os.environ.get("DATABASE_URL", "").strip())


def external_kafka() -> bool:
    return bool(os.environ.get("KAFKA_BOOTSTRAP", "").strip())


def fire_ahead_ms() -> int:
    return _one(Firing, "fire_ahead_ms")


def cell() -> str:
    return _one(Serving, "cell")


def http_addr() -> str:
    return _one(Serving, "http_addr")


def _one(cls: type, name: str) -> Any:
    """One field of `cls`, read and checked alone."""
    f = next(f for f in dataclasses.fields(cls) if f.name == name)
    spec: Setting = f.metadata["setting"]
    raw = os.environ.get(spec.env, "")
    if raw.strip():
        return _parse(spec, typing.get_type_hints(cls)[name], raw)
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
