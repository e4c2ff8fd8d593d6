"""Which partitions of a consumer's per-tenant topics this instance reads:
assigned by hand, under the store's partition leases, never by a consumer
group's rebalance.

Why not a group: with a topic per tenant, every new tenant was a rebalance of
the whole group. Two different librdkafka aborts came out of those rebalances
under tenant churn (docs/dispatcher.md), each new tenant waited for the group
to settle, and nothing in Python could see a rejoin that revoked nothing.
Here a new topic is one local `incremental_assign`: no group protocol, no
callback inside `consume()`, read as soon as it exists.

Who reads what: a topic belongs to the tenant its name ends with
(`<prefix>.<kind>.<tenant_id>`), and a tenant to the logical partition
`partition_of(tenant_id)` (cronwheel.core.ids). The instances of one consumer
group lease the 1,024 logical partitions among themselves
(cronwheel.store.leases, service = the group id), as the timer and the relay
do, and each assigns every Kafka partition of the topics of the tenants it
holds. A lease that moves moves those tenants' topics. When an instance joins, the
others hand over their extra leases at their next renewal: each settles and
commits what it read of those topics and unassigns them inside the
transaction that releases the leases, so the newcomer starts where it
stopped. When an instance dies, its leases expire after the TTL and the
others take them from its last committed offsets: records it forwarded after
that come again and are skipped by the processed table (or, where its mark
was lost too, forwarded twice: downstream is fenced, as after any crash).

Offsets are still committed under the group id: Kafka accepts commits from a
consumer that is not a member (a "simple" consumer), so `committed()`, lag
and a restart's starting point work as before.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable

import psycopg
from confluent_kafka import OFFSET_END, Consumer, KafkaException, TopicPartition

from cronwheel.consuming import starting_points
from cronwheel.core.ids import partition_of
from cronwheel.kafka import Placement
from cronwheel.store.db import Reconnecting
from cronwheel.store.leases import Leases
from cronwheel.topic_watch import TopicWatch

log = logging.getLogger("cronwheel.assignment")

Where = tuple[str, int]  # (topic, partition)
_ONCE = threading.Event()  # a `stop` already set: Reconnecting.call tries once
_ONCE.set()
UNKNOWN_RETRY_S = 1.0  # a topic's partition count or committed offsets not given

# Topics whose leaders a consumer is told of before they are assigned, one
# metadata request each; more at once (a start with thousands of tenants)
# are left to the consumer's own refresh.
LEARN_LEADERS_UP_TO = 8
UNWAITED_S = 0.001  # an ask sent and not waited for (ask_unwaited)
# New partitions' leaders asked until they serve them (until_served): the
# whole apply's budget, one ask's wait, the pause after a refusal.
READY_WAIT_S = 0.1
READY_ASK_S = 0.02
READY_RETRY_S = 0.005

# A nudge after an assignment can be read by a fetch sent before librdkafka
# put the new partitions into its fetches, and the fetch sent next may not
# name them either: it waits fetch.wait.max.ms (500 ms; made on purpose in
# tests/integration/test_fetch_nudge.py). So while none of a sample of the
# new partitions has had a fetch answered (its cached watermark unknown), the
# fetch is ended again at a pass of the loop, at most FOLLOW_UPS times,
# FOLLOW_UP_GAP_S apart. A partition with no fetch of it answered for another
# reason (no record yet, paused, dozing) costs at most FOLLOW_UPS fetches
# more, per assignment that added partitions. (Waiting for every sampled
# partition instead made first runs later: fetches of a topic just made,
# sent sooner, failed more often; consumer.NEW_TOPIC_FETCH_ERROR_BACKOFF_MS.)
FOLLOW_UPS = 3
FOLLOW_UP_GAP_S = 0.05
FOLLOW_UP_SAMPLE = 16  # new partitions looked at (a start assigns thousands)


def learn_leaders(
    consumer: Consumer, topics: set[str], end_fetch: Callable[[], bool] | None
) -> None:
    """The consumer's metadata for these topics, asked now. A partition of a
    topic the consumer has not met is assigned without a leader, and
    librdkafka waits for its next metadata refresh (up to a second) before
    it fetches it. Asked first, the cache has the leader when the topic is
    made local at the assignment. Each ask goes on the connection of the
    fetch outstanding, which the broker answers first (up to
    fetch.wait.max.ms), and a waited one blocks the caller's loop:
    `end_fetch()` ends that fetch before each ask. Where it cannot (None, or
    False) the asks left are sent and not waited for (`ask_unwaited`). A
    failed ask stops the asks; the rest are left to the refresh. Then each
    new partition is asked until its leader serves it (`until_served`,
    READY_WAIT_S in all)."""
    if len(topics) > LEARN_LEADERS_UP_TO:
        return
    ordered = sorted(topics)
    served: list[TopicPartition] = []
    for i, topic in enumerate(ordered):
        if end_fetch is None or not end_fetch():
            ask_unwaited(consumer, ordered[i:])
            return
        try:
            meta = consumer.list_topics(topic, timeout=2).topics.get(topic)
        except KafkaException as exc:
            log.warning("no metadata for %s before assigning it: %s", topic, exc)
            return
        if meta is not None and not meta.error:
            served.extend(TopicPartition(topic, p) for p in sorted(meta.partitions))
    until_served(consumer, served, end_fetch, time.monotonic() + READY_WAIT_S)


def until_served(
    consumer: Consumer,
    partitions: list[TopicPartition],
    end_fetch: Callable[[], bool],
    deadline: float,
) -> int:
    """Ask the partitions' end offsets (ListOffsets) until their leaders
    answer, until `deadline`: a topic just made can refuse its first fetches
    ("leader epoch is newer than broker epoch", "not leader") though the
    broker's metadata names its leader, and librdkafka then leaves the
    partition out of its fetches for fetch.error.backoff.ms and a metadata
    answer (~200 ms, docs/dispatcher.md). The broker refuses ListOffsets the
    same way until it can serve the partition. All of them in one ask (one
    request per leader: the loop waits for it, so one round trip, where
    `get_watermark_offsets` asked two requests per partition, partition
    after partition; docs/dispatcher.md), which fails whole when any is
    refused and is then asked again whole. Each ask ends the fetch
    outstanding first and waits READY_ASK_S at most (an ask behind a fetch
    the nudge did not end would hold the loop). Returns how many asks were
    refused."""
    if not partitions:
        return 0
    ask = [TopicPartition(tp.topic, tp.partition, OFFSET_END) for tp in partitions]
    refused = 0
    while time.monotonic() < deadline:
        if not end_fetch():
            return refused
        try:
            consumer.offsets_for_times(ask, timeout=READY_ASK_S)
            return refused
        except KafkaException:
            refused += 1
            time.sleep(READY_RETRY_S)  # a refused ask, asked again shortly
    return refused


def ask_unwaited(consumer: Consumer, topics: list[str]) -> None:
    """Each topic's metadata asked, the answer not waited for: a consumer
    whose outstanding fetch nobody can end (a webhook service or executor
    without its nudge topic, cronwheel.fetch_nudge). The answer comes once
    that fetch is answered, and fills the consumer's cache all the same:
    the leader is known within the fetch's wait (up to fetch.wait.max.ms),
    not at the next refresh (docs/dispatcher.md, "New tenants and new
    destinations")."""
    for topic in topics:
        with contextlib.suppress(KafkaException):  # timed out, as meant
            consumer.list_topics(topic, timeout=UNWAITED_S)


class FollowUp:
    """Ends the fetch again after an assignment's nudge that may have come
    too early (FOLLOW_UPS, above): `arm(new)` once the nudge after assigning
    `new` was sent, `tick(consumer, assigned)` at every pass of the loop."""

    def __init__(self, end_fetch: Callable[[], bool] | None, clock=time.monotonic):
        self.end_fetch = end_fetch
        self.clock = clock
        self.sent = 0  # follow-up nudges, in all
        self._unfetched: list[TopicPartition] = []
        self._done = 0
        self._at = 0.0

    def arm(self, consumer: Consumer, new: list[TopicPartition]) -> None:
        """Only partitions this client has no watermark for yet are looked at:
        librdkafka keeps a partition's cached watermark across unassign and
        assign, so one whose lease came back would read as fetched at once."""
        sample = [TopicPartition(tp.topic, tp.partition) for tp in new[:FOLLOW_UP_SAMPLE]]
        self._unfetched = [tp for tp in sample if _watermark(consumer, tp) < 0]
        self._done = 0
        self._at = self.clock() + FOLLOW_UP_GAP_S

    def tick(self, consumer: Consumer, assigned: set[Where]) -> None:
        if not self._unfetched or self.clock() < self._at:
            return
        mine = [tp for tp in self._unfetched if (tp.topic, tp.partition) in assigned]
        if (
            not mine
            or self._done >= FOLLOW_UPS
            or self.end_fetch is None
            or any(_watermark(consumer, tp) >= 0 for tp in mine)
        ):
            self._unfetched = []  # a fetch named them (or they are gone): done
            return
        self._done += 1
        self._at = self.clock() + FOLLOW_UP_GAP_S
        if self.end_fetch():
            self.sent += 1


def _watermark(consumer: Consumer, tp: TopicPartition) -> int:
    """The partition's high watermark as the client's last fetch of it said
    (< 0: no fetch of it answered yet)."""
    try:
        return consumer.get_watermark_offsets(tp, cached=True)[1]
    except KafkaException:  # not a partition the client knows
        return -1


class LeasedAssignment:
    def __init__(
        self,
        leases: Leases,
        prefix: str,
        placement: Placement,
        end_fetch: Callable[[], bool] | None = None,
    ):
        """`prefix`: the topics' common start, `<p>.<kind>.`; what follows is
        the tenant id. `placement` tells each topic's partition count, through
        a client other than the consumer being assigned (cronwheel.consuming).
        `end_fetch()`: ends the consumer's outstanding fetch, whether it
        could (the dispatcher's nudge on its wake topic; the other services'
        on their own, cronwheel.fetch_nudge). New topics' leaders are asked
        before they are assigned (learn_leaders): waited for where the fetch
        was ended, else sent and not waited for; after the assignment the
        fetch is ended again, so the next one names them."""
        self.leases = leases
        self.prefix = prefix
        self.placement = placement
        self.end_fetch = end_fetch
        self.names: set[str] = set()
        self.owned: frozenset[int] = frozenset()
        self.assigned: set[Where] = set()
        self.version = 0  # raised whenever `assigned` changes
        self._next_renewal = 0.0
        self._stale = False  # names or leases changed since the last apply
        self._not_before = 0.0  # a topic's count was unknown: when to ask again
        self._meanwhile: list[TopicPartition] = []  # assigned while leases were released
        self._follow_up = FollowUp(end_fetch)

    @property
    def pending(self) -> bool:
        """Names or leases changed and the assignment has not caught up yet
        (a topic's partition count or committed offsets not given)."""
        return self._stale

    # -- inputs ---------------------------------------------------------------

    def topics(self, names: list[str] | set[str]) -> None:
        """The topics that exist now (TopicWatch.poll's list)."""
        names = {n for n in names if n.startswith(self.prefix)}
        if names != self.names:
            self.names = names
            self._stale, self._not_before = True, 0.0

    def grown(self, names: set[str]) -> None:
        """These topics may have more partitions now: look again."""
        for name in names:
            self.placement.forget(name)
        if names & self.names:
            self._stale, self._not_before = True, 0.0

    def renewal_due(self) -> bool:
        return time.monotonic() >= self._next_renewal

    def renew(
        self,
        conn: psycopg.Connection,
        consumer: Consumer,
        before_unassign: Callable[[list[TopicPartition]], None],
    ) -> None:
        """Renew and rebalance the leases (a transaction of their own). Leases
        handed to another instance are given up first, inside that
        transaction, so it starts at the offsets this one committed and
        forwards nothing twice."""

        def releasing(partitions: list[int]) -> None:
            self._own(self.owned - set(partitions))
            # New topics may be assigned here too: the next apply returns them
            # (with any still held from before, which this apply took).
            self._meanwhile = self.apply(consumer, before_unassign)

        self._own(frozenset(self.leases.tick(conn, on_release=releasing)))
        self._next_renewal = time.monotonic() + self.leases.ttl_ms / 3000

    def _own(self, owned: frozenset[int]) -> None:
        if owned != self.owned:  # logged by the leases' tick (store/leases.py)
            self.owned = owned
            self._stale, self._not_before = True, 0.0

    # -- one consumer loop's pass ---------------------------------------------

    def follow(
        self,
        consumer: Consumer,
        watch: TopicWatch,
        db: Reconnecting,
        stop: threading.Event,
        before_unassign: Callable[[list[TopicPartition]], None],
    ) -> list[TopicPartition] | None:
        """Once per pass of a consumer loop: the watch's new topics, the
        leases renewed when due (every third of their TTL, through `db`), the
        assignment brought up to date. Returns what `apply` assigned, or None
        if `stop` came while the database was away."""
        names = watch.poll()
        if names is not None:
            self.topics(names)
            self.grown(watch.take_grown())
        if self.renewal_due():

            def renew(conn: psycopg.Connection) -> bool:
                self.renew(conn, consumer, before_unassign)
                return True

            if db.call(renew, stop) is None:
                return None
        return self.apply(consumer, before_unassign)

    def leave(self, db: Reconnecting) -> None:
        """On a clean stop: hand every lease back (one try; the TTL is the
        fallback), so another instance takes the tenants at its next renewal."""
        if self.leases.owned:
            db.call(self.leases.release_all, _ONCE)
        self.owned = frozenset()

    # -- the assignment -------------------------------------------------------

    def tenant_of(self, topic: str) -> str | None:
        return topic[len(self.prefix) :] if topic.startswith(self.prefix) else None

    def mine(self, topic: str) -> bool:
        tenant = self.tenant_of(topic)
        return bool(tenant) and partition_of(tenant) in self.owned

    def apply(
        self, consumer: Consumer, before_unassign: Callable[[list[TopicPartition]], None]
    ) -> list[TopicPartition]:
        """Bring the consumer's assignment to what the names and leases say.

        Partitions to give up go to `before_unassign` first (settle, commit,
        forget them), then are unassigned. New ones are assigned at the
        group's committed offsets (consuming.starting_points), which are
        returned (FIRST_OFFSET: none committed). If the group's
        coordinator does not answer, none is assigned, and the next apply,
        a second later, asks again. What a renewal's release assigned
        (`renew`) is returned with it, so the caller hears of every partition
        assigned once."""
        meanwhile, self._meanwhile = self._meanwhile, []
        self._follow_up.tick(consumer, self.assigned)
        if not self._stale or time.monotonic() < self._not_before:
            return meanwhile
        wanted: set[Where] = set()
        unknown = False
        mine = [t for t in self.names if self.mine(t)]
        self.placement.learn(mine)
        for topic in mine:
            n = self.placement.partitions(topic)
            if n is None:
                unknown = True  # asked again at the next apply
                continue
            wanted.update((topic, p) for p in range(n))
        gone = [TopicPartition(t, p) for t, p in sorted(self.assigned - wanted)]
        new = [TopicPartition(t, p) for t, p in sorted(wanted - self.assigned)]
        if gone:
            before_unassign(gone)
            consumer.incremental_unassign(gone)
            self.assigned.difference_update((tp.topic, tp.partition) for tp in gone)
        if new:
            start = starting_points(consumer, new)
            if start is None:
                unknown, new = True, []  # none assigned yet: asked again
            else:
                new = start
                learn_leaders(consumer, {tp.topic for tp in new}, self.end_fetch)
                consumer.incremental_assign(new)
                # librdkafka keeps a partition's application pause across
                # unassign and assign: one given up while paused (a class
                # below another, a quota, a slot cap, a doze) would come
                # back to this instance never fetched.
                consumer.resume([TopicPartition(tp.topic, tp.partition) for tp in new])
                self.assigned.update((tp.topic, tp.partition) for tp in new)
                # The fetch outstanding does not name them and would hold
                # their first records up to fetch.wait.max.ms: ended.
                if self.end_fetch is not None and self.end_fetch():
                    self._follow_up.arm(consumer, new)
        if gone or new:
            self.version += 1
        self._stale = unknown
        # Not on every pass: each ask is a metadata request of its own.
        self._not_before = time.monotonic() + UNKNOWN_RETRY_S if unknown else 0.0
        # One a renewal's release assigned and this apply gave up is not news.
        meanwhile = [tp for tp in meanwhile if (tp.topic, tp.partition) in self.assigned]
        return meanwhile + new
