"""When a worker's Kafka consumer is stuck for good and must be replaced.

Two states librdkafka (2.x) does not leave by itself, both seen after a
broker restart:

- Partitions assigned and never read. The consumer fetches the group's
  committed offsets for a new assignment itself; when that request fails as
  a whole (NOT_COORDINATOR, the coordinator restarting), it reports "Failed
  to fetch committed offsets ..." once, does not retry, and never starts
  those partitions (rdkafka_assignment.c: "Do nothing for request-level
  errors"). Records wait on them until the consumer is replaced.
- Out of the group, no partitions, and the group's coordinator never found
  again: `committed()` times out, no error is reported, nothing is read
  (docs/reliability.md, kafka_restart).
- No partitions, and the consumer's client gets no answer from a broker that
  answers a new client of the same worker: its own client is wedged (seen
  after a broker restart, not one line logged; every other client of the
  process may be wedged too, and new ones are not).
- Out of the group, no partitions, while the group's coordinator answers:
  the coordinator's view of the group does not list this consumer, or lists
  it with partitions it does not have, or nobody in the group reads the
  topic (seen once in CI after a broker restart, 417 runs waiting).

A consumer with no partitions is often fine (more workers than partitions),
so these count only once the group's coordinator does not answer either (or
the broker has not answered this consumer at all for BROKER_SILENT_FOR_S),
or what it asks shows this consumer stranded twice in a row (the group's
description, `stranded`, where a group in the middle of a rebalance is not
judged; or a broker that answers another client and not this consumer). The worker
asks; this module only decides, from what the worker saw, so that it can be
tested without a broker."""

from __future__ import annotations

import time
from collections.abc import Callable

# The message librdkafka gives the error event of a failed fetch of the
# assignment's committed offsets (rdkafka_assignment.c); no error code
# tells it apart from other NOT_COORDINATOR events, which heal themselves.
UNSTARTED = "Failed to fetch committed offsets"

EMPTY_FOR_S = 30.0  # three session timeouts without partitions: ask the coordinator
ASK_EVERY_S = 10.0  # then at most this often
REPLACE_GAP_S = 30.0  # never replace the consumer more often than this
# Not even the topic's metadata for this long: replaced too. A broker down
# that long loses nothing by it (the new consumer waits for it as the old
# one did), and a consumer whose own connections are what is broken gets
# new ones.
BROKER_SILENT_FOR_S = 120.0

# What asking showed (the worker's `_ask`): the coordinator gave the
# committed offsets; the broker gave the topic's metadata but the
# coordinator not the offsets; the broker gave nothing; the coordinator
# answered, and its description of the group shows this consumer stranded.
ANSWERS, COORDINATOR_SILENT, BROKER_SILENT = "answers", "coordinator silent", "broker silent"
STRANDED = "stranded"
STRANDED_ASKS = 2  # in a row: one description may catch a group between two steps

# Group states (confluent_kafka.ConsumerGroupState names) in which the
# members' assignments are settled; during a rebalance they are not.
SETTLED = {"STABLE", "EMPTY", "DEAD"}


def stranded(state: str, members: dict[str, set[int]], me: str, partitions: int) -> str | None:
    """Why a consumer that holds no partitions of its topic is stranded, from
    its group coordinator's description of the group (state, and each
    member's partitions of the topic by member id), or None when it is not
    (or the group is rebalancing). `me`: the consumer's member id;
    `partitions`: how many the topic has."""
    if state not in SETTLED:
        return None
    if me not in members:
        return (
            f"the group's coordinator does not list this consumer among its "
            f"{len(members)} member(s) (group {state.lower()})"
        )
    if members[me]:
        return (
            f"the group's coordinator says this consumer holds partitions "
            f"{sorted(members[me])}, and it holds none"
        )
    if partitions and not any(members.values()):
        return f"no member of the group holds any of the topic's {partitions} partition(s)"
    return None


class ConsumerWatchdog:
    def __init__(
        self,
        *,
        empty_for_s: float = EMPTY_FOR_S,
        ask_every_s: float = ASK_EVERY_S,
        replace_gap_s: float = REPLACE_GAP_S,
        broker_silent_for_s: float = BROKER_SILENT_FOR_S,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.empty_for_s, self.ask_every_s, self.replace_gap_s = (
            empty_for_s,
            ask_every_s,
            replace_gap_s,
        )
        self.broker_silent_for_s = broker_silent_for_s
        self._clock = clock
        self._broker_silent_since: float | None = None
        self._empty_since: float | None = None
        self._asked_at: float | None = None
        self._unstarted = False
        self._stranded_asks = 0
        self._replaced_at: float | None = None
        self.asked_total = 0
        self.replaced_total = 0

    def error(self, message: str) -> None:
        """An error event the consumer returned."""
        if message.startswith(UNSTARTED):
            self._unstarted = True

    def should_ask(self, assigned: bool) -> bool:
        """Once per poll-loop pass: whether to ask the group's coordinator now
        (the consumer has had no partitions for EMPTY_FOR_S)."""
        now = self._clock()
        if assigned:
            self._empty_since = None
            return False
        if self._empty_since is None:
            self._empty_since = now
        if now - self._empty_since < self.empty_for_s:
            return False
        if self._asked_at is not None and now - self._asked_at < self.ask_every_s:
            return False
        self._asked_at = now
        self.asked_total += 1
        return True

    def replace(self, heard: str | None = None, detail: str = "") -> str | None:
        """Why the consumer must be replaced now, or None. `heard`: what
        asking (after should_ask) showed, one of ANSWERS, COORDINATOR_SILENT,
        BROKER_SILENT, STRANDED (with `detail`, what `stranded` said); None
        when not asked this pass."""
        now = self._clock()
        if heard is not None:
            self._stranded_asks = self._stranded_asks + 1 if heard == STRANDED else 0
        if heard == BROKER_SILENT:
            if self._broker_silent_since is None:
                self._broker_silent_since = now
        elif heard is not None:
            self._broker_silent_since = None
        empty_s = now - self._empty_since if self._empty_since is not None else 0.0
        if heard == COORDINATOR_SILENT:
            why = f"no partitions for {empty_s:.0f} s and the group's coordinator does not answer"
        elif (
            self._broker_silent_since is not None
            and now - self._broker_silent_since >= self.broker_silent_for_s
        ):
            why = (
                f"no partitions for {empty_s:.0f} s and no answer from the broker for "
                f"{now - self._broker_silent_since:.0f} s"
            )
        elif self._stranded_asks >= STRANDED_ASKS:
            why = f"no partitions for {empty_s:.0f} s and {detail}"
        elif self._unstarted:
            why = "partitions assigned whose committed offsets librdkafka failed to fetch"
        else:
            return None
        if self._replaced_at is not None and now - self._replaced_at < self.replace_gap_s:
            return None  # asked again after the gap
        # The new consumer's time without partitions counts from now.
        self._replaced_at, self._unstarted, self._broker_silent_since = now, False, None
        self._stranded_asks = 0
        self._empty_since = now if self._empty_since is not None else None
        self.replaced_total += 1
        return why
