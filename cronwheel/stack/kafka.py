"""A single-node Apache Kafka broker in KRaft combined mode, for the local stack.

The broker's jars come from Maven Central via `mvn dependency:copy-dependencies`
into a per-user cache, storage is formatted once, and the JVM runs detached on
loopback. Kafka 4.1.1: both clients we use speak it (confluent-kafka 2.16 and
aiokafka 0.14 under faust-streaming; checked by tests/integration/test_kafka_clients.py).
CRONWHEEL_KAFKA_JVM_OPTS replaces the heap and collector options (`jvm_options`),
for measuring the broker under other settings.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import shutil
import subprocess
import uuid
from datetime import datetime
from pathlib import Path

from cronwheel import config, principals
from cronwheel.stack.process import (
    StackError,
    pid_alive,
    port_open,
    read_pid,
    require_command,
    run,
    stop_pid,
    wait_until,
)

KAFKA_VERSION = "4.1.1"
AUTH = "sasl-scram-sha-512"  # what the storage was formatted for (the `auth` marker)
POM = Path(__file__).with_name("kafka-pom.xml")

# One client listener with SASL SCRAM-SHA-512 (the broker's own connections
# too, as the super user), the controller's with PLAIN (KRaft's controller
# cannot check SCRAM: the credentials live in the metadata it serves), and
# the StandardAuthorizer denying whatever no ACL allows. No listener takes
# a client without credentials, and no topic is created by a client asking
# for it: cronwheel/principals.py says who may do what.
SERVER_PROPERTIES = """\
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:{controller_port}
listeners=CLIENT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}
advertised.listeners=CLIENT://127.0.0.1:{port}
controller.listener.names=CONTROLLER
listener.security.protocol.map=CLIENT:SASL_PLAINTEXT,CONTROLLER:SASL_PLAINTEXT
inter.broker.listener.name=CLIENT
sasl.enabled.mechanisms=SCRAM-SHA-512
sasl.mechanism.inter.broker.protocol=SCRAM-SHA-512
sasl.mechanism.controller.protocol=PLAIN
listener.name.client.sasl.enabled.mechanisms=SCRAM-SHA-512
listener.name.client.scram-sha-512.sasl.jaas.config=\
org.apache.kafka.common.security.scram.ScramLoginModule required \
username="{admin}" password="{admin_password}";
listener.name.controller.sasl.enabled.mechanisms=PLAIN
listener.name.controller.plain.sasl.jaas.config=\
org.apache.kafka.common.security.plain.PlainLoginModule required \
username="{admin}" password="{admin_password}" user_{admin}="{admin_password}";
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
super.users=User:{admin}
allow.everyone.if.no.acl.found=false
auto.create.topics.enable=false
log.dirs={log_dirs}
num.partitions=8
default.replication.factor=1
offsets.topic.replication.factor=1
offsets.topic.num.partitions=8
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
delete.topic.enable=true
log.retention.hours=24
log.segment.bytes=67108864
"""

LOG4J2 = """\
status = warn
appender.file.type = File
appender.file.name = file
appender.file.fileName = {log}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.file.ref = file
logger.kafka.name = kafka
logger.kafka.level = WARN
logger.server.name = kafka.server.KafkaServer
logger.server.level = INFO
"""


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "cronwheel" / f"kafka-{KAFKA_VERSION}"


def ensure_jars() -> Path:
    """Fetch the broker and its dependencies once; a marker file says it completed."""
    libs = cache_dir() / "libs"
    marker = cache_dir() / ".complete"
    if marker.exists():
        return libs
    require_command(
        "java", "install a JDK (17+) to run the local Kafka broker, or set KAFKA_BOOTSTRAP"
    )
    mvn = require_command("mvn", "install Maven to fetch the Kafka broker, or set KAFKA_BOOTSTRAP")
    libs.mkdir(parents=True, exist_ok=True)
    run(
        [
            mvn,
            "-q",
            "-B",
            "-f",
            str(POM),
            "dependency:copy-dependencies",
            f"-DoutputDirectory={libs}",
            "-DincludeScope=runtime",
        ],
        f"mvn fetching Kafka {KAFKA_VERSION}",
        timeout=900,
    )
    marker.write_text(KAFKA_VERSION + "\n")
    return libs


class LocalKafka:
    def __init__(self, home: Path):
        self.root = home / "kafka"
        self.data = self.root / "data"
        self.props = self.root / "server.properties"
        self.pidfile = self.root / "kafka.pid"
        self.log = self.root / "kafka.log"
        self.stdout = self.root / "kafka.out"
        self.gc_log = self.root / "gc.log"
        self.auth_marker = self.root / "auth"
        self.port = config.KAFKA_PORT
        self.controller_port = config.KAFKA_CONTROLLER_PORT

    @property
    def bootstrap(self) -> str:
        return config.LOCAL_KAFKA_BOOTSTRAP

    def gc_pauses(self, since_ms: float, until_ms: float) -> list[tuple[float, float]] | None:
        """The broker's stop-the-world collections that overlap [since_ms,
        until_ms], each (start ms, length ms), sorted, from its collector log
        and the files rotated from it; None where there is none."""
        files = sorted(self.gc_log.parent.glob(self.gc_log.name + "*"))
        if not files:
            return None
        pauses = set()
        for path in files:
            with contextlib.suppress(OSError):
                for line in path.read_text(errors="replace").splitlines():
                    if pause := gc_pause(line):
                        start, length = pause
                        if start <= until_ms and start + length >= since_ms:
                            pauses.add(pause)
        return sorted(pauses)

    def pid(self) -> int | None:
        pid = read_pid(self.pidfile)
        return pid if pid_alive(pid) else None

    def running(self) -> bool:
        return self.pid() is not None

    def up(self) -> None:
        if self.running():
            wait_until(self._answers, 60, "Kafka", on_fail=self._log_tail)
            # A broker already up gets them too: the topic prefix or the
            # roles may have changed since it started.
            self.grant()
            return
        java = require_command("java", "install a JDK (17+) or set KAFKA_BOOTSTRAP")
        libs = ensure_jars()
        for port in (self.port, self.controller_port):
            if port_open(port):
                raise StackError(
                    f"port {port} is taken by another process: set CRONWHEEL_KAFKA_PORT / "
                    "CRONWHEEL_KAFKA_CONTROLLER_PORT or KAFKA_BOOTSTRAP"
                )
        self.root.mkdir(parents=True, exist_ok=True)
        passwords = self._passwords()
        self._forget_storage_without_auth()
        self.props.write_text(
            SERVER_PROPERTIES.format(
                port=self.port,
                controller_port=self.controller_port,
                log_dirs=self.data,
                admin=principals.ADMIN,
                admin_password=passwords["admin"],
            )
        )
        self.props.chmod(0o600)
        log4j = self.root / "log4j2.properties"
        log4j.write_text(LOG4J2.format(log=self.log))
        classpath = f"{libs}/*"
        if not (self.data / "meta.properties").exists():
            cluster_id = _cluster_id()
            run(
                [
                    java,
                    "-cp",
                    classpath,
                    f"-Dlog4j2.configurationFile={log4j}",
                    "kafka.tools.StorageTool",
                    "format",
                    "-t",
                    cluster_id,
                    "-c",
                    str(self.props),
                    "--add-scram",
                    f"SCRAM-SHA-512=[name={principals.ADMIN},password={passwords['admin']}]",
                ],
                "formatting Kafka storage",
            )
            self.auth_marker.write_text(AUTH + "\n")
        with open(self.stdout, "ab") as out:
            proc = subprocess.Popen(
                [
                    java,
                    *jvm_options(),
                    gc_log_option(self.gc_log),
                    "-Djava.awt.headless=true",
                    f"-Dlog4j2.configurationFile={log4j}",
                    "-cp",
                    classpath,
                    "kafka.Kafka",
                    str(self.props),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=_more_open_files,
            )
        self.pidfile.write_text(f"{proc.pid}\n")

        def answers() -> bool:
            if proc.poll() is not None:
                raise StackError(
                    f"Kafka exited with code {proc.returncode}{self._log_tail(exited=True)}"
                )
            return self._answers()

        wait_until(answers, 90, "Kafka", on_fail=self._log_tail)
        self.grant()

    def grant(self) -> None:
        """The platform's principals and their ACLs for the configured topic
        prefix (idempotent: every `up` makes sure of them)."""
        from cronwheel.kafka import admin

        passwords = self._passwords()
        roles = {r: passwords[r] for r in principals.ROLES}
        prefix = config.load(config.Common).topic_prefix
        principals.grant_platform(admin(self.bootstrap, principal="admin"), prefix, roles)

    def _passwords(self) -> dict[str, str]:
        """Every local principal's password (the admin's and each role's), made
        on first use and kept in a file only this user can read."""
        path = config.local_kafka_credentials()
        try:
            have = json.loads(path.read_text())
        except FileNotFoundError:
            have = {"passwords": {}}
        old = have["passwords"]
        names = ("admin", *principals.ROLES)
        want = {
            "bootstrap": self.bootstrap,
            "passwords": {name: old.get(name) or principals.new_password() for name in names},
        }
        if want != have:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.touch(mode=0o600)
            tmp.write_text(json.dumps(want, indent=1) + "\n")
            tmp.replace(path)
        return want["passwords"]

    def _forget_storage_without_auth(self) -> None:
        """Storage formatted before the broker required SASL has no admin
        credentials: it is formatted again (the local stack's topics go)."""
        if (self.data / "meta.properties").exists() and not self.auth_marker.exists():
            print("cronwheel: the local Kafka storage predates SASL; formatting it again")
            shutil.rmtree(self.data)

    def _answers(self) -> bool:
        from confluent_kafka.admin import AdminClient

        from cronwheel.kafka import security

        conf = {
            "bootstrap.servers": self.bootstrap,
            "log_level": 0,
            **security("admin", self.bootstrap),
        }
        admin = AdminClient(conf)
        try:
            md = admin.list_topics(timeout=2)
        except Exception:
            return False
        return bool(md.brokers)

    def _log_tail(self, exited: bool = False) -> str:
        """The last error line of the broker's log, or of its standard output
        first when the JVM has exited: a JVM that refuses its options (an
        -Xlog file it cannot write) says so there, before Kafka's log exists,
        and kafka.log's last ERROR may be an earlier run's."""
        for path in (self.stdout, self.log) if exited else (self.log, self.stdout):
            try:
                lines = [ln for ln in path.read_text().splitlines() if ln.strip()]
            except OSError:
                continue
            errors = [ln for ln in lines if "error" in ln.lower() or "Exception" in ln]
            if errors or lines:
                return ": " + (errors or lines)[-1][:300]
        return ""

    def down(self) -> None:
        pid = self.pid()
        if pid:
            stop_pid(pid, timeout=30)
        self.pidfile.unlink(missing_ok=True)


def _cluster_id() -> str:
    """A random KRaft cluster id (URL-safe base64 of a UUID, as Kafka's own
    `random-uuid`). One in 64 starts with "-", which the storage tool's argument
    parser reads as an option ("--cluster-id: expected one argument"); Kafka's
    Uuid.randomUuid draws again in that case, and so do we."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cid.startswith("-"):
            return cid


def jvm_options() -> list[str]:
    """The broker's heap and collector: CRONWHEEL_KAFKA_JVM_OPTS (split on
    spaces) replaces the default."""
    raw = (config.load(config.Stack).kafka_jvm_opts or "").split()
    return raw or ["-Xms256m", "-Xmx1g", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20"]


def gc_log_option(path: Path) -> str:
    """The collector's pauses, one line each with its UTC end and length, in
    `path` (quoted: a path may hold a colon) and up to five files of 10 MB
    rotated from it, as Kafka's own start script logs them (`-loggc`): the
    benchmarks set their slowest seconds beside them (bench/common.py
    broker_pauses). G1 and Shenandoah log their pauses under the `gc` tag,
    ZGC under `gc+phases` (which adds G1 a few lines a pause). A few lines a
    second under load, so the files hold days."""
    return f'-Xlog:gc,gc+phases:file="{path}":utctime:filecount=5,filesize=10m'


# "[2026-12-06T18:49:58.079+0000] GC(24) Pause Young (Normal) (G1 Evacuation
# Pause) 1397M->175M(2048M) 29.230ms", or ZGC's "... GC(3) Pause Mark Start
# 0.025ms": stamped at the pause's end. G1's phase lines name no pause.
_PAUSE = re.compile(r"^\[([0-9T:.+-]+)\] GC\(\d+\) Pause .* ([0-9.]+)ms$")


def gc_pause(line: str) -> tuple[float, float] | None:
    """A collector log line's pause as (start ms since the epoch, length ms),
    or None for any other line."""
    if not (m := _PAUSE.match(line)):
        return None
    end = datetime.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S.%f%z").timestamp() * 1000
    length = float(m.group(2))
    return end - length, length


def _more_open_files() -> None:
    """In the broker before exec: as many open files as the kernel allows.
    Each partition keeps a log segment and two index files open, and with
    thousands of tenants the broker exhausted 20,000 descriptors ("Too many
    open files") and shut down once every log directory had failed.
    Root may raise the hard limit too; others raise the soft one to it."""
    import resource

    try:
        ceiling = int(Path("/proc/sys/fs/nr_open").read_text())
    except (OSError, ValueError):
        ceiling = 1 << 20
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (ceiling, ceiling))
    except (ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
