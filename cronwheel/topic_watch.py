"""The per-tenant topics that exist, by name and kept current, so a new
tenant's first record is read as promptly as any other: the consumer assigns
them (cronwheel.assignment) as soon as they are known here.

Why not a pattern subscription: it learns of a new topic only when its
metadata refresh comes round, so with a 2 s refresh a new tenant's first run
waited 2-5 s. A topic must exist before it is assigned, so:

- Where a watch stands for tenants (`tenant_topic` set: the dispatcher's run
  topics), a new tenant comes from the tenants trigger (channel cw_tenants),
  and its topic is created (`ensure`) before it joins the list. A tenant
  made through the API has it already (the gateway makes a new tenant's and
  a new job's topics before it answers, services/gateway/topics_ready.py);
  `ensure` then finds it, and the watch is what makes it for every other
  way a tenant comes (a move, the store's own calls, a gateway that could
  not reach the broker).
- Topics created on first use (webhook and managed destinations, which the
  dispatcher creates) are announced by their creator on cw_topics.
- A job's destination (channel cw_destinations, from the jobs trigger) is
  handed to `on_destinations([(tenant_id, target_type, queue), ...])`: the
  dispatcher creates that topic before the job's first run, not in its path.
  When the listening connection is made (at start, after a reconnect), every
  job's destination is handed over too: a job created while nobody listened
  has its topic made then rather than by its first run.
- A scan of the broker by prefix at start and every `scan_every_s` finds
  what no notification named: topics created by hand, or while the listening
  connection was down. After a reconnect the tenants are read again too.

`poll()` is cheap and never waits for the broker: called on every pass of a
consumer loop, it checks the listening socket without blocking. A loop
blocked in its wait for records (up to 200 ms for the executor) would see a
notification only after that wait: with `wake_on_announce`, a thread of the
watch listens on cw_topics on a connection of its own and, for an announced
topic of the prefix not known yet, adds it and calls `on_change()`, which
ends the loop's wait (a fetch nudge), so the next poll() returns it.
Measured: a managed job due 50 ms after it was made started 76-236 ms late,
the executor's wait being most of it (docs/dispatcher.md). Only those
announcements wake it: cw_destinations comes with every job created. Creating
topics, `on_destinations` and the broker scans run on one thread of the
watch's own, so a run due while another tenant's topics are being created is
not held up behind them (measured: first runs 56-522 ms late at p99 while the
dispatcher's loop created the next tenants' topics itself).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import psycopg

from cronwheel.store.db import RECONNECT_FIRST_S, RECONNECT_MAX_S, link
from cronwheel.store.sql_loader import queries

log = logging.getLogger("cronwheel.topic_watch")
WAKE_WAIT_S = 0.5  # the wake thread's longest wait for a notification (then: closing?)
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
        on_destinations: Callable[[list[tuple[str, str, str]]], None] | None = None,
        on_change: Callable[[], None] | None = None,
        scan_every_s: float = 30.0,
        check_every_s: float = 0.05,
        wake_on_announce: bool = False,
    ):
        """`metadata_client`: a producer or admin client to scan the broker with,
        never the consumer that subscribes: the scan runs on the watch's thread,
        and a consumer's calls belong to its own. `ensure` and `on_destinations`
        run on that thread too. `on_change()`: called on that thread when it
        changed the list, for the consumer's loop to call poll() at once
        rather than at the end of its wait for records; with
        `wake_on_announce`, also on the wake thread, for each announced topic
        of the prefix not known yet (thread-safe, quick)."""
        self.dsn = dsn
        self.client = metadata_client
        self.prefix = prefix
        self.tenant_topic = tenant_topic
        self.ensure = ensure
        self.on_destinations = on_destinations
        self.on_change = on_change
        self.scan_every_s = scan_every_s
        self.check_every_s = check_every_s
        self.names: set[str] = set()
        self._listen: psycopg.Connection | None = None
        self._listen_at = 0.0  # not before then: the listener's last try failed
        self._listen_delay = RECONNECT_FIRST_S
        self._announcer: psycopg.Connection | None = None  # the worker thread's
        self._next_scan = 0.0
        self._next_check = 0.0
        self._changed = False
        self._grown: set[str] = set()  # known topics announced again or seen grown
        self._counts: dict[str, int] = {}  # partitions per topic, as the last scan saw
        self.woken_total = 0  # on_change calls for notifications that came
        self._lock = threading.Lock()  # names, _changed, _grown, _pending: both threads
        self._pending: set[str] = set()  # being created by the worker
        self._scanning = False
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="topic-watch")
        self._closing = threading.Event()
        self.wake_listening = threading.Event()  # the wake thread listens now
        self._waker: threading.Thread | None = None
        self._wake_on_announce = wake_on_announce
        if wake_on_announce:
            assert on_change is not None, "a wake is an on_change call"
        self._woke: set[str] = set()  # added by the wake thread; poll()'s copy is no news
        self._wake_pending = False  # a wake poll() has not answered yet

    def poll(self) -> list[str] | None:
        """The whole sorted list when it changed since the last call, else None."""
        if self._wake_on_announce and self._waker is None and not self._closing.is_set():
            # Started by the loop's first poll, not at construction: a watch
            # whose service never ran leaves no thread or connection behind.
            self._waker = threading.Thread(
                target=self._wake_on_notifications, name="topic-watch-wake", daemon=True
            )
            self._waker.start()
        self._wake_pending = False
        now = time.monotonic()
        if now >= self._next_check:  # the sources, every check_every_s (or when woken)
            self._next_check = now + self.check_every_s
            self._read_notifications()
            if now >= self._next_scan and not self._scanning:
                self._scanning = True
                self._next_scan = now + self.scan_every_s
                self._submit(self._scan)
        # What the worker added: at once (`on_change` may have just woken the loop).
        with self._lock:
            if not self._changed:
                return None
            self._changed = False
            return sorted(self.names)

    def take_grown(self) -> set[str]:
        """Known topics that may have more partitions since the last call: an
        announcement of a topic already known means that (the relay grows a
        run topic when a record of another class than normal comes), and so
        does a scan that counts more partitions than the last one."""
        with self._lock:
            grown, self._grown = self._grown, set()
        return grown

    def announce(self, topics: list[str]) -> None:
        """`announce` through the worker thread's own connection: for
        `on_destinations`, which runs on that thread."""
        try:
            if self._announcer is None or self._announcer.closed:
                self._announcer = link(self.dsn)
            announce(self._announcer, topics)
        except psycopg.Error as exc:  # the consumers' broker scans find them instead
            log.warning("could not announce topics %s: %s", topics[:5], exc)
            if self._announcer is not None:
                self._announcer.close()
            self._announcer = None

    def close(self) -> None:
        self._closing.set()
        if self._waker is not None:
            self._waker.join(timeout=WAKE_WAIT_S * 2)
        self._worker.shutdown(wait=True, cancel_futures=True)
        for conn in (self._listen, self._announcer):
            if conn is not None:
                conn.close()
        self._listen = self._announcer = None

    def _submit(self, fn, *args) -> None:
        def run():
            try:
                fn(*args)
            except Exception:  # a failed creation or scan is retried by a later scan
                log.exception("topic watch: %s failed", getattr(fn, "__name__", fn))

        with contextlib.suppress(RuntimeError):  # shut down: the consumer is stopping
            self._worker.submit(run)

    def _wake_on_notifications(self) -> None:
        """On a thread of its own, with a connection of its own listening on
        cw_topics: an announced topic of the prefix not known yet is added to
        the list and `on_change()` called (once until poll() runs again: a
        burst of new topics ends the loop's wait once). The database away:
        tried again after the services' backoff, meanwhile poll() finds the
        topics as before."""
        assert self.on_change is not None
        conn: psycopg.Connection | None = None
        delay = RECONNECT_FIRST_S
        while not self._closing.is_set():
            try:
                if conn is None or conn.closed:
                    conn = link(self.dsn)
                    conn.execute(Q["listen_topics"])
                    delay = RECONNECT_FIRST_S
                    self.wake_listening.set()
                fresh = [
                    note.payload
                    for note in conn.notifies(timeout=WAKE_WAIT_S, stop_after=1)
                    if note.payload.startswith(self.prefix)
                ]
            except psycopg.Error as exc:
                self.wake_listening.clear()
                log.debug("topic announcements not watched (%s): again in %.1fs", exc, delay)
                if conn is not None:
                    conn.close()
                conn = None
                self._closing.wait(delay)
                delay = min(delay * 2, RECONNECT_MAX_S)
                continue
            with self._lock:
                new = [t for t in dict.fromkeys(fresh) if t not in self.names]
                self._woke.update(new)
            # Added here, so poll() returns it whatever its own connection has
            # read by then; the loop is woken once until poll() has run.
            if not self._add(new) or self._wake_pending or self._closing.is_set():
                continue
            self._wake_pending = True
            self.woken_total += 1
            try:
                self.on_change()
            except Exception as exc:  # the loop's next pass reads it anyway
                log.warning("on_change failed: %s", exc)
        if conn is not None:
            conn.close()

    # -- sources --------------------------------------------------------------

    def _read_notifications(self) -> None:
        tenants: list[str] = []
        topics: list[str] = []
        destinations: list[str] = []
        if (self._listen is None or self._listen.closed) and time.monotonic() < self._listen_at:
            return  # the database was away: the listener is tried again after its backoff
        try:
            if self._listen is None or self._listen.closed:
                self._listen = link(self.dsn)
                for channel in self._listen_to():
                    self._listen.execute(Q[channel])
                # What was missed while not listening.
                if self.tenant_topic is not None:
                    tenants = [r[0] for r in self._listen.execute(Q["tenant_ids"])]
                if self.on_destinations is not None:
                    destinations = [r[0] for r in self._listen.execute(Q["destinations"])]
                self._listen_delay = RECONNECT_FIRST_S
            for note in self._listen.notifies(timeout=0):
                if note.channel == "cw_tenants":
                    tenants.append(note.payload)
                elif note.channel == "cw_destinations":
                    destinations.append(note.payload)
                elif note.payload.startswith(self.prefix):
                    topics.append(note.payload)
        except psycopg.Error as exc:
            # The services' reconnect policy (cronwheel.store.db), without
            # blocking: poll() runs in a consumer's loop, which must go on.
            log.warning(
                "topic notifications unavailable (%s); scanning the broker, listening again in %.1fs",
                exc,
                self._listen_delay,
            )
            if self._listen is not None:
                self._listen.close()
            self._listen = None
            self._listen_at = time.monotonic() + self._listen_delay
            self._listen_delay = min(self._listen_delay * 2, RECONNECT_MAX_S)
            self._next_scan = 0.0  # scan the broker now for what the notifications would say
        if tenants and self.tenant_topic is not None:
            self._add_tenants(tenants)
        with self._lock:
            # A known topic announced again has grown, but not one the wake
            # thread added from this very announcement.
            again = {t for t in topics if t in self.names and t not in self._woke}
            self._woke.difference_update(topics)
        self._add(topics, again)
        if self.on_destinations is not None and destinations:
            batch = []
            for payload in dict.fromkeys(destinations):  # once each, in order
                tenant, _, rest = payload.partition(":")
                target_type, _, queue = rest.partition(":")
                batch.append((tenant, target_type, queue))
            self._submit(self.on_destinations, batch)

    def _listen_to(self) -> list[str]:
        """The LISTEN statements of the channels this watch acts on: announced
        topics always; new tenants where it makes tenants' topics; jobs'
        destinations where it creates them (the dispatcher's alone)."""
        channels = ["listen_topics"]
        if self.tenant_topic is not None:
            channels.append("listen_tenants")
        if self.on_destinations is not None:
            channels.append("listen_destinations")
        return channels

    def _add_tenants(self, tenant_ids: list[str]) -> None:
        assert self.tenant_topic is not None
        wanted = []
        for tid in dict.fromkeys(tenant_ids):  # the initial load and a notice may both name one
            try:
                name = self.tenant_topic(tid)
            except ValueError:
                log.warning("tenant id %r makes no topic name; not subscribed", tid)
                continue
            with self._lock:
                known = name in self.names or name in self._pending
            if name.startswith(self.prefix) and not known:
                wanted.append(name)
        if not wanted:
            return
        if self.ensure is None:
            self._add(wanted)
            return
        with self._lock:
            self._pending.update(wanted)
        self._submit(self._create, wanted)

    def _create(self, names: list[str]) -> None:
        """On the worker: create the topics, then subscribe to them (the topic
        must exist before it is named)."""
        try:
            assert self.ensure is not None
            self.ensure(names)
        except Exception as exc:  # the next scan finds them once they exist
            log.warning("could not create topics %s: %s", names[:5], exc)
            return
        finally:
            with self._lock:
                self._pending.difference_update(names)
        self._changed_here(self._add(names))

    def _scan(self) -> None:
        """On the worker: every topic of this prefix the broker has."""
        try:
            found = self.client.list_topics(timeout=10).topics
        except Exception as exc:  # KafkaException: scanned again when due
            log.warning("could not list topics: %s", exc)
            return
        finally:
            self._scanning = False
        counts = {t: len(m.partitions) for t, m in found.items() if t.startswith(self.prefix)}
        grown = {t for t, n in counts.items() if self._counts.get(t, n) < n}
        self._counts = counts
        self._changed_here(self._add(list(counts), grown))

    def _changed_here(self, changed: bool) -> None:
        if changed and self.on_change is not None:
            try:
                self.on_change()
            except Exception as exc:  # the loop's next poll() finds the change anyway
                log.warning("on_change failed: %s", exc)

    def _add(self, names: list[str], grown: set[str] | frozenset[str] = frozenset()) -> bool:
        """New names join the list; `grown` ones already on it are reported
        by take_grown (with the list, so poll() says something changed).
        Whether either came."""
        with self._lock:
            new = set(names) - self.names
            grown = grown & self.names
            if new:
                self.names.update(new)
            if grown:
                self._grown |= grown
            if new or grown:
                self._changed = True
        return bool(new or grown)
