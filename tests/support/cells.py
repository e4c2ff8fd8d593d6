"""Two cells on this machine, as `cronwheel up --cells us,eu` makes them: each
its own PostgreSQL cluster and Kafka broker, the directory's database on the
default cluster, services per cell (`cronwheel serve --cell NAME ...`) and
the router on the public address (docs/cells.md). Used by the tests of
tests/e2e/cells/, which share one (its conftest.py).

Everything runs in a private CRONWHEEL_HOME on private ports (base 27432 /
28092 / 28093, router 28080; the cells at +10 and +20), never the shared dev
stack. Bringing up two more clusters and brokers takes about a minute on this
machine, so the package does it once, and a file lock keeps two runs off the
same ports.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path
from urllib.parse import quote

import httpx
from confluent_kafka import KafkaException
from confluent_kafka.admin import (
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    ResourcePatternType,
    ResourceType,
)

from cronwheel import kafka, principals
from cronwheel.stack.postgres import SERVICE_USER, data_root, ensure_installed
from cronwheel.stack.process import as_user, is_root, port_open
from tests.support.procs import PYTHON, ROOT
from tests.support.wait import wait_for

BASE = {
    "CRONWHEEL_PG_PORT": "27432",
    "CRONWHEEL_KAFKA_PORT": "28092",
    "CRONWHEEL_KAFKA_CONTROLLER_PORT": "28093",
    "CRONWHEEL_HTTP_ADDR": "127.0.0.1:28080",
}
PORTS = (
    27432, 27442, 27452, 28102, 28103, 28112, 28113, 28080, 28090, 28100, 28081, 28077, 28082,
    28067,
)  # fmt: skip
ROUTER = "http://127.0.0.1:28080"
OPERATOR_KEY = "cwop_cells_" + uuid.uuid4().hex
_FOREIGN = (
    "DATABASE_URL",
    "KAFKA_BOOTSTRAP",
    "CRONWHEEL_ADMIN_DATABASE_URL",
    "CRONWHEEL_HOME",
    "CRONWHEEL_METRICS_PORT",
    "CRONWHEEL_DIRECTORY_URL",
)
_LOCK = Path(tempfile.gettempdir()) / "cronwheel-cells-test.lock"


class Cells:
    """The private stack with two cells, its services and the router."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.home = Path(tempfile.mkdtemp(prefix="cw-cells-"))
        self.home.chmod(0o755)  # PostgreSQL's user (we may be root) reaches the clusters
        self.env = {k: v for k, v in os.environ.items() if k not in _FOREIGN}
        self.env.update(
            BASE,
            CRONWHEEL_HOME=str(self.home),
            CRONWHEEL_OPERATOR_KEY=OPERATOR_KEY,
            # Two brokers beside the shared one: smaller heaps.
            CRONWHEEL_KAFKA_JVM_OPTS="-Xms128m -Xmx512m -XX:+UseG1GC",
            # Short, so the tests see the cache read the directory again (and
            # fail to, while it is stopped).
            CRONWHEEL_DIRECTORY_TTL_MS="300",
            # A move's end waits this long for queues no test worker reads.
            CRONWHEEL_MOVE_LINGER_S="10",
            CRONWHEEL_GATEWAY_WORKERS="1",
            PYTHONUNBUFFERED="1",
        )
        self.status: dict = {}
        self.procs: list[subprocess.Popen] = []

    def cli(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run(
            [PYTHON, "-m", "services.entrypoints", *args],
            env=self.env, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip

    def up(self) -> None:
        done = self.cli("up", "--cells", "us,eu", "--json")
        assert done.returncode == 0, done.stderr
        migrated = self.cli("migrate")
        assert migrated.returncode == 0, migrated.stderr
        self.status = json.loads(self.cli("status", "--json").stdout)

    def serve(self, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
        """`cronwheel serve *args` in this stack's home (`env`: settings beside)."""
        name = "-".join(args)
        with (self.logs / f"{name}.log").open("ab") as log:
            self.procs.append(
                subprocess.Popen(
                    [PYTHON, "-m", "services.entrypoints", "serve", *args],
                    env={**self.env, **(env or {})},
                    cwd=ROOT,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )  # fmt: skip
            )
        return self.procs[-1]

    def start_services(self, services: tuple[str, ...] = ("gateway", "dispatcher")) -> None:
        """Per cell one `serve --cell NAME *services`: with more than one, the
        supervisor's, which starts a service again if it dies."""
        for cell in ("us", "eu"):
            self.serve("--cell", cell, *services)
        self.serve("router")
        self.router = self.procs[-1]
        for url in [ROUTER, *(c["api_url"] for c in self.status["cells"].values())]:
            wait_for(lambda u=url: ready(u), 120, 0.2, f"{url} to be ready")

    def restart_router(self, env: dict[str, str] | None = None) -> None:
        """kill -9 the router (and a move it was running with it), then start
        another (`env`: settings beside), which resumes the open moves
        (services/router/moves.py)."""
        os.killpg(self.router.pid, 9)
        self.router.wait(10)
        self.serve("router", env=env)
        self.router = self.procs[-1]
        wait_for(lambda: ready(ROUTER), 60, 0.2, "the new router to be ready")

    def cell(self, name: str) -> dict:
        return self.status["cells"][name]

    def service_pid(self, cell: str, service: str) -> int:
        """The pid of `service` in `cell` (the supervisor's child running
        `serve SERVICE` in that cell's environment)."""
        home = f"CRONWHEEL_HOME={self.cell(cell)['home']}".encode()
        found = []
        for proc in Path("/proc").iterdir():
            try:
                argv = (proc / "cmdline").read_bytes().split(b"\0")
                if argv[-3:] != [b"serve", service.encode(), b""]:
                    continue
                if home in (proc / "environ").read_bytes().split(b"\0"):
                    found.append(int(proc.name))
            except (OSError, ValueError):  # gone meanwhile, or not a process
                continue
        assert len(found) == 1, f"{service} processes of cell {cell}: {found}"
        return found[0]

    def kafka_admin(self, name: str):
        """The cell's broker as its admin (the password from the cell's own file)."""
        who = kafka.Credentials(principals.ADMIN, self.kafka_admin_password(name))
        return kafka.admin(self.cell(name)["kafka_bootstrap"], principal=who)

    def kafka_admin_password(self, name: str) -> str:
        home = Path(self.cell(name)["home"])
        return json.loads((home / "kafka" / "principals.json").read_text())["passwords"]["admin"]

    def kafka_of(self, cell: str, tenant_id: str) -> dict:
        """What the cell's broker holds of the tenant: its topics, its
        principal's SCRAM credentials and how many ACLs name it."""
        admin = self.kafka_admin(cell)
        topics = sorted(t for t in admin.list_topics(timeout=10).topics if f".{tenant_id}" in t)
        user = principals.tenant_username(tenant_id)
        try:
            described = admin.describe_user_scram_credentials([user])[user].result()
            creds = [user] if described.scram_credential_infos else []
        except KafkaException as e:  # RESOURCE_NOT_FOUND: the broker has no such user
            assert "RESOURCE_NOT_FOUND" in str(e) or "not found" in str(e).lower(), e
            creds = []
        acl_filter = AclBindingFilter(
            ResourceType.ANY, None, ResourcePatternType.ANY, f"User:{user}", None,
            AclOperation.ANY, AclPermissionType.ANY,
        )  # fmt: skip
        acls = admin.describe_acls(acl_filter, request_timeout=10).result()
        return {"topics": topics, "credentials": creds, "acls": len(acls)}

    def deployment_router_env(self) -> dict[str, str]:
        """The settings a deployment's router names the cells with (no
        cells.json read): each cell's database as its owner and its broker as
        its admin (CRONWHEEL_CELL_DATABASES, CRONWHEEL_CELL_BROKERS)."""
        names = ("us", "eu")
        admin = principals.ADMIN
        brokers = (
            f"{c}={admin}:{quote(self.kafka_admin_password(c), safe='')}"
            f"@{self.cell(c)['kafka_bootstrap']}"
            for c in names
        )
        return {
            "CRONWHEEL_CELL_DATABASES": ",".join(
                f"{c}={self.cell(c)['admin_database_url']}" for c in names
            ),
            "CRONWHEEL_CELL_BROKERS": ",".join(brokers),
            "CRONWHEEL_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
        }

    def directory_pg(self, verb: str) -> None:
        """`pg_ctl stop` the directory's cluster (the default one, no cell's);
        `start` brings it back with `cronwheel up` (idempotent)."""
        if verb == "start":
            done = self.cli("up")
            assert done.returncode == 0, done.stderr
            return
        data = data_root(self.home) / "data"
        owner = SERVICE_USER if is_root() else None
        argv = [str(ensure_installed() / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"]
        subprocess.run(as_user(owner, argv), check=True, capture_output=True, timeout=60)

    def close(self) -> None:
        for p in self.procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, 15)
        for p in self.procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, 9)
                p.wait(5)
        self.cli("down")
        shutil.rmtree(self.home, ignore_errors=True)


def bearer(key: str) -> dict:
    return {"Authorization": f"Bearer {key}"}


def new_tenant(cell: str, name: str = "tenant") -> dict:
    """A tenant homed in `cell`, made through the router as the operator: the
    answer of POST /v1/tenants (its key, its Kafka credentials)."""
    body = {"name": f"{name}-{uuid.uuid4().hex[:6]}", "cell": cell}
    answer = httpx.post(f"{ROUTER}/v1/tenants", json=body, headers=bearer(OPERATOR_KEY), timeout=60)
    assert answer.status_code == 201, answer.text
    return answer.json()


def ready(base: str) -> bool:
    try:
        return httpx.get(f"{base}/readyz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@contextlib.contextmanager
def two_cells(logs: Path, services: tuple[str, ...] = ("gateway", "dispatcher")):
    """The private stack with two cells, `services` in each and the router."""
    with open(_LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another module or run holds the ports: wait
        taken = [p for p in PORTS if port_open(p)]
        assert not taken, f"ports {taken} are taken: the two cells need them"
        st = Cells(logs)
        try:
            st.up()
            st.start_services(services)
            yield st
        finally:
            st.close()


def tenant_rows(url: str, tenant_id: str, tables: tuple[str, ...]) -> dict[str, int]:
    """How many of the tenant's rows each of `tables` has in one cell's database."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        return {
            table: conn.execute(
                f"SELECT count(*) FROM {table} WHERE tenant_id = %s", [tenant_id]
            ).fetchone()[0]
            for table in tables
        }
