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
  When the thread's listening connection is made (at start, after a
  reconnect), every job's destination is handed over too: a job created
  while nobody listened has its topic made then rather than by its first run.
- A scan of the broker by prefix at start and every `scan_every_s` finds
  what no notification named: topics created by hand, or while a listening
  connection was down. After the thread's reconnect the tenants are read
  again too.

`poll()` is cheap and never waits for the broker: called on every pass of a
consumer loop, it checks its listening socket (cw_topics) without blocking.
A loop blocked in its wait for records (up to 200 ms for the executor; a
dozing dispatcher's until a record comes) would see a notification only
after that wait, so the notifications that need acting on at once come to a
thread of the watch's own (`_listen_here`), on a connection of its own:

- cw_tenants and cw_destinations (the dispatcher's): handed to the worker
  as they come. A dozing dispatcher's loop waits until a record comes, so
  read at its passes, a job made a moment after its tenant was seen only
  with its first run, and its destination topic made and announced only
  then, after the record the webhook service or the executor had to read
  from it (docs/dispatcher.md, "Topics made before the API answers"). The
  catch-up reads at a (re)connection (every tenant, every job's
  destination) run there too, off the loop.
- cw_topics, with `wake_on_announce` (the executor's and the webhook
  service's): an announced topic of the prefix not known yet is added and
  `on_change()` called, which ends the loop's wait (a fetch nudge), so the
  next poll() returns it. Measured: a managed job due 50 ms after it was
  made started 76-236 ms late, the executor's wait being most of it. No
  loop is woken for cw_destinations, which comes with every job created.

Creating topics, `on_destinations` and the broker scans run on the watch's
worker thread, so a run due while another tenant's topics are being created
is not held up behind them (measured: first runs 56-522 ms late at p99
while the dispatcher's loop created the next tenants' topics itself).
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
WAKE_WAIT_S = 0.5  # the thread's longest wait for a notification (then: closing?)
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
        `wake_on_announce`, also on the watch's thread, for each announced topic
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
        self.listening = threading.Event()  # the thread listens now (_listen_here)
        self._listener: threading.Thread | None = None
        # The thread's connection, for a look at what it listens on.
        self.thread_conn: psycopg.Connection | None = None
        self._wake_on_announce = wake_on_announce
        if wake_on_announce:
            assert on_change is not None, "a wake is an on_change call"
        self._here = self._thread_channels()  # the thread's (_listen_here)
        self._woke: set[str] = set()  # added by the thread (announced); poll()'s copy is no news
        self._wake_pending = False  # a wake poll() has not answered yet

    def poll(self) -> list[str] | None:
        """The whole sorted list when it changed since the last call, else None."""
        if self._here and self._listener is None and not self._closing.is_set():
            # Started by the loop's first poll, not at construction: a watch
            # whose service never ran leaves no thread or connection behind.
            self._listener = threading.Thread(
                target=self._listen_here, name="topic-watch-listen", daemon=True
            )
            self._listener.start()
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
        if self._listener is not None:
            self._listener.join(timeout=WAKE_WAIT_S * 2)
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

    def _listen_here(self) -> None:
        """On a thread of its own, with a connection of its own: the
        notifications this watch acts on as they come rather than at the
        consumer loop's next pass (`_here`). New tenants and jobs'
        destinations go to the worker (their topics made there); an
        announced topic of the prefix not known yet is added to the list and
        `on_change()` called (once until poll() runs again: a burst of new
        topics ends the loop's wait once). At each (re)connection, what was
        missed while not listening is read: every tenant, every job's
        destination. The database away: tried again after the services'
        backoff, meanwhile the broker scans find the topics as before."""
        conn: psycopg.Connection | None = None
        delay = RECONNECT_FIRST_S
        while not self._closing.is_set():
            tenants: list[str] = []
            destinations: list[str] = []
            fresh: list[str] = []
            try:
                if conn is None or conn.closed:
                    conn = self.thread_conn = link(self.dsn)
                    for channel in self._here:
                        conn.execute(Q[channel])
                    tenants, destinations = self._missed(conn)
                    delay = RECONNECT_FIRST_S
                    self.listening.set()
                for note in conn.notifies(timeout=WAKE_WAIT_S, stop_after=1):
                    if note.channel == "cw_tenants":
                        tenants.append(note.payload)
                    elif note.channel == "cw_destinations":
                        destinations.append(note.payload)
                    elif note.payload.startswith(self.prefix):
                        fresh.append(note.payload)
            except psycopg.Error as exc:
                self.listening.clear()
                # The loop's poll() still reads announced topics; new tenants
                # and jobs wait for this thread (or the broker scans): said.
                alone = self._here != ["listen_topics"]
                log.log(
                    logging.WARNING if alone else logging.DEBUG,
                    "notifications %s not watched (%s): scanning the broker, again in %.1fs",
                    [c.removeprefix("listen_") for c in self._here],
                    exc,
                    delay,
                )
                if conn is not None:
                    conn.close()
                conn = None
                self._next_scan = 0.0  # scan the broker at the next poll
                self._closing.wait(delay)
                delay = min(delay * 2, RECONNECT_MAX_S)
                continue
            if tenants:
                self._add_tenants(tenants)
            if destinations:
                self._hand_destinations(destinations)
            if fresh:
                self._woken_by(fresh)
        if conn is not None:
            conn.close()

    def _missed(self, conn: psycopg.Connection) -> tuple[list[str], list[str]]:
        """Every tenant and every job's destination, where this thread
        listens for them: what came while nobody listened."""
        tenants: list[str] = []
        destinations: list[str] = []
        if "listen_tenants" in self._here:
            tenants = [r[0] for r in conn.execute(Q["tenant_ids"])]
        if "listen_destinations" in self._here:
            destinations = [r[0] for r in conn.execute(Q["destinations"])]
        return tenants, destinations

    def _woken_by(self, fresh: list[str]) -> None:
        """Announced topics: those not known yet added, and the loop woken."""
        assert self.on_change is not None
        with self._lock:
            new = [t for t in dict.fromkeys(fresh) if t not in self.names]
            self._woke.update(new)
        # Added here, so poll() returns it whatever its own connection has
        # read by then; the loop is woken once until poll() has run.
        if not self._add(new) or self._wake_pending or self._closing.is_set():
            return
        self._wake_pending = True
        self.woken_total += 1
        try:
            self.on_change()
        except Exception as exc:  # the loop's next pass reads it anyway
            log.warning("on_change failed: %s", exc)

    # -- sources --------------------------------------------------------------

    def _read_notifications(self) -> None:
        """Announced topics, on the loop's own connection (new tenants and
        destinations come to the thread, `_listen_here`)."""
        topics: list[str] = []
        if (self._listen is None or self._listen.closed) and time.monotonic() < self._listen_at:
            return  # the database was away: the listener is tried again after its backoff
        try:
            if self._listen is None or self._listen.closed:
                self._listen = link(self.dsn)
                self._listen.execute(Q["listen_topics"])
                self._listen_delay = RECONNECT_FIRST_S
            for note in self._listen.notifies(timeout=0):
                if note.payload.startswith(self.prefix):
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
        with self._lock:
            # A known topic announced again has grown, but not one the wake
            # thread added from this very announcement.
            again = {t for t in topics if t in self.names and t not in self._woke}
            self._woke.difference_update(topics)
        self._add(topics, again)

    def _hand_destinations(self, destinations: list[str]) -> None:
        """cw_destinations' payloads to `on_destinations`, on the worker."""
        batch = []
        for payload in dict.fromkeys(destinations):  # once each, in order
            tenant, _, rest = payload.partition(":")
            target_type, _, queue = rest.partition(":")
            batch.append((tenant, target_type, queue))
        self._submit(self.on_destinations, batch)

    def _thread_channels(self) -> list[str]:
        """The LISTEN statements of the thread's connection, each only where
        the watch acts on that channel: new tenants where it makes tenants'
        topics and jobs' destinations where it creates them (the dispatcher's
        alone: cw_destinations comes with every job created), announced
        topics where they wake the loop (`wake_on_announce`)."""
        channels = []
        if self._wake_on_announce:
            channels.append("listen_topics")
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
