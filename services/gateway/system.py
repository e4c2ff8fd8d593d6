"""The platform's health for the operator (GET /v1/system, routes/system.py):
the broker's half here, the database's in cronwheel/store/system.py, both
kept for CACHE_S so that a console left open, or several, costs the platform
a few requests every few seconds and no more.

From the broker, as the gateway's principal (cronwheel/principals.py: it may
describe the deployment's topics and groups and read the dead letters,
nothing more):

- consumer lag per platform consumer: its group's committed offsets against
  the end of every partition of the topics it reads (`P.runs.*` for the
  dispatcher, `P.run-completed` for the workflow service, `P.webhook.*`,
  `P.managed.*`); a partition it never committed counts from its first
  retained record, as the consumer itself would start there. Committed, not
  consumed: a consumer commits every few seconds (consuming.COMMIT_EVERY_S),
  so a busy one reads a little behind here. Its members (only the workflow
  service subscribes; the others assign partitions they lease, and show
  none) and the group's state.
- dead letters: the records retained on `P.dead-letter` (high less low
  watermark of each partition) and the last few, newest first, with where
  each came from and why; never their bytes (a run's payload). They are read
  again only when a partition's end moved.

A broker that does not answer, or refuses, is reported in words in the
section's place; the database's figures still come.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition

from cronwheel import kafka
from cronwheel.core.avro import default_registry
from cronwheel.core.clock import iso, to_ms
from cronwheel.kafka import Topics
from cronwheel.store import system as store

CACHE_S = 5.0  # figures are this old at most
TIMEOUT_S = 3.0  # per broker request
RECENT = 5  # dead letters shown

# The platform's consumers: (kind, what it reads: a topic prefix ending in a
# dot, or one topic's name), after the deployment's prefix.
CONSUMERS = (
    ("dispatcher", "runs."),
    ("workflow", "run-completed"),
    ("webhook", "webhook."),
    ("executor", "managed."),
)


class Cached:
    """One value, computed again when older than `ttl_s` or asked for with
    another key. Callers that miss wait for the one computing (single
    flight): N consoles cost one computation per `ttl_s`."""

    def __init__(self, ttl_s: float, clock: Callable[[], float] = time.monotonic):
        self.ttl_s = ttl_s
        self.clock = clock
        self._lock = threading.Lock()
        self._key: Any = None
        self._at = 0.0
        self._value: Any = None

    def get(self, key: Any, compute: Callable[[], Any]) -> Any:
        with self._lock:
            if self._value is None or key != self._key or self.clock() - self._at >= self.ttl_s:
                self._value = compute()
                self._key, self._at = key, self.clock()
            return self._value


def _words(e: BaseException) -> str:
    text = str(e.args[0]) if e.args else str(e)
    return f"the broker did not answer or refused: {text}"


def _where(tp: TopicPartition) -> tuple[str, int]:
    return tp.topic, tp.partition


@dataclass
class Broker:
    """The broker's figures, through the gateway's admin client."""

    admin: Callable[[], Any]  # Gateway.kafka_admin
    bootstrap: str
    topics: Topics
    recent: int = RECENT
    _letters_at: dict = field(default_factory=dict)  # the ends the last read reached
    _letters: list = field(default_factory=list)
    # The client the partitions' offsets are asked through, made when first
    # asked and anew when it answers nothing (as the gateway's principal; its
    # group is joined by nothing).
    _asker: kafka.RenewingAsker = field(init=False)

    def __post_init__(self) -> None:
        self._asker = kafka.RenewingAsker(
            self.bootstrap, principal="gateway", group=f"{self.topics.prefix}.gateway.ask"
        )

    def figures(self, now_ms: int) -> dict:
        try:
            meta = self.admin().list_topics(timeout=TIMEOUT_S).topics
        except Exception as e:  # KafkaException and the like: said in words, not a 500
            words = {"error": _words(e)}
            return {"consumers": words, "dead_letters": words, "as_of": iso(now_ms)}
        return {
            "consumers": self._guarded(lambda: self.consumers(meta)),
            "dead_letters": self._guarded(lambda: self.dead_letters(meta)),
            "as_of": iso(now_ms),
        }

    @staticmethod
    def _guarded(fn: Callable[[], dict]) -> dict:
        try:
            return fn()
        except Exception as e:  # one section's failure is said in its place
            return {"error": _words(e)}

    def _partitions(self, meta: dict, reads: str) -> list[TopicPartition]:
        """Every partition of the topics `reads` names: those under a prefix
        (ending in a dot) or one topic, after the deployment's prefix."""
        whole = f"{self.topics.prefix}.{reads}"
        names = sorted(
            n for n in meta if (n.startswith(whole) if whole.endswith(".") else n == whole)
        )
        return [TopicPartition(n, i) for n in names for i in sorted(meta[n].partitions)]

    def _ends(self, tps: list[TopicPartition]) -> tuple[dict, dict]:
        """(first retained offset, end offset) of each partition; raises when
        the broker did not give both for every one."""
        if not tps:
            return {}, {}
        keys = [_where(tp) for tp in tps]
        low = self._asker.start_offsets(keys, TIMEOUT_S)
        high = self._asker.end_offsets(keys, TIMEOUT_S)
        missing = [k for k in keys if low[k] is None or high[k] is None]
        if missing:
            (t, p), n = missing[0], len(missing)
            raise RuntimeError(f"no offsets for {n} partition(s), {t}[{p}] among them")
        return low, high

    def consumers(self, meta: dict) -> dict:
        admin = self.admin()
        reads = {kind: self._partitions(meta, what) for kind, what in CONSUMERS}
        low, high = self._ends([tp for tps in reads.values() for tp in tps])
        groups = {kind: f"{self.topics.prefix}.{kind}" for kind, _ in CONSUMERS}
        described = admin.describe_consumer_groups(list(groups.values()), request_timeout=TIMEOUT_S)
        items = []
        for kind, group in groups.items():
            item: dict[str, Any] = {"consumer": kind, "group": group}
            try:
                fut = admin.list_consumer_group_offsets(
                    [ConsumerGroupTopicPartitions(group)], request_timeout=TIMEOUT_S
                )[group]
                committed = {
                    _where(tp): tp.offset
                    for tp in fut.result(TIMEOUT_S).topic_partitions
                    if tp.offset >= 0
                }
                lag = 0
                for tp in reads[kind]:
                    where = _where(tp)
                    start = committed.get(where, low[where])
                    lag += max(0, high[where] - max(start, low[where]))
                item.update(
                    lag=lag,
                    partitions=len(reads[kind]),
                    committed_partitions=sum(1 for tp in reads[kind] if _where(tp) in committed),
                )
            except Exception as e:  # this group's figures only
                item["error"] = _words(e)
            item.update(self._members(described[group]))
            items.append(item)
        return {"items": items}

    @staticmethod
    def _members(fut) -> dict:
        """A group's members and state; a group the broker does not know (its
        consumer never started) has none."""
        try:
            desc = fut.result(TIMEOUT_S)
        except Exception as e:  # GROUP_ID_NOT_FOUND and the like
            if "GROUP_ID_NOT_FOUND" in str(e):
                return {"members": 0, "state": "unknown"}
            return {"members": None, "state": f"not described: {e}"}
        return {"members": len(desc.members), "state": desc.state.name.lower()}

    def dead_letters(self, meta: dict) -> dict:
        topic = self.topics.dead_letter
        tps = self._partitions(meta, "dead-letter")
        if not tps:
            return {"topic": topic, "count": 0, "recent": [], "exists": False}
        low, high = self._ends(tps)
        count = sum(high[k] - low[k] for k in high)
        if high != self._letters_at:
            self._letters = self._read_recent(low, high)
            self._letters_at = high
        return {"topic": topic, "count": count, "recent": self._letters, "exists": True}

    def _read_recent(self, low: dict, high: dict) -> list[dict]:
        """The newest `recent` dead letters: the last `recent` of each
        partition read by assignment (no group joined, nothing committed),
        newest first by when they were set aside."""
        start = {k: max(low[k], high[k] - self.recent) for k in high if high[k] > low[k]}
        if not start:
            return []
        c = kafka.consumer(f"{self.topics.prefix}.gateway", self.bootstrap, principal="gateway")
        out: list[dict] = []
        try:
            c.assign([TopicPartition(t, p, o) for (t, p), o in start.items()])
            left = set(start)
            deadline = time.monotonic() + TIMEOUT_S
            while left and time.monotonic() < deadline:
                for m in c.consume(100, timeout=0.2):
                    if m.error() is not None:
                        continue
                    where = (m.topic(), m.partition())  # a Message, not a TopicPartition
                    if m.offset() + 1 >= high[where]:
                        left.discard(where)
                    out.append(self._letter(m))
        finally:
            c.close()
        out.sort(key=lambda d: d.get("at") or "", reverse=True)
        return out[: self.recent]

    @staticmethod
    def _letter(m) -> dict:
        where = {"partition": m.partition(), "offset": m.offset()}
        try:
            _name, d = default_registry().decode(m.value())
        except Exception as e:  # a record on the topic that is not a DeadLetter: said so
            return {**where, "error": f"not a DeadLetter record: {e}"}
        key = d.get("key")
        try:
            key_text = None if key is None else key.decode()
        except UnicodeDecodeError:
            key_text = key.hex()
        return {
            **where,
            "at": iso(d["at"] if isinstance(d["at"], int) else to_ms(d["at"])),
            "consumer": d["consumer"],
            "reason": d["reason"],
            "source_topic": d["source_topic"],
            "source_partition": d["source_partition"],
            "source_offset": d["source_offset"],
            "key": key_text,
        }


class SystemHealth:
    """The answer of GET /v1/system: the database's figures (in the caller's
    operator transaction) and the broker's, each cached for CACHE_S."""

    def __init__(self, gateway, ttl_s: float = CACHE_S):
        self.gateway = gateway
        self.broker = Broker(gateway.kafka_admin, gateway.bootstrap, gateway.topics)
        self._db = Cached(ttl_s)
        self._kafka = Cached(ttl_s)
        self.ttl_s = ttl_s

    def broker_figures(self) -> dict:
        """Asked before the request's transaction: no pool connection waits on the broker."""
        return self._kafka.get(None, lambda: self.broker.figures(self.gateway.clock()))

    def answer(self, tx, broker: dict, window_ms: int) -> dict:
        def compute() -> dict:
            figures = store.figures(tx.conn, tx.now, window_ms, self.gateway.topics.prefix)
            return {"as_of": iso(tx.now), **figures}

        db = self._db.get(window_ms, compute)
        return {
            "cell": self.gateway.cell,
            "cache_ms": int(self.ttl_s * 1000),
            **db,
            "consumers": broker["consumers"],
            "dead_letters": broker["dead_letters"],
            "broker_as_of": broker["as_of"],
        }
