"""The per-tenant topics a consumer reads, subscribed to by name and kept
current, so a new tenant's first record is read as promptly as any other.

Why by name: a pattern subscription learns of a new topic only when its
metadata refresh comes round, so with a 2 s refresh a new tenant's first run
waited 2-5 s. Subscribing to the same pattern again changes nothing, and
neither does naming a topic beside a pattern: librdkafka sees no change. A
list of names that grows triggers an incremental rebalance at once, and
the new topic is assigned 10-460 ms after it exists, with nothing revoked.
The topic must exist before it is named: a name subscribed before its topic
exists waits for the refresh just the same. So:

- Where a watch stands for tenants (`tenant_topic` set: the dispatcher's run
  topics), a new tenant comes from the tenants trigger (channel cw_tenants),
  and its topic is created (`ensure`) before it joins the list.
- Topics created on first use (webhook and managed destinations, which the
  dispatcher creates) are announced by their creator on cw_topics.
- A job's destination (channel cw_destinations, from the jobs trigger) is
  handed to `on_destination(tenant_id, target_type, queue)`: the dispatcher
  creates that topic before the job's first run, not in its path.
- A scan of the broker by prefix at start and every `scan_every_s` finds
  what no notification named: topics created by hand, or while the listening
  connection was down. After a reconnect the tenants are read again too.

`poll()` is cheap: called on every pass of a consumer loop, it checks the
listening socket without blocking and scans the broker only when due.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import psycopg

from cronwheel.store.sql_loader import queries

log = logging.getLogger("cronwheel.topic_watch")
Q = queries("topics")


def announce(conn: psycopg.Connection, topics: list[str]) -> None:
    """Tell every watch that these topics exist now (on commit, if in a transaction)."""
    if topics:
        conn.execute(Q["announce_topics"], {"topics": topics}).fetchall()


class TopicWatch:
    def __init__(
        self,
        dsn: str,
        metadata_client,
        prefix: str,
        *,
        tenant_topic: Callable[[str], str] | None = None,
        ensure: Callable[[list[str]], None] | None = None,
        on_destination: Callable[[str, str, str], None] | None = None,
        scan_every_s: float = 30.0,
        check_every_s: float = 0.05,
    ):
        """`metadata_client`: a producer or admin client to scan the broker with,
        never the consumer that subscribes (see cronwheel.consuming on callbacks;
        poll() runs outside them, but one rule is simpler to keep)."""
        self.dsn = dsn
        self.client = metadata_client
        self.prefix = prefix
        self.tenant_topic = tenant_topic
        self.ensure = ensure
        self.on_destination = on_destination
        self.scan_every_s = scan_every_s
        self.check_every_s = check_every_s
        self.names: set[str] = set()
        self._listen: psycopg.Connection | None = None
        self._next_scan = 0.0
        self._next_check = 0.0
        self._changed = False

    def poll(self) -> list[str] | None:
        """The whole sorted list when it changed since the last call, else None."""
        now = time.monotonic()
        if now < self._next_check:
            return None
        self._next_check = now + self.check_every_s
        self._read_notifications()
        if now >= self._next_scan:
            self._scan()
            self._next_scan = now + self.scan_every_s
        if not self._changed:
            return None
        self._changed = False
        return sorted(self.names)

    def close(self) -> None:
        if self._listen is not None:
            self._listen.close()
            self._listen = None

    # -- sources --------------------------------------------------------------

    def _read_notifications(self) -> None:
        tenants: list[str] = []
        topics: list[str] = []
        destinations: list[str] = []
        try:
            if self._listen is None or self._listen.closed:
                self._listen = psycopg.connect(self.dsn, autocommit=True)
                self._listen.execute(Q["listen"])
                if self.tenant_topic is not None:  # what was missed while not listening
                    tenants = [r[0] for r in self._listen.execute(Q["tenant_ids"])]
            for note in self._listen.notifies(timeout=0):
                if note.channel == "cw_tenants":
                    tenants.append(note.payload)
                elif note.channel == "cw_destinations":
                    destinations.append(note.payload)
                elif note.payload.startswith(self.prefix):
                    topics.append(note.payload)
        except psycopg.Error as exc:
            log.warning("topic notifications unavailable (%s); scanning the broker", exc)
            self.close()
            self._next_scan = 0.0  # scan now; the listener reconnects on the next check
        if tenants and self.tenant_topic is not None:
            self._add_tenants(tenants)
        self._add([t for t in topics if t not in self.names])
        if self.on_destination is not None:
            for payload in dict.fromkeys(destinations):  # once each, in order
                tenant, _, rest = payload.partition(":")
                target_type, _, queue = rest.partition(":")
                self.on_destination(tenant, target_type, queue)

    def _add_tenants(self, tenant_ids: list[str]) -> None:
        assert self.tenant_topic is not None
        wanted = []
        for tid in tenant_ids:
            try:
                name = self.tenant_topic(tid)
            except ValueError:
                log.warning("tenant id %r makes no topic name; not subscribed", tid)
                continue
            if name.startswith(self.prefix) and name not in self.names:
                wanted.append(name)
        if wanted and self.ensure is not None:
            try:
                self.ensure(wanted)
            except Exception as exc:  # the next scan finds them once they exist
                log.warning("could not create topics %s: %s", wanted[:5], exc)
                return
        self._add(wanted)

    def _scan(self) -> None:
        try:
            found = self.client.list_topics(timeout=10).topics
        except Exception as exc:  # KafkaException: scanned again when due
            log.warning("could not list topics: %s", exc)
            return
        self._add([t for t in found if t.startswith(self.prefix) and t not in self.names])

    def _add(self, names: list[str]) -> None:
        if names:
            self.names.update(names)
            self._changed = True
