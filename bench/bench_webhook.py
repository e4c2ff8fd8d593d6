"""Webhook deliveries: `cronwheel serve webhook` as a process, delivering to a
local receiver. Target: at least 2,000 deliveries/s; p99 delivery latency; and
critical runs delivered ahead of a backlog of normal ones.

Runs are created in the database as the timer creates them (insert_runs, one
webhook job with a signing secret) and their RunReady records are produced to
the tenant's webhook topic as the dispatcher forwards them (byte for byte), so
the service does everything it does in production per delivery: look the run
up, StartRun, sign, POST, classify, CompleteRun.

- burst: N records produced at once; deliveries/s = N / (first record produced
  -> last run SUCCEEDED in the database).
- paced: records produced at a steady rate below the burst rate; delivery
  latency = receiver got the request - record produced (as the dispatcher
  forwards a due run: what the webhook service adds), and completion latency
  = run's finished_at - record produced.
- backlog: `--backlog` normal records produced at once, then 50 critical, each
  in its class's partitions as the dispatcher places them: how long after
  they were produced the critical ones reach the receiver, and how many normal
  ones go first (docs/priority.md).

The receiver is a raw asyncio protocol in a process of its own, its CPU
printed apart: it must not be what limits the figures. Two service processes
by default, one per core, as it is deployed: one process is one GIL, and its
event loop and database threads share it.

Usage: bench_webhook.py [--burst N] [--paced N] [--rate R] [--backlog N] [--instances K]
                        [--service-root CHECKOUT (services from another tree, to compare)]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psycopg
from common import (
    cpu_seconds,
    delete_topics,
    describe,
    fresh_database,
    grant,
    header,
    kafka_broker_pid,
    local_ports,
    machine_load,
    percentile,
    say,
    thread_times,
)
from standardwebhooks import Webhook

from cronwheel import config, kafka
from cronwheel.core.clock import now_ms, to_ms
from cronwheel.core.ids import partition_of, partition_of_run, run_id_for_trigger
from cronwheel.core.runs import PRIORITY_RANK
from cronwheel.kafka import Topics, partition_for
from cronwheel.store.firing import insert_runs
from cronwheel.store.jobs import Jobs, create_tenant

TARGET = 2_000
PARTITIONS = 8  # of the webhook topic
# The receiver takes whatever comes; the per-endpoint limit must not be what is
# measured. At 2,000/s with ~100 ms from admission to response under a burst
# (StartRun's group, the request), some 200 deliveries are under way at once
# (Little's law): 256 per process leaves room. (The service's default, 16, is
# for receivers nobody has measured.)
PER_ENDPOINT = "256"
ROOT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable  # the interpreter running the bench (.venv/bin/python under make bench)
RESPONSE = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-type: text/plain\r\n\r\nok"


class _ReceiverProtocol(asyncio.Protocol):
    """HTTP/1.1 keep-alive, as little work per request as will do: find the end
    of the head, the content length and the run id, note the arrival, answer."""

    def __init__(self, arrived: dict[str, float], samples: list[tuple[bytes, bytes]]):
        self.arrived = arrived
        self.samples = samples
        self.buf = b""

    def connection_made(self, transport) -> None:
        self.t = transport

    def data_received(self, data: bytes) -> None:
        buf = self.buf + data if self.buf else data
        while True:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                break
            head = buf[: end + 2]
            i = head.find(b"\r\ncontent-length:")
            if i < 0:  # not as our client writes it
                head = head.lower()
                i = head.find(b"\r\ncontent-length:")
            size = int(head[i + 17 : head.find(b"\r", i + 17)]) if i >= 0 else 0
            if len(buf) < end + 4 + size:
                break
            i = buf.find(b"\r\ncronwheel-run-id: ", 0, end)
            run_id = buf[i + 20 : buf.find(b"\r", i + 20, end + 2)] if i >= 0 else b""
            self.arrived.setdefault(run_id.decode(), time.time())
            if len(self.samples) < 50:
                self.samples.append((buf[:end], buf[end + 4 : end + 4 + size]))
            buf = buf[end + 4 + size :]
            self.t.write(RESPONSE)
        self.buf = buf


def serve_receiver() -> None:
    """The receiver process (`--receiver`): prints its port; on each line read
    from stdin writes what arrived (JSON) to the file named on that line."""
    arrived: dict[str, float] = {}
    samples: list[tuple[bytes, bytes]] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(
            lambda: _ReceiverProtocol(arrived, samples), "127.0.0.1", 0, backlog=1024
        )
        print(server.sockets[0].getsockname()[1], flush=True)
        while line := (await loop.run_in_executor(None, sys.stdin.readline)).strip():
            Path(line).write_text(
                json.dumps(
                    {
                        "arrived": arrived,
                        "samples": [[h.decode("latin-1"), b.decode()] for h, b in samples],
                    }
                )
            )
            print("ok", flush=True)
        server.close()

    try:
        import uvloop

        uvloop.run(main())
    except ImportError:
        asyncio.run(main())


class Receiver:
    """A minimal HTTP/1.1 keep-alive server in a process of its own (so its CPU is
    its own and it never shares a GIL with the producer): notes when each run's
    request arrived (time.time) and keeps a few requests to verify."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [str(PYTHON), __file__, "--receiver"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.pid = self.proc.pid
        self.port = int(self.proc.stdout.readline())
        self.arrived: dict[str, float] = {}
        self.samples: list[tuple[dict, bytes]] = []

    def collect(self) -> None:
        """What arrived so far, from the receiver process."""
        with tempfile.NamedTemporaryFile(suffix=".json") as f:
            self.proc.stdin.write(f.name + "\n")
            self.proc.stdin.flush()
            if self.proc.stdout.readline().strip() != "ok":
                raise RuntimeError("the receiver did not answer")
            got = json.loads(Path(f.name).read_text())
        self.arrived = got["arrived"]
        self.samples = []
        for head, body in got["samples"]:
            lines = head.split("\r\n")[1:]
            headers = {k.lower(): v for k, v in (line.split(": ", 1) for line in lines)}
            self.samples.append((headers, body.encode()))

    def close(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


# The bench's runs, looked up by primary key: `run_id = ANY(%s)` searched the
# 10,000 ids linearly for every row of runs (0.5-1 s of a backend's CPU per
# poll, taken from the service it measures).
_OF_IDS = (
    "FROM unnest(%s::smallint[], %s::text[]) AS u(partition_id, run_id)"
    " JOIN runs_daily r USING (partition_id, run_id)"
)


class Bench:
    def __init__(self, url: str, prefix: str, receiver: Receiver):
        self.url = url
        self.topics = Topics(prefix)
        self.conn = psycopg.connect(url, autocommit=True)
        self.tenant = create_tenant(self.conn, "bench")
        self.topic = self.topics.webhook(self.tenant["tenant_id"])
        # The dispatcher's principal creates and writes webhook topics.
        kafka.ensure_topics([self.topic], partitions=PARTITIONS, principal="dispatcher")
        body = {
            "name": "bench-hook",
            "schedule": {"every_ms": 86_400_000},
            "target": {"type": "webhook", "url": f"http://127.0.0.1:{receiver.port}/hook"},
            "payload": {"bench": True, "pad": "x" * 200},
        }
        self.job = Jobs(self.topics).create(self.conn, self.tenant, body, now_ms())
        # Jobs.create issues a webhook job's secret in its own transaction.
        self.secret = self.job["signing_secret"]["secret"]
        row = self.conn.execute(
            "SELECT target, payload, retry, timeout_ms, lease_ms FROM jobs WHERE job_id = %s",
            [self.job["job_id"]],
        ).fetchone()
        self.spec = dict(
            zip(("target", "payload", "retry", "timeout_ms", "lease_ms"), row, strict=True)
        )
        self.producer = kafka.producer(principal="dispatcher")
        self._at = now_ms() - 60_000  # distinct trigger instants, all due

    def runs(self, n: int, priority: str = "normal") -> list[tuple[str, bytes]]:
        """n PENDING runs (as the timer inserts them); their RunReady records."""
        job_id = self.job["job_id"]
        out = []
        for start in range(0, n, 5000):
            batch = []
            for _ in range(min(5000, n - start)):
                self._at += 1
                batch.append(
                    {
                        "partition_id": partition_of(job_id),
                        "run_id": run_id_for_trigger(job_id, self._at),
                        "tenant_id": self.tenant["tenant_id"],
                        "job_id": job_id,
                        "scheduled_ms": self._at,
                        "covers": None,
                        "priority": priority,
                        "spec": self.spec,
                    }
                )
            with self.conn.transaction():
                rows = insert_runs(self.conn, self.topics, batch, now_ms())
            out += [(r.key.decode(), r.value) for r in rows]
        return out

    def produce(
        self, records: list[tuple[str, bytes]], rate: float | None = None, rank: int | None = None
    ) -> dict[str, float]:
        """Produce (as the dispatcher forwards), paced at `rate`/s if given, in
        the partitions of class `rank` if given (as the dispatcher places them);
        returns when each record was handed to the producer (time.time)."""
        sent: dict[str, float] = {}
        t0 = time.monotonic()
        for i, (run_id, value) in enumerate(records):
            if rate:
                due = t0 + i / rate
                while (delay := due - time.monotonic()) > 0:
                    time.sleep(min(delay, 0.005))  # pacing the producer, not waiting on a result
            sent[run_id] = time.time()
            while True:
                try:
                    where = (
                        {}
                        if rank is None
                        else {"partition": partition_for(rank, run_id.encode(), PARTITIONS)}
                    )
                    self.producer.produce(self.topic, key=run_id.encode(), value=value,
                                          headers=[("record", b"RunReady")], **where)  # fmt: skip
                    break
                except BufferError:
                    self.producer.poll(0.01)
            self.producer.poll(0)
        self.producer.flush(30)
        return sent

    def wait_done(self, run_ids: list[str], procs, timeout: float = 300) -> float:
        """Poll until every run is SUCCEEDED; returns time.time() of the last
        finish (from the database, so the poll's interval does not move it).
        Each poll asks only for the runs not yet seen done."""
        deadline = time.monotonic() + timeout
        left = dict(zip(run_ids, (partition_of_run(r) for r in run_ids), strict=True))
        last = 0.0
        while True:
            done = self.conn.execute(
                f"SELECT r.run_id, r.finished_at {_OF_IDS} WHERE r.state = 'SUCCEEDED'",
                [list(left.values()), list(left)],
            ).fetchall()
            for run_id, finished_at in done:
                del left[run_id]
                last = max(last, to_ms(finished_at) / 1000)
            if not left:
                return last
            for p in procs:
                if p.poll() is not None:
                    raise RuntimeError(f"webhook service exited with {p.returncode}")
            if time.monotonic() > deadline:
                bad = self.conn.execute(
                    f"SELECT r.state, count(*) {_OF_IDS} GROUP BY 1",
                    [list(left.values()), list(left)],
                ).fetchall()
                raise RuntimeError(f"not all runs succeeded after {timeout}s: {bad}")
            time.sleep(0.25)  # polling the database with a deadline

    def finished(self, run_ids: list[str]) -> dict[str, float]:
        rows = self.conn.execute(
            f"SELECT r.run_id, r.finished_at {_OF_IDS}",
            [[partition_of_run(r) for r in run_ids], run_ids],
        ).fetchall()
        return {r: to_ms(f) / 1000 for r, f in rows}


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds of a process's threads, grouped: the asyncio loop (the main
    thread), librdkafka's own threads, and the rest (the database threads, the
    consumer-call thread, DNS lookups)."""
    out = {"loop": 0.0, "librdkafka": 0.0, "db and other threads": 0.0}
    for tid, name, cpu in thread_times(pid):
        key = (
            "loop"
            if tid == pid
            else "librdkafka"
            if name.startswith("rdk:")
            else "db and other threads"
        )
        out[key] += cpu
    return out


def backend_pids(conn: psycopg.Connection, pids: list[int]) -> list[int]:
    """The PostgreSQL backends serving these processes (found by client port)."""
    ports: set[int] = set()
    for pid in pids:
        ports |= local_ports(pid)
    rows = conn.execute(
        "SELECT client_port, pid FROM pg_stat_activity"
        " WHERE datname = current_database() AND pid <> pg_backend_pid()"
    ).fetchall()
    return [bpid for port, bpid in rows if port in ports]


class CpuMeter:
    """CPU seconds of the webhook processes, their PostgreSQL backends, the
    receiver, this process (producer) and the shared Kafka broker, from `start`."""

    def __init__(self, conn: psycopg.Connection, procs: list[subprocess.Popen], receiver: int):
        self.conn = conn
        self.procs = procs
        self.receiver = receiver
        self.broker = kafka_broker_pid()

    def sample(self) -> dict[str, float]:
        webhook = [p.pid for p in self.procs]
        out = {
            "webhook": sum(cpu_seconds(p) for p in webhook),
            "its postgres backends": sum(cpu_seconds(b) for b in backend_pids(self.conn, webhook)),
            "receiver": cpu_seconds(self.receiver),
            "bench (producer, polling)": cpu_seconds(os.getpid()),
        }
        if self.broker:
            out["kafka broker (shared)"] = cpu_seconds(self.broker)
        return out

    def start(self) -> None:
        self.before = self.sample()

    def per_op(self, n: int) -> dict[str, float]:
        """CPU ms per operation of each, since `start`."""
        after = self.sample()
        return {k: 1000 * (v - self.before.get(k, 0.0)) / n for k, v in after.items()}


def lease_spread(conn, group: str, members: int, timeout: float = 60) -> list[int]:
    """The logical partitions leased by each webhook process once `members`
    processes each hold some and together all 1,024. The service reads a
    tenant's topic where it holds the tenant's lease (cronwheel.assignment),
    not as a consumer group member: the group has no members to describe."""
    deadline = time.monotonic() + timeout
    while True:
        held = sorted(
            n
            for (n,) in conn.execute(
                "SELECT count(*) FROM partition_leases WHERE service = %s"
                " AND owner IS NOT NULL AND expires_at > now() GROUP BY owner",
                [group],
            ).fetchall()
        )
        if len(held) >= members and sum(held) == 1024:
            return held
        if time.monotonic() > deadline:
            raise RuntimeError(f"{group}: partitions leased {held} after {timeout:.0f} s")
        time.sleep(0.2)  # polling the leases with a deadline


def start_services(
    url: str, prefix: str, instances: int, logdir: Path, root: Path = ROOT
) -> list[subprocess.Popen]:
    env = {k: v for k, v in os.environ.items() if k != "CRONWHEEL_METRICS_PORT"}
    env.update(
        DATABASE_URL=config.role_url(url, config.PG_PLATFORM_USER),  # not the owner
        KAFKA_BOOTSTRAP=config.kafka_bootstrap(),
        CRONWHEEL_TOPIC_PREFIX=prefix,
        CRONWHEEL_LOG_LEVEL="WARNING",
        CRONWHEEL_WEBHOOK_ALLOW_CIDRS="127.0.0.0/8",
        CRONWHEEL_WEBHOOK_PER_ENDPOINT=os.environ.get(
            "CRONWHEEL_WEBHOOK_PER_ENDPOINT", PER_ENDPOINT
        ),
        # One tenant here: its cap (64 by default) must not be what is measured either.
        CRONWHEEL_WEBHOOK_TENANT_SLOTS=os.environ.get(
            "CRONWHEEL_WEBHOOK_TENANT_SLOTS", PER_ENDPOINT
        ),
    )
    procs = []
    for i in range(instances):
        log = open(logdir / f"webhook-{i}.log", "wb")  # noqa: SIM115 - kept by the process
        procs.append(
            subprocess.Popen(
                [str(PYTHON), "-m", "services.entrypoints", "serve", "webhook"],
                cwd=root,
                env={**env, "CRONWHEEL_WEBHOOK_INSTANCE": f"bench{i}"},
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )
    return procs


def stop_services(procs: list[subprocess.Popen], logdir: Path) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for i, p in enumerate(procs):
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(10)
        tail = (logdir / f"webhook-{i}.log").read_text(errors="replace").strip().splitlines()[-5:]
        if p.returncode not in (0, -15) or any("Traceback" in line for line in tail):
            say(f"webhook {i} exited {p.returncode}; log tail:\n" + "\n".join(tail))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--burst", type=int, default=10_000)
    ap.add_argument("--paced", type=int, default=3_000)
    ap.add_argument(
        "--rate", type=float, default=0, help="paced records/s (default: half the burst rate)"
    )
    ap.add_argument("--instances", type=int, default=2, help="webhook processes (one per core)")
    ap.add_argument("--backlog", type=int, default=3_000, help="normal runs ahead of critical ones")
    ap.add_argument(
        "--service-root",
        type=Path,
        default=ROOT,
        help="run the services from this checkout (an older one, to compare)",
    )
    ap.add_argument("--receiver", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if min(args.burst, args.paced, args.backlog) < 1:
        ap.error(
            "--burst, --paced and --backlog each need at least one run (the RESULT reports all three)"
        )
    if args.receiver:
        return serve_receiver()
    header("bench_webhook: deliveries to a local receiver")
    prefix = f"bench{uuid.uuid4().hex[:8]}"
    grant(prefix)
    receiver = Receiver()
    logdir = Path(tempfile.mkdtemp(prefix="cw-bench-webhook-"))
    with fresh_database() as url:
        bench = Bench(url, prefix, receiver)
        procs = start_services(url, prefix, args.instances, logdir, args.service_root)
        say(
            f"setup: fresh database, one webhook job, {args.instances} `cronwheel serve webhook`"
            f" process(es) (per-endpoint limit {os.environ.get('CRONWHEEL_WEBHOOK_PER_ENDPOINT', PER_ENDPOINT)},"
            " other settings default), the webhook topic with 8 partitions, the receiver (a raw"
            " asyncio protocol) in a process of its own, the producer in this one; services from"
            f" {args.service_root}"
        )
        say(f"setup: machine before: {machine_load()}")
        try:
            warm = bench.runs(200)
            bench.produce(warm)
            bench.wait_done([r for r, _ in warm], procs, timeout=120)
            held = lease_spread(bench.conn, f"{prefix}.webhook", args.instances)
            say(f"setup: tenant partitions leased by each process: {held}")

            records = bench.runs(args.burst)
            ids = [r for r, _ in records]
            cpu0 = sum(cpu_seconds(p.pid) for p in procs)
            meter = CpuMeter(bench.conn, procs, receiver.pid)
            meter.start()
            threads0 = [thread_cpu(p.pid) for p in procs]
            t0 = time.time()
            bench.produce(records)
            last = bench.wait_done(ids, procs)
            per_op = meter.per_op(len(ids))
            cpu = sum(cpu_seconds(p.pid) for p in procs) - cpu0
            split = {k: 0.0 for k in threads0[0]}
            for p, before in zip(procs, threads0, strict=True):
                for k, v in thread_cpu(p.pid).items():
                    split[k] += v - before[k]
            rate = len(ids) / (last - t0)
            receiver.collect()
            arrivals = sorted(receiver.arrived[r] for r in ids)
            say(
                f"burst {len(ids):,}: {rate:,.0f} deliveries/s (first produced -> last SUCCEEDED"
                f" {last - t0:.2f} s); receiver saw {len(ids) / (arrivals[-1] - arrivals[0]):,.0f}"
                f" requests/s; webhook CPU {1000 * cpu / len(ids):.2f} ms per delivery ("
                + ", ".join(f"{k} {1000 * v / len(ids):.2f}" for k, v in split.items())
                + ")"
            )
            say(
                "burst: CPU ms per delivery by process: "
                + ", ".join(f"{k} {v:.2f}" for k, v in per_op.items())
            )
            ours = sum(v for k, v in per_op.items() if k != "kafka broker (shared)")
            say(
                f"burst: all but the broker {ours:.2f} ms per delivery: two idle cores would"
                f" carry about {2000 / ours:,.0f} deliveries/s"
                + (
                    f" ({2000 / (ours + per_op['kafka broker (shared)']):,.0f}/s counting the"
                    " shared broker's CPU in the meantime, other users' included)"
                    if "kafka broker (shared)" in per_op
                    else ""
                )
            )
            say(f"burst: machine after: {machine_load()}")

            pace = args.rate or max(50.0, round(rate / 2, -1))
            paced = bench.runs(args.paced)
            ids = [r for r, _ in paced]
            sent = bench.produce(paced, rate=pace)
            bench.wait_done(ids, procs)
            fin = bench.finished(ids)
            receiver.collect()
            delivery = [1000 * (receiver.arrived[r] - sent[r]) for r in ids]
            completion = [1000 * (fin[r] - sent[r]) for r in ids]
            say(f"paced {len(ids):,} at {pace:,.0f}/s: delivery latency {describe(delivery)}")
            say(
                f"paced: completion latency (record produced -> run finished) {describe(completion)}"
            )
            say(f"paced: machine after: {machine_load()}")

            # Priority under a backlog (docs/priority.md): normal runs queued,
            # then critical ones produced behind them in their class's partitions.
            backlog = bench.runs(args.backlog)
            urgent = bench.runs(50, priority="critical")
            sent = bench.produce(backlog, rank=PRIORITY_RANK["normal"])
            sent.update(bench.produce(urgent, rank=PRIORITY_RANK["critical"]))
            bench.wait_done([r for r, _ in backlog + urgent], procs)
            receiver.collect()
            crit = [receiver.arrived[r] for r, _ in urgent]
            crit_sent = min(sent[r] for r, _ in urgent)
            normal_at = sorted(receiver.arrived[r] for r, _ in backlog)
            behind = sum(1 for t in normal_at if crit_sent <= t <= max(crit))
            say(
                f"backlog: {len(backlog):,} normal deliveries produced at once, then 50"
                f" critical: critical delivered {describe([1000 * (t - crit_sent) for t in crit])}"
                f" after they were produced; {behind:,} normal delivered in that time, the last"
                f" normal {1000 * (normal_at[-1] - crit_sent):,.0f} ms after"
            )
            for headers, body in receiver.samples:
                Webhook(bench.secret).verify(body, headers, json_parse=False)
            say(f"check: {len(receiver.samples)} sampled requests verify with standardwebhooks")
            say(
                f"RESULT webhook: {rate:,.0f} deliveries/s (target >= {TARGET:,}:"
                f" {'met' if rate >= TARGET else 'MISSED'}), p99 delivery latency"
                f" {percentile(delivery, 99):.0f} ms at {pace:,.0f}/s"
            )
        finally:
            stop_services(procs, logdir)
            bench.conn.close()
            receiver.close()
            delete_topics([bench.topic])


if __name__ == "__main__":
    sys.exit(main())
