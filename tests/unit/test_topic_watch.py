"""TopicWatch's listener while the database is away: the services' reconnect
policy (cronwheel.store.db), without ever blocking the consumer loop that polls it."""

from __future__ import annotations

import logging
import socket

from cronwheel import topic_watch
from cronwheel.store.db import RECONNECT_MAX_S


class _NoBroker:
    def list_topics(self, *args, **kwargs):
        raise RuntimeError("no broker in this test")


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_listener__database_away__tried_again_only_after_the_backoff(monkeypatch, caplog):
    # A first delay longer than this test, so "not tried again" does not hang on timing.
    monkeypatch.setattr(topic_watch, "RECONNECT_FIRST_S", 30.0)
    dsn = f"postgresql://nobody:x@127.0.0.1:{_closed_port()}/none"
    watch = topic_watch.TopicWatch(dsn, _NoBroker(), "cw.runs.", check_every_s=0, scan_every_s=3600)
    try:
        with caplog.at_level(logging.WARNING, logger="cronwheel.topic_watch"):
            for _ in range(20):
                watch.poll()
        tries = [r for r in caplog.records if "notifications unavailable" in r.getMessage()]
        assert len(tries) == 1  # one try, then none before the backoff has passed
        assert watch._listen is None
        assert watch._listen_delay == RECONNECT_MAX_S  # the next wait doubles, capped
    finally:
        watch.close()
