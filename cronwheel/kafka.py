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

import os
import re
import time
from dataclasses import dataclass

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic

from cronwheel import config

_SAFE = re.compile(r"^[A-Za-z0-9_-]{1,100}$")


@dataclass(frozen=True)
class Topics:
    prefix: str = "cw"

    @classmethod
    def from_env(cls) -> Topics:
        return cls(os.environ.get("CRONWHEEL_TOPIC_PREFIX", "cw"))

    def runs(self, tenant_id: str) -> str:
        return f"{self.prefix}.runs.{_safe(tenant_id)}"

    def queue(self, tenant_id: str, queue: str) -> str:
        return f"{self.prefix}.q.{_safe(tenant_id)}.{_safe(queue)}"

    def webhook(self, tenant_id: str) -> str:
        return f"{self.prefix}.webhook.{_safe(tenant_id)}"

    def managed(self, tenant_id: str) -> str:
        return f"{self.prefix}.managed.{_safe(tenant_id)}"

    def partitions(self, name: str) -> int:
        """How many partitions the topic `name` starts with (see CLASS_PARTITIONS)."""
        if name.startswith(f"{self.prefix}.q."):
            return QUEUE_PARTITIONS
        kinds = ("runs", "webhook", "managed")
        if name.startswith(tuple(f"{self.prefix}.{k}." for k in kinds)):
            return CLASS_PARTITIONS
        return PLATFORM_PARTITIONS

    @property
    def run_completed(self) -> str:
        return f"{self.prefix}.run-completed"

    @property
    def dead_letter(self) -> str:
        return f"{self.prefix}.dead-letter"


# Partitions a tenant's topics start with. An idle tenant costs the broker and
# every consumer per partition (bench_tenants.py --idle), so they start small:
# topics laid out by priority class (run, webhook, managed) one partition per
# class (cronwheel.store.outbox.class_partitions), a queue topic one partition.
# A queue topic grows online when a tenant runs more worker processes
# (grow_topic; Kafka adds partitions without moving records).
CLASS_PARTITIONS = 4
RUN_PARTITIONS = CLASS_PARTITIONS
QUEUE_PARTITIONS = 1
PLATFORM_PARTITIONS = 8  # the platform's own topics (run-completed, dead-letter)


def _safe(part: str) -> str:
    if not _SAFE.match(part):
        raise ValueError(f"not a valid topic name part: {part!r}")
    return part


def producer(bootstrap: str | None = None, **overrides) -> Producer:
    """An idempotent producer: retries never duplicate or reorder within a partition."""
    conf = {
        "bootstrap.servers": bootstrap or config.kafka_bootstrap(),
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 2,
        "batch.num.messages": 10000,
        "queue.buffering.max.messages": 500000,
        "compression.type": "lz4",
        "log_level": 3,
    }
    conf.update(overrides)
    return Producer(conf)


def consumer(group_id: str, bootstrap: str | None = None, **overrides) -> Consumer:
    """A consumer that commits only what the caller says it finished."""
    conf = {
        "bootstrap.servers": bootstrap or config.kafka_bootstrap(),
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
        "log_level": 3,
    }
    conf.update(overrides)
    return Consumer(conf)


def admin(bootstrap: str | None = None) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap or config.kafka_bootstrap(), "log_level": 3})


def ensure_topics(
    names: list[str],
    partitions: int = PLATFORM_PARTITIONS,
    bootstrap: str | None = None,
    client=None,
) -> None:
    """Create topics that do not exist yet; an existing topic is not an error.
    One CreateTopics request for all of them (no cluster-wide listing first:
    with thousands of tenant topics that costs more than the create).

    Returns once the broker's metadata names every new topic with a leader for
    each partition, so a consumer that subscribes to it next is assigned at
    once (the controller acknowledges the create before the broker knows it)."""
    names = list(dict.fromkeys(names))  # a name twice refuses the whole request
    if not names:
        return
    client = client or admin(bootstrap)
    wanted = [NewTopic(n, partitions, 1) for n in names]
    created = []
    for name, fut in client.create_topics(wanted, operation_timeout=10).items():
        try:
            fut.result()
            created.append(name)
        except Exception as e:  # created already, or concurrently by another process
            if "TOPIC_ALREADY_EXISTS" not in str(e):
                raise RuntimeError(f"creating topic {name}: {e}") from e
    deadline = time.monotonic() + 10
    for name in created:
        while not _has_leaders(client, name) and time.monotonic() < deadline:
            time.sleep(0.01)  # a poll of the broker's metadata, bounded by the deadline


def _has_leaders(client, name: str) -> bool:
    try:
        meta = client.list_topics(name, timeout=5).topics.get(name)
    except Exception:  # KafkaException: asked again
        return False
    return bool(
        meta is not None
        and meta.error is None
        and meta.partitions
        and all(p.leader >= 0 for p in meta.partitions.values())
    )


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
