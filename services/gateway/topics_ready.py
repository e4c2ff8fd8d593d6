"""A tenant's topics made before the API answers the call that needs them, so
that a run due a moment after its tenant or its job was made is as punctual
as any other (issue 21).

The dispatcher makes them too (cronwheel/topic_watch.py, on cw_tenants and
cw_destinations), and that alone is enough for every run to be delivered: but
those notifications come when the transaction commits, about when the
gateway answers, and making a topic and waiting for its leader takes tens of
milliseconds, so a run due that soon after its tenant was created waited for
its topics (docs/dispatcher.md). Here, the call that created a
tenant (its run topic) or a job (the run topic and the job's destination)
makes them after its transaction commits, and answers once the broker's
metadata names their leaders.

Best effort, never a refusal: the job is in the database, so it is delivered
whether or not the broker answers here. A broker that does not answer within
`wait_s` (CRONWHEEL_GATEWAY_TOPICS_WAIT_MS) costs one call that long; the
calls of the next QUIET_S make nothing (the dispatcher makes their topics),
so a broker away does not slow every new job. Topics made or found are
remembered for the life of the process, so only a tenant's first job per
destination pays the round trip.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable

from prometheus_client import Counter

from cronwheel import kafka
from cronwheel.kafka import Topics

log = logging.getLogger("cronwheel.gateway.topics")

WAIT_S = 2.0  # the longest a call waits for the broker to make its topics (by default)
QUIET_S = 30.0  # after a failure, how long calls leave their topics to the dispatcher

TOPICS = Counter(
    "cronwheel_gateway_topics_total",
    "Tenants' topics the gateway made (or found made) before answering, and those it"
    " could not make (the dispatcher makes them, after the answer)",
    ["outcome"],
)


class TopicsReady:
    def __init__(
        self,
        topics: Topics,
        admin: Callable[[], object],
        *,
        wait_s: float = WAIT_S,
        quiet_s: float = QUIET_S,
        clock: Callable[[], float] = time.monotonic,
    ):
        """`admin`: the gateway's admin client, asked for at the first topic made."""
        self.topics = topics
        self.admin = admin
        self.wait_s = wait_s
        self.quiet_s = quiet_s
        self.clock = clock
        self._known: set[str] = set()
        self._quiet_until = float("-inf")
        self._lock = threading.Lock()

    def make(self, tenants: Iterable[str] = (), jobs: Iterable[dict] = ()) -> None:
        """The run topic of each tenant; each job's run topic and destination
        (jobs as the API shows them). In one request per partition count."""
        names = {self.topics.runs(t) for t in tenants}
        for job in jobs:
            tenant, target = job["tenant_id"], job["target"]
            names.add(self.topics.runs(tenant))
            try:
                names.add(self.topics.destination(tenant, target["type"], target.get("queue")))
            except ValueError:
                continue  # a target with no topic of its own
        if names:
            self._make(names)

    def _make(self, names: set[str]) -> None:
        with self._lock:
            todo = names - self._known
            if not todo or self.clock() < self._quiet_until:
                return
        try:
            kafka.ensure_sized(todo, self.topics, self.admin(), wait_s=self.wait_s)
        except Exception as e:  # the broker away or refusing: the dispatcher makes them
            with self._lock:
                self._quiet_until = self.clock() + self.quiet_s
            TOPICS.labels("failed").inc(len(todo))
            log.warning(
                "could not make topics %s before answering (left to the dispatcher; "
                "none made here for %.0f s): %s",
                sorted(todo),
                self.quiet_s,
                e,
            )
            return
        with self._lock:
            self._known |= todo
        TOPICS.labels("made").inc(len(todo))
