"""Kafka clients and topic names, configured in one place.

Topic names: every topic starts with a prefix (default `cw`; tests use their own)
so one broker can hold several independent systems.
- `<p>.runs.<tenant_id>`: a tenant's runs, written by the relay, read by the dispatcher.
- `<p>.q.<tenant_id>.<queue>`: a queue target's records, read by the tenant's workers.
- `<p>.webhook.<tenant_id>`, `<p>.managed.<tenant_id>`: webhook and managed runs.
- `<p>.run-completed`: terminal transitions, read by the workflow service.
- `<p>.dead-letter`: records a consumer could not process, with the reason.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
import zlib
from collections.abc import Iterable
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic

from cronwheel import config, kafka_stats
from cronwheel.core.runs import NORMAL_RANK, PRIORITIES

log = logging.getLogger("cronwheel.kafka")

_SAFE = re.compile(r"^[A-Za-z0-9_-]{1,100}$")


class UnknownTarget(ValueError):
    """A run's target type that has no destination topic."""


@dataclass(frozen=True)
class Topics:
    prefix: str = "cw"

    def runs(self, tenant_id: str) -> str:
        return f"{self.prefix}.runs.{_safe(tenant_id)}"

    def queue(self, tenant_id: str, queue: str) -> str:
        return f"{self.prefix}.q.{_safe(tenant_id)}.{_safe(queue)}"

    def webhook(self, tenant_id: str) -> str:
        return f"{self.prefix}.webhook.{_safe(tenant_id)}"

    def managed(self, tenant_id: str) -> str:
        return f"{self.prefix}.managed.{_safe(tenant_id)}"

    def destination(self, tenant_id: str, target_type: str, queue: str | None) -> str:
        """The topic where a run of this target is delivered (ValueError for a
        target type that has none, or a queue name no topic can carry)."""
        if target_type == "queue":
            return self.queue(tenant_id, queue or "")
        if target_type == "webhook":
            return self.webhook(tenant_id)
        if target_type == "managed":
            return self.managed(tenant_id)
        raise UnknownTarget(f"unknown target_type {target_type!r}")

    def partitions(self, name: str) -> int:
        """How many partitions the topic `name` starts with (see RUN_PARTITIONS)."""
        if name.startswith(f"{self.prefix}.q."):
            return QUEUE_PARTITIONS
        if name.startswith(f"{self.prefix}.runs."):
            return RUN_PARTITIONS
        kinds = ("webhook", "managed")
        if name.startswith(tuple(f"{self.prefix}.{k}." for k in kinds)):
            return CLASS_PARTITIONS
        return PLATFORM_PARTITIONS

    @property
    def run_completed(self) -> str:
        return f"{self.prefix}.run-completed"

    @property
    def dead_letter(self) -> str:
        return f"{self.prefix}.dead-letter"

    @property
    def wake(self) -> str:
        """The relay's wakes for dozing run-topic partitions (cronwheel.dozing)."""
        return f"{self.prefix}.wake"

    def nudge(self, service: str) -> str:
        """A service's own topic for ending its consumer's fetch (cronwheel.fetch_nudge)."""
        return f"{self.prefix}.nudge.{service}"


# Partitions a tenant's topics start with. An idle tenant costs the broker and
# every consumer per partition (bench_tenants.py --idle), so they start small:
# a run topic has one partition, read as the normal class, until a record of
# another class is placed on it (Placement grows it to CLASS_PARTITIONS, one
# per class); webhook and managed topics, which the dispatcher lays out by
# class from the start, CLASS_PARTITIONS; a queue topic one partition, grown
# online when a tenant runs more worker processes (grow_topic; Kafka adds
# partitions without moving records).
CLASS_PARTITIONS = 4
RUN_PARTITIONS = 1
QUEUE_PARTITIONS = 1
PLATFORM_PARTITIONS = 8  # the platform's own topics (run-completed, dead-letter)


def _safe(part: str) -> str:
    if not _SAFE.match(part):
        raise ValueError(f"not a valid topic name part: {part!r}")
    return part


@dataclass(frozen=True)
class Credentials:
    """A SASL principal's name and password (a tenant's, or one given by hand)."""

    username: str
    password: str

    def __repr__(self) -> str:  # never print the password
        return f"Credentials({self.username!r})"


def security(principal: str | Credentials, bootstrap: str | None = None) -> dict:
    """librdkafka settings that authenticate `principal` to the broker at
    `bootstrap` (default: the configured one): a platform role ("relay",
    "dispatcher", ...; cronwheel.principals.ROLES) or explicit Credentials.
    Where they come from, in order: the process's environment
    (CRONWHEEL_KAFKA_USERNAME/PASSWORD: one service per process in a
    deployment), explicit Credentials, the local stack's credentials file
    when `bootstrap` is the stack's broker (`cronwheel up` writes it), and
    otherwise none (a broker without SASL)."""
    auth = config.load(config.KafkaAuth)
    conf: dict = {}
    if auth.ca_file:
        conf["ssl.ca.location"] = auth.ca_file
    user = password = None
    if auth.username:
        user, password = auth.username, auth.password or ""
    elif isinstance(principal, Credentials):
        user, password = principal.username, principal.password
    else:
        user, password = _local_password(principal, bootstrap or config.kafka_bootstrap())
    protocol = auth.security_protocol or ("SASL_PLAINTEXT" if user else "PLAINTEXT")
    conf["security.protocol"] = protocol
    if protocol.startswith("SASL"):
        if not user:
            raise ValueError(
                f"{protocol} needs a principal: set CRONWHEEL_KAFKA_USERNAME and "
                "CRONWHEEL_KAFKA_PASSWORD"
            )
        conf.update({"sasl.mechanism": auth.mechanism, "sasl.username": user})
        conf["sasl.password"] = password
    return conf


def _local_password(role: str, bootstrap: str) -> tuple[str | None, str | None]:
    """The local stack's password of `role` (admin included) where
    `bootstrap` is the stack's broker; (None, None) otherwise."""
    import json

    path = config.local_kafka_credentials()
    try:
        stack = json.loads(path.read_text())
    except FileNotFoundError:
        return None, None
    if stack.get("bootstrap") != bootstrap:
        return None, None
    passwords = stack["passwords"]
    if role not in passwords:
        raise ValueError(f"the local stack has no Kafka principal for {role!r} ({path})")
    name = "cronwheel-admin" if role == "admin" else f"cronwheel-{role}"
    return name, passwords[role]


# Every platform client ends a lost link itself and is quick to make it
# again once the network is back (docs/reliability.md, "Cut off, and back"
# and "Connection attempts that see the heal"):
# - a request that has had no answer for 15 s ends, and its connection with
#   it (librdkafka's socket.timeout.ms, 60 s by default). A connection whose
#   packets are dropped (a network partition, not a broker that is down)
#   gives no error: at the default a dispatcher cut off from the broker for
#   30 s waited on its hung requests another 30 s after the cut healed. A
#   fetch waits at most fetch.wait.max.ms (500) for its records before the
#   timeout counts; a produce on this broker is answered in milliseconds.
# - a connection attempt is given up after 10 s (socket.connection.setup.
#   timeout.ms, 30 s by default), and the next made within 2 s (reconnect.
#   backoff.max.ms, 10 s). Through a partition an attempt's SYNs go out at
#   the kernel's doubling intervals (0, 1, 3, 7, 15, 31 s), so a link back
#   from a partition waits for the attempt's next SYN: up to 16 s within a
#   30 s attempt; about 5 s at most with 10 s ones and the next within 2 s
#   (SYNs at 0, 1, 3 and 7 s, a new attempt by 12 s). Not shorter: the
#   limit covers the SASL handshake, which a loaded machine can take
#   seconds over (5 s was tried; docs/reliability.md).
LOST_LINK_MS = {
    "socket.timeout.ms": 15_000,
    "socket.connection.setup.timeout.ms": 10_000,
    "reconnect.backoff.max.ms": 2_000,
}


def producer(
    bootstrap: str | None = None, *, principal: str | Credentials, **overrides
) -> Producer:
    """An idempotent producer: retries never duplicate or reorder within a partition.
    A platform role's reports librdkafka's statistics as metrics when
    CRONWHEEL_KAFKA_STATS_MS is set (cronwheel.kafka_stats)."""
    conf = {
        "bootstrap.servers": bootstrap or config.kafka_bootstrap(),
        **security(principal, bootstrap),
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 2,
        "batch.num.messages": 10000,
        "queue.buffering.max.messages": 500000,
        "compression.type": "lz4",
        **LOST_LINK_MS,
        "log_level": 3,
        **(kafka_stats.options(principal) if isinstance(principal, str) else {}),
    }
    conf.update(overrides)
    return Producer(conf)


def consumer(
    group_id: str, bootstrap: str | None = None, *, principal: str | Credentials, **overrides
) -> Consumer:
    """A consumer that commits only what the caller says it finished."""
    conf = {
        "bootstrap.servers": bootstrap or config.kafka_bootstrap(),
        **security(principal, bootstrap),
        "group.id": group_id,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "topic.metadata.refresh.interval.ms": 2000,
        # The broker answers a waiting fetch as soon as a record arrives, so a
        # long wait costs no latency; a 10 ms one made every idle consumer send
        # 100 fetches a second, and the broker spent 60% of a core answering them.
        "fetch.wait.max.ms": 500,
        # A crashed member's partitions move on after 10 s, not the default 45 s:
        # a scheduler's records should not wait that long behind a dead process.
        "session.timeout.ms": 10_000,
        "heartbeat.interval.ms": 2_000,
        **LOST_LINK_MS,
        "log_level": 3,
    }
    conf.update(overrides)
    return Consumer(conf)


def admin(bootstrap: str | None = None, *, principal: str | Credentials) -> AdminClient:
    return AdminClient(
        {
            "bootstrap.servers": bootstrap or config.kafka_bootstrap(),
            **security(principal, bootstrap),
            **LOST_LINK_MS,
            "log_level": 3,
        }
    )


def asker(bootstrap: str | None = None, *, principal: str | Credentials, group: str) -> Consumer:
    """A client that only asks the broker for partitions' offsets
    (`end_offsets`, `start_offsets`): it subscribes to nothing, reads
    nothing and commits nothing; `group` (one the principal may use) is there
    because librdkafka's offset lookup is a consumer's call. Answers as the
    admin client's ListOffsets did (uncommitted records count)."""
    return Consumer(
        {
            "bootstrap.servers": bootstrap or config.kafka_bootstrap(),
            **security(principal, bootstrap),
            "group.id": group,
            "enable.auto.commit": False,
            "isolation.level": "read_uncommitted",
            **LOST_LINK_MS,
            "log_level": 3,
        }
    )


class RenewingAsker:
    """An offsets client (`asker`) made when first needed, and made anew when
    a request through it gets no answer: after a broker restart every
    long-lived client of a process was seen stuck at once, and a watch that
    asks the broker through one of them must not be stuck with them
    (cronwheel.fetch_watch)."""

    def __init__(self, bootstrap: str | None, *, principal: str | Credentials, group: str):
        self.bootstrap, self.principal, self.group = bootstrap, principal, group
        self._client: Consumer | None = None

    @property
    def client(self) -> Consumer:
        if self._client is None:
            self._client = asker(self.bootstrap, principal=self.principal, group=self.group)
        return self._client

    def end_offsets(
        self, keys: list[tuple[str, int]], timeout_s: float = 5.0
    ) -> dict[tuple[str, int], int | None]:
        """end_offsets through this client, or a new one when it answered none."""
        return self._ask(end_offsets, keys, timeout_s)

    def start_offsets(
        self, keys: list[tuple[str, int]], timeout_s: float = 5.0
    ) -> dict[tuple[str, int], int | None]:
        """start_offsets through this client, or a new one when it answered none."""
        return self._ask(start_offsets, keys, timeout_s)

    def _ask(self, ask, keys: list[tuple[str, int]], timeout_s: float) -> dict:
        got = ask(self.client, keys, timeout_s)
        if keys and all(v is None for v in got.values()):
            self._client = None
            got = ask(self.client, keys, timeout_s)
        return got


def answers(bootstrap: str | None = None, *, principal: str | Credentials, timeout_s=5.0) -> bool:
    """Whether the broker gives its metadata to a new client: one that cannot
    have been left stuck, to tell a broker that is down from clients that
    are (cronwheel.fetch_watch)."""
    try:
        admin(bootstrap, principal=principal).list_topics(timeout=timeout_s)
    except KafkaException:
        return False
    return True


# Partitions per offsets request. librdkafka matches an answer to what was
# asked partition by partition against every asked one
# (rd_kafka_topic_partition_list_update), so one request for all of a
# dispatcher's dozing partitions costs their square; requests of this many
# keep the sweep linear in the tenants, for a few more round trips (six at
# 3,000).
END_OFFSETS_CHUNK = 500

# Where the broker's ListOffsets looks: the next offset to be written, and the
# first one still retained.
_LATEST, _EARLIEST = -1, -2


def end_offsets(
    client: Consumer,
    keys: Iterable[tuple[str, int]],
    timeout_s: float = 5.0,
    *,
    chunk: int = END_OFFSETS_CHUNK,
) -> dict[tuple[str, int], int | None]:
    """The broker's end offset (the next offset to be written) of each
    (topic, partition), asked through `client` (an `asker`) `chunk` at a
    time within `timeout_s` in all; None for one whose answer failed or did
    not come in time."""
    return _offsets(client, keys, _LATEST, timeout_s, chunk)


def start_offsets(
    client: Consumer,
    keys: Iterable[tuple[str, int]],
    timeout_s: float = 5.0,
    *,
    chunk: int = END_OFFSETS_CHUNK,
) -> dict[tuple[str, int], int | None]:
    """The first offset the broker still holds of each (topic, partition), as
    `end_offsets` asks."""
    return _offsets(client, keys, _EARLIEST, timeout_s, chunk)


def _offsets(
    client: Consumer, keys: Iterable[tuple[str, int]], spec: int, timeout_s: float, chunk: int
) -> dict[tuple[str, int], int | None]:
    # Through the consumer's offsets_for_times, not the admin client's
    # list_offsets: librdkafka's admin ListOffsets looks up the partitions'
    # leaders on the caller's thread, and when one is not in its metadata
    # cache it leaves its request where a metadata answer arriving on another
    # thread runs it there too; the two then race over it and the caller's
    # can dereference what the other freed (SIGSEGV in
    # rd_kafka_topic_partition_list_query_leaders_async_worker, reproduced by
    # bench/bench_offsets_race.py; docs/dispatcher.md). The consumer's
    # call looks the leaders up on the caller's thread alone.
    asked = list(dict.fromkeys(keys))
    got: dict[tuple[str, int], int | None] = dict.fromkeys(asked)
    deadline = time.monotonic() + timeout_s
    # A request fails whole when the broker gives an error for one of its
    # partitions (librdkafka's offsets_for_times then updates none), so a
    # failed request of more than one is asked again in halves while time is
    # left: one partition in a leader move costs a few requests more, not
    # its whole chunk's answers (a dozing partition without one is woken).
    parts = [asked[start : start + chunk] for start in range(0, len(asked), chunk)]
    parts.reverse()  # popped from the end: asked in order
    failed: list[tuple[int, KafkaException]] = []
    # A client keeps what it learned of a topic in its metadata cache (up to
    # metadata.max.age.ms, 15 minutes) and answers from there, without asking
    # the broker: "unknown" for a partition added since or a topic it was
    # asked about while the topic was being made, "leader not available" for
    # a partition it learned before its leader was elected. Asking the broker
    # for the topic's metadata replaces the entry, and its partitions are
    # asked again: once per topic per call, so one that truly does not exist
    # costs a metadata request more. A request that fails whole so is asked
    # again whole after the refresh, before it is split.
    refreshed: set[str] = set()
    while parts:
        left = deadline - time.monotonic()
        if left <= 0:
            break  # the rest stay None: a client left stuck answers nothing
        part = parts.pop()
        try:
            answered = client.offsets_for_times(
                [TopicPartition(t, p, spec) for t, p in part], timeout=left
            )
        except KafkaException as exc:
            if _stale(exc.args[0] if exc.args else None) and _refresh(
                client, part, refreshed, deadline
            ):
                parts.append(part)
            elif len(part) > 1:
                half = len(part) // 2
                parts += [part[half:], part[:half]]
            else:
                failed.append((len(part), exc))
            continue
        for tp in answered:
            if tp.error is None and tp.offset >= 0:
                got[(tp.topic, tp.partition)] = tp.offset
        stale = [(tp.topic, tp.partition) for tp in answered if _stale(tp.error)]
        if again := _refresh(client, stale, refreshed, deadline):
            parts.append(again)
    if failed:
        log.warning("offsets of %d partitions unavailable: %s", len(failed), failed[0][1])
    return got


# What a client's metadata cache may answer for a topic that changed since it
# was learned (above).
_STALE = frozenset(
    (
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError._UNKNOWN_PARTITION,
        KafkaError._UNKNOWN_TOPIC,
        KafkaError.LEADER_NOT_AVAILABLE,
    )
)


def _stale(err) -> bool:
    """Whether a KafkaError is one a stale metadata cache gives."""
    return isinstance(err, KafkaError) and err.code() in _STALE


# Past this many topics to refresh at once, one request for every topic's
# metadata replaces them all in the cache, rather than a round trip each
# (each taken from the call's deadline).
REFRESH_EACH_UP_TO = 8


def _refresh(
    client: Consumer, keys: list[tuple[str, int]], refreshed: set[str], deadline: float
) -> list[tuple[str, int]]:
    """Ask the broker for the metadata of the topics of `keys` not asked about
    yet in this call (`refreshed`), which replaces what the client's cache
    holds of them; the keys of those topics, to be asked again. Every topic
    an all-topics answer names counts as asked, so a call makes at most one
    such request. A failed metadata ask leaves the offsets ask after it to
    say what is wrong."""
    topics = {t for t, _ in keys} - refreshed
    refreshed |= topics
    asks = [None] if len(topics) > REFRESH_EACH_UP_TO else sorted(topics)
    for topic in asks:
        left = deadline - time.monotonic()
        if left > 0:
            with contextlib.suppress(KafkaException):
                answer = client.list_topics(topic, timeout=left)
                if topic is None:
                    refreshed |= set(answer.topics)
    return [k for k in keys if k[0] in topics]


def ensure_topics(
    names: list[str],
    partitions: int = PLATFORM_PARTITIONS,
    bootstrap: str | None = None,
    client=None,
    principal: str | Credentials | None = None,
    wait_s: float = 10.0,
) -> None:
    """Create topics that do not exist yet; an existing topic is not an error.
    Through `client`, else an admin client of `principal` (whose ACLs must
    allow CREATE on these names: cronwheel.principals.GRANTS).
    One CreateTopics request for all of them (no cluster-wide listing first:
    with thousands of tenant topics that costs more than the create).

    Returns once the broker's metadata names every new topic with a leader for
    each partition, so a consumer that subscribes to it next is assigned at
    once (the controller acknowledges the create before the broker knows it).
    `wait_s` bounds each: TimeoutError when the create is not answered in
    time; the wait for leaders ends then either way (a consumer that assigns
    the topic before its leader is known asks again)."""
    names = list(dict.fromkeys(names))  # a name twice refuses the whole request
    if not names:
        return
    if client is None:
        if principal is None:
            raise TypeError("ensure_topics needs a client or a principal")
        client = admin(bootstrap, principal=principal)
    wanted = [NewTopic(n, partitions, 1) for n in names]
    created = []
    asked = client.create_topics(wanted, operation_timeout=wait_s, request_timeout=wait_s)
    for name, fut in asked.items():
        try:
            fut.result(timeout=wait_s)
            created.append(name)
        except TimeoutError as e:  # concurrent.futures' own, since Python 3.11
            raise TimeoutError(f"creating topic {name}: no answer in {wait_s} s") from e
        except Exception as e:  # created already, or concurrently by another process
            if "TOPIC_ALREADY_EXISTS" not in str(e):
                raise RuntimeError(f"creating topic {name}: {e}") from e
    deadline = time.monotonic() + wait_s
    waiting = set(created)
    while waiting:
        waiting = _leaderless(client, waiting, min(5.0, wait_s))
        if not waiting or time.monotonic() >= deadline:
            return
        time.sleep(0.01)  # a poll of the broker's metadata, bounded by the deadline


def ensure_sized(names, topics: Topics, client, wait_s: float = 10.0) -> None:
    """ensure_topics for names of several kinds: each created with its kind's
    partition count (Topics.partitions), one request per count."""
    by_size: dict[int, list[str]] = {}
    for name in sorted(names):
        by_size.setdefault(topics.partitions(name), []).append(name)
    for n, group in by_size.items():
        ensure_topics(group, partitions=n, client=client, wait_s=wait_s)


def _leaderless(client, names: set[str], timeout_s: float = 5.0) -> set[str]:
    """Those of `names` whose partitions the broker's metadata does not all
    give a leader yet: a request per topic for a few, one cluster-wide
    request for many (BULK_TOPICS), so a thousand new topics cost a few
    requests, not a thousand."""
    try:
        if len(names) < BULK_TOPICS:
            topics = {}
            for name in names:
                topics.update(client.list_topics(name, timeout=timeout_s).topics)
        else:
            topics = client.list_topics(timeout=timeout_s).topics
    except Exception:  # KafkaException: asked again
        return names
    return {
        name
        for name in names
        if (meta := topics.get(name)) is None
        or meta.error is not None
        or not meta.partitions
        or any(p.leader < 0 for p in meta.partitions.values())
    }


def grow_topic(name: str, partitions: int, client) -> int:
    """At least `partitions` partitions for topic `name`, online: created with
    that many if missing, partitions added if fewer (Kafka never removes
    any). Returns the count it has now.

    Created first, looked at after: a metadata request for a missing topic
    makes a broker that auto-creates topics create it with its default count."""
    ensure_topics([name], partitions=partitions, client=client)
    meta = client.list_topics(name, timeout=10).topics[name]
    have = len(meta.partitions)
    if have >= partitions:
        return have
    for topic, fut in client.create_partitions([NewPartitions(name, partitions)]).items():
        try:
            fut.result()
        except Exception as e:  # grown concurrently to at least as many
            if "INVALID_PARTITIONS" not in str(e):
                raise RuntimeError(f"growing topic {topic}: {e}") from e
    return partitions


# -- topics laid out by priority class ------------------------------------------
#
# With n >= 4 partitions each class has its own quarter of a topic (critical
# first, low takes what a division leaves), so the dispatcher can pause the
# lower classes' partitions while a higher class has records waiting. A topic
# of fewer partitions is one lane: everything goes to partition 0, read as the
# normal class (a tenant whose jobs are all normal; its topic grows to
# CLASS_PARTITIONS when a record of another class comes).

CLASSES = len(PRIORITIES)


def class_partitions(rank: int, n: int) -> range:
    """The partitions of an n-partition topic that carry class `rank`: a
    quarter each (low takes what a division leaves); partition 0 when n < 4."""
    if n < CLASSES:
        return range(min(n, 1))
    width = n // CLASSES
    start = rank * width
    return range(start, n if rank == CLASSES - 1 else start + width)


def partition_for(rank: int, key: bytes | None, n: int) -> int:
    """Where a record of class `rank` goes: within its class's partitions by
    the key's CRC-32, so one run's records share a partition. Partition 0 of
    a topic too small to be laid out, whatever the producer's own metadata
    says: a topic grown meanwhile must not get normal records in its
    critical quarter from a producer that has not heard yet."""
    span = class_partitions(rank, n)
    if len(span) <= 1:
        return span.start
    return span.start + zlib.crc32(key or b"") % len(span)


def class_of_partition(partition: int, n: int) -> int | None:
    """The class a partition of an n-partition topic carries: normal for a
    topic too small to be laid out; None for a partition it does not have."""
    if not 0 <= partition < n:
        return None
    if n < CLASSES:
        return NORMAL_RANK
    return min(partition // (n // CLASSES), CLASSES - 1)


BULK_TOPICS = 32  # unknown topics past which one cluster-wide request is cheaper


class Placement:
    """Where a producer puts a record of a class on a topic laid out by class
    (`partition_for`), with each topic's partition count asked of the broker
    once (one small metadata request per topic; the whole cluster's costs
    ~100x). The relay places run topics' records, the dispatcher the webhook
    and managed topics'; their consumers tell a partition's class by number.

    With `admin` (the relay), a record of a class other than normal bound
    for a topic too small to be laid out grows that topic to CLASS_PARTITIONS
    first (once per topic: Kafka never shrinks one), and the topic is added
    to `grown` for the caller to announce, so that the topic's readers and
    the other producers look at its partitions again (`forget`)."""

    def __init__(self, producer, admin=None) -> None:
        self.producer = producer
        self.admin = admin
        self.grown: list[str] = []
        self._counts: dict[str, int] = {}

    def partitions(self, topic: str) -> int | None:
        """The topic's partition count, asked of the broker through the
        producer once; None while the broker does not know the topic.

        Safe inside a consumer's rebalance callback, because it asks through
        another client (see cronwheel.consuming on callbacks)."""
        n = self._counts.get(topic)
        if n is None:
            try:
                meta = self.producer.list_topics(topic, timeout=5).topics.get(topic)
            except Exception as exc:  # KafkaException: asked again next time
                log.warning("no metadata for %s: %s", topic, exc)
                return None
            if meta is None or meta.error is not None or not meta.partitions:
                return None
            n = self._counts[topic] = len(meta.partitions)
        return n

    def known(self, topic: str) -> int | None:
        """The partition count if already asked, without asking the broker."""
        return self._counts.get(topic)

    def learn(self, topics: Iterable[str]) -> None:
        """Ask for many topics' counts at once: past BULK_TOPICS unknown ones,
        one cluster-wide metadata request instead of one request each (a
        dispatcher starting with thousands of tenants). Topics the broker
        does not know yet are left to `partitions`."""
        missing = [t for t in topics if t not in self._counts]
        if len(missing) >= BULK_TOPICS:
            self._ask_cluster(missing)

    def prime(self) -> None:
        """Every topic's count the broker knows, in one request: a producer
        that starts beside thousands of tenants would otherwise ask once per
        topic in its publishing path, each the first time a tenant's run goes
        out (bench_firing_steady.py --idle-tenants)."""
        self._ask_cluster(None)

    def _ask_cluster(self, topics: list[str] | None) -> None:
        try:
            found = self.producer.list_topics(timeout=30).topics
        except Exception as exc:  # KafkaException: each is asked on its own instead
            log.warning("no cluster metadata: %s", exc)
            return
        for t in found if topics is None else topics:
            meta = found.get(t)
            if meta is not None and meta.error is None and meta.partitions:
                self._counts[t] = len(meta.partitions)

    def forget(self, topic: str) -> None:
        """The topic may have grown: ask the broker again next time."""
        self._counts.pop(topic, None)

    def __call__(self, topic: str, rank: int, key) -> dict:
        """{"partition": p} for produce(), or {} (the producer's partitioner)
        while the topic's partition count is unknown."""
        n = self.partitions(topic)
        if n is None and self.admin is not None:
            n = self._create(topic)
        if n is None:
            return {}
        if n < CLASSES and rank != NORMAL_RANK and self.admin is not None:
            n = self._grow(topic, n)
        return {"partition": partition_for(rank, bytes(key) if key is not None else None, n)}

    def _create(self, topic: str) -> int | None:
        """Make a topic the broker does not have (it creates none on a produce):
        a run topic of a tenant the dispatcher has not met yet, or
        run-completed before the workflow service first started. Before the
        producer's first record to it: a producer that sent to a missing topic
        holds the record for 30 s, then fails it."""
        n = Topics(topic.split(".", 1)[0]).partitions(topic)
        try:
            ensure_topics([topic], partitions=n, client=self.admin)
        except Exception as exc:  # produced anyway; the delivery fails and is retried
            log.warning("could not create %s: %s", topic, exc)
            return None
        log.info("created %s (%d partitions): it did not exist", topic, n)
        self._counts[topic] = n
        return n

    def _grow(self, topic: str, n: int) -> int:
        try:
            n = grow_topic(topic, CLASS_PARTITIONS, self.admin)
        except Exception as exc:  # placed in the one lane; grown at the next such record
            log.warning("could not grow %s to %d partitions: %s", topic, CLASS_PARTITIONS, exc)
            return n
        self._counts[topic] = n
        self.grown.append(topic)
        log.info("%s grown to %d partitions: a record of another class than normal", topic, n)
        return n
