"""The timer statements' single owner (cronwheel/store/timers.py): fragments
spliced whole, the class mapping written nowhere in SQL, one registry of kinds."""

from __future__ import annotations

import re

from cronwheel.store import lifecycle, timer_kinds, timers
from cronwheel.store.sql_loader import SQL_DIR


def test_spliced__every_fragment_replaced__by_its_timers_sql_text():
    for name, sql in lifecycle.Q.items():
        assert "{{" not in sql, name
    for name in ("start_attempt", "start_many"):
        assert timers.Q["arm_attempt_timers"] in lifecycle.Q[name]
    for name in ("end_attempt", "end_attempts"):
        assert timers.Q["end_attempt_timers"] in lifecycle.Q[name]
    assert timers.spliced({"x": "a {{timers.notify_timer}} b"}) == {
        "x": f"a {timers.Q['notify_timer']} b"
    }


def test_no_sql_file_spells_out_the_class_ranks():
    for path in SQL_DIR.glob("*.sql"):
        assert not re.search(r"WHEN\s+'(critical|high|normal|low)'", path.read_text()), path.name


# Known, and to move into timers.sql: the webhook service defers a retry timer
# to a receiver's Retry-After (webhooks.sql defer_retry).
NOT_YET = {"webhooks.sql"}


def test_timers_written_only_from_timers_sql():
    for path in SQL_DIR.glob("*.sql"):
        if path.name == "timers.sql" or path.name in NOT_YET:
            continue
        text = path.read_text()
        assert not re.search(r"(INSERT INTO|UPDATE|DELETE FROM)\s+timers\b", text), path.name


def test_registry__every_kind_once__services_view_without_job():
    assert set(timer_kinds.KINDS) == {"job", "lease", "timeout", "retry", "workflow", "pending"}
    assert set(timer_kinds.timer_handlers(None)) == set(timer_kinds.KINDS) - {"job"}


def test_spliced_fragments__end_in_sql__not_in_a_comment():
    # A fragment is written into the middle of another statement: a comment on
    # its last line would swallow what follows it there (a statement added after
    # end_attempt_timers once took its heading comment along, and every
    # CompleteRun was a syntax error).
    raw = "\n".join((SQL_DIR / f).read_text() for f in ("lifecycle.sql",))
    for name in set(re.findall(r"\{\{timers\.(\w+)\}\}", raw)):
        last = timers.Q[name].strip().splitlines()[-1].strip()
        assert not last.startswith("--"), name
