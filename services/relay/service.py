"""The outbox relay: publishes outbox rows of its leased partitions to Kafka and
deletes them only after the broker acknowledged them.

Order (docs/priority.md): each pass reads by priority class, then an equal
share per lane (a tenant's run topic) round-robin, oldest first within a lane,
and publishes in that order, so a tenant's flood delays neither critical runs
nor another tenant's. Each RunReady goes to its class's partitions of the run
topic (outbox.partition_for), which lets the dispatcher pause lower classes.

A crash between produce and delete publishes those rows again on restart, so a
topic may hold duplicates; every consumer is idempotent by run_id (and attempt),
and the database never holds two runs for one instant. The producer is
idempotent, so retries inside one session neither duplicate nor reorder.
"""

from __future__ import annotations

import json
import logging
import threading
import time

import psycopg

from cronwheel import kafka, metrics
from cronwheel.store import outbox
from cronwheel.store.db import connect
from cronwheel.store.leases import Leases

log = logging.getLogger("cronwheel.relay")


class Relay:
    def __init__(
        self,
        dsn: str,
        bootstrap: str,
        *,
        batch: int = 5000,
        lease_ttl_ms: int = 10_000,
        idle_ms: int = 500,
        instance: str | None = None,
    ):
        self.dsn = dsn
        # linger 1 ms: the relay already batches by reading the outbox in bulk.
        self.producer = kafka.producer(bootstrap, **{"linger.ms": 1})
        self.leases = Leases("relay", ttl_ms=lease_ttl_ms)
        if instance:
            self.leases.owner = instance
        self.batch = batch
        self.idle_ms = idle_ms
        self.published_total = 0
        self.more = False  # the last pass left rows in some lane
        self._turn = 0
        self._backlog = False  # the last pass left rows behind: read by lanes
        self._inflight: set[int] = set()  # produced, not yet acknowledged
        self._acked: list[int] = []  # acknowledged, not yet deleted
        self._failed = 0
        self.ack_wait_ms = 2  # with rows in flight, how long to wait for acks per turn
        self._partitions: dict[str, int] = {}  # topic -> partition count

    def run(self, stop: threading.Event) -> None:
        with (
            connect(self.dsn, idle_tx_timeout_ms=self.leases.ttl_ms) as conn,
            connect(self.dsn) as listen,
        ):
            listen.execute("LISTEN cw_outbox")
            next_lease = 0.0
            read = True  # look for new rows this turn (else only settle acks)
            try:
                while not stop.is_set():
                    if time.monotonic() >= next_lease:
                        self.leases.tick(conn)
                        metrics.OWNED_PARTITIONS.labels("relay").set(len(self.leases.owned))
                        next_lease = time.monotonic() + self.leases.ttl_ms / 3000
                        read = True
                    if read:
                        n = self.relay_once(conn)
                        if n >= self.batch or self.more:
                            continue
                    else:
                        self._settle(conn)
                    if self._inflight:
                        # Wait briefly for acknowledgements; read again only when a
                        # commit announced new rows (no query per turn otherwise).
                        self.producer.poll(self.ack_wait_ms / 1000)
                        read = any(True for _ in listen.notifies(timeout=0.0001, stop_after=1))
                        continue
                    # Wait for a notification; read anyway after idle_ms.
                    for _ in listen.notifies(timeout=self.idle_ms / 1000, stop_after=1):
                        pass
                    read = True
            finally:
                self.producer.flush(10)
                try:
                    self._settle(conn)
                    self.leases.release_all(conn)
                except psycopg.Error:
                    log.warning("could not delete acknowledged rows or release leases")

    def relay_once(self, conn: psycopg.Connection) -> int:
        """Publish pending rows not already in flight, and delete the rows Kafka
        has acknowledged since the last call; returns rows read.

        Without a backlog this pipelines: a pass produces and goes on, the
        acknowledgements arrive while the next pass reads, so a row waits for
        one read and its own acknowledgement rather than a whole pass before
        it. Rows in flight are excluded from the read (`read_small`), never
        deleted before their acknowledgement. Under a backlog the fair read
        (`read_fair`) needs nothing in flight: the pass waits for the
        acknowledgements first, as a batch of thousands amortises that wait."""
        self.more = False
        self._settle(conn)
        if not self.leases.owned:
            return 0
        self._turn += 1
        owned = list(self.leases.owned)
        fair = None
        if not self._backlog and len(self._inflight) < self.batch:
            fair = outbox.read_small(conn, owned, self.batch, exclude=list(self._inflight))
        if fair is None:
            self._drain(conn)
            fair = outbox.read_fair(conn, owned, self.batch, self._turn)
        self._backlog = fair.more or len(fair.rows) >= self.batch
        rows = fair.rows
        if not rows:
            return 0
        self.more = fair.more
        if fair.lanes > 1:
            metrics.FAIR_LANES.labels("relay").set(fair.lanes)
        for row_id, topic, key, value, headers, rank in rows:
            hdrs = (
                list(headers.items())
                if isinstance(headers, dict)
                else (list(json.loads(headers).items()) if headers else None)
            )
            self._inflight.add(row_id)
            while True:
                try:
                    self.producer.produce(
                        topic,
                        value=bytes(value),
                        key=bytes(key) if key is not None else None,
                        headers=hdrs,
                        on_delivery=lambda err, _msg, rid=row_id: self._delivered(err, rid),
                        **self._placement(topic, rank, key),
                    )
                    break
                except BufferError:
                    self.producer.poll(0.05)  # local queue full: let deliveries drain
        if self._backlog:
            self._drain(conn)
        else:
            self.producer.poll(0)
            self._settle(conn)
        return len(rows)

    def _delivered(self, err, row_id: int) -> None:
        """Delivery callback (inside producer.poll/flush, on this thread)."""
        if err is None:
            self._acked.append(row_id)
        else:
            self._inflight.discard(row_id)  # read and produced again by a later pass
            self._failed += 1

    def _drain(self, conn: psycopg.Connection) -> None:
        """Wait until nothing is in flight, then delete what was acknowledged."""
        if self._inflight:
            remaining = self.producer.flush(30)
            if remaining:
                log.warning(
                    "%d records not acknowledged within 30 s; they stay in the outbox", remaining
                )
        self._settle(conn)

    def _settle(self, conn: psycopg.Connection) -> None:
        """Delete the acknowledged rows (one statement) and count the outcome."""
        acked, self._acked = self._acked, []
        if acked:
            outbox.delete_delivered(conn, acked)
            self._inflight.difference_update(acked)
            self.published_total += len(acked)
            metrics.OUTBOX_PUBLISHED.inc(len(acked))
        if self._failed:
            metrics.OUTBOX_FAILED.inc(self._failed)
            log.warning("%d outbox rows failed to publish; retrying on a later pass", self._failed)
            self._failed = 0
        if len(self.producer) == 0:
            # Nothing queued or awaiting an answer: a row still marked in flight
            # was lost without a callback (it cannot be), so read it again.
            self._inflight.clear()

    def _placement(self, topic: str, rank: int, key) -> dict:
        """{"partition": p} inside the class's partitions of the topic, or {} (the
        producer's partitioner) while its partition count is unknown."""
        n = self._partitions.get(topic)
        if n is None:
            try:  # one small request per topic, once (the whole cluster's costs ~100x)
                meta = self.producer.list_topics(topic, timeout=5).topics.get(topic)
            except Exception as exc:  # KafkaException: metadata is retried next pass
                log.warning("no metadata for %s: %s", topic, exc)
                return {}
            if meta is None or meta.error is not None or not meta.partitions:
                return {}
            n = self._partitions[topic] = len(meta.partitions)
        p = outbox.partition_for(rank, bytes(key) if key is not None else None, n)
        return {} if p is None else {"partition": p}

    def close(self) -> None:
        self.producer.flush(10)
