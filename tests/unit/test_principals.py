"""The ACL table of cronwheel/principals.py keeps its promises: a tenant's
grants are read-only and cover its own prefix only; writes to the platform's
topics belong to the roles that produce them; only the gateway touches the
cluster. (The broker's enforcement is tested in test_kafka_isolation.py.)"""

from __future__ import annotations

from confluent_kafka.admin import AclOperation, ResourcePatternType, ResourceType

from cronwheel import principals
from cronwheel.kafka import Topics

TOPICS = Topics("cw")
WRITES = {AclOperation.WRITE, AclOperation.CREATE, AclOperation.ALTER}


def test_tenant__reads_its_own_queue_prefix_and_group_prefix__writes_nothing():
    bindings = principals.tenant_bindings(TOPICS, "ten_abc")
    assert {b.principal for b in bindings} == {"User:tenant-ten_abc"}
    assert not {b.operation for b in bindings} & WRITES
    topics = {b.name for b in bindings if b.restype == ResourceType.TOPIC}
    groups = {b.name for b in bindings if b.restype == ResourceType.GROUP}
    assert topics == {"cw.q.ten_abc."} and groups == {"cronwheel-worker.cw.q.ten_abc."}
    assert all(b.resource_pattern_type == ResourcePatternType.PREFIXED for b in bindings)


def test_tenant_prefixes__end_in_a_dot__so_no_tenant_covers_another():
    # "ten_ab" must not match "ten_abc"'s topics: the dot ends the tenant id,
    # and a tenant id cannot contain one (Topics refuses it).
    short = principals.tenant_topic_prefix(TOPICS, "ten_ab")
    assert not TOPICS.queue("ten_abc", "q").startswith(short)
    assert TOPICS.queue("ten_ab", "q").startswith(short)
    assert principals.tenant_group_prefix(TOPICS, "ten_ab").endswith(".")


def test_platform__writers_of_each_topic_kind():
    writers: dict[str, set[str]] = {}
    for b in principals.platform_bindings("cw"):
        if b.restype == ResourceType.TOPIC and b.operation == AclOperation.WRITE:
            writers.setdefault(b.name, set()).add(b.principal.removeprefix("User:cronwheel-"))
    assert writers == {
        "cw.runs.": {"relay"},
        "cw.run-completed": {"relay"},
        "cw.wake": {"relay", "dispatcher"},
        "cw.q.": {"dispatcher"},
        "cw.webhook.": {"dispatcher"},
        "cw.managed.": {"dispatcher"},
        "cw.dead-letter": {"dispatcher", "workflow", "webhook", "executor"},
        # Each written by its service alone, to end its own fetches.
        "cw.nudge.webhook": {"webhook"},
        "cw.nudge.executor": {"executor"},
    }


def test_wake_topic__read_by_the_dispatcher_alone__no_tenant_grant_covers_it():
    # It says which tenants are busy: the relay wakes, the dispatcher nudges,
    # and only the dispatcher (and the observer, which reads everything) reads it.
    readers = {
        b.principal.removeprefix("User:cronwheel-")
        for b in principals.platform_bindings("cw")
        if b.restype == ResourceType.TOPIC
        and b.operation == AclOperation.READ
        and TOPICS.wake.startswith(b.name)
        and (b.name == TOPICS.wake or b.resource_pattern_type == ResourcePatternType.PREFIXED)
    }
    assert readers == {"dispatcher", "observer"}
    assert not TOPICS.wake.startswith(principals.tenant_topic_prefix(TOPICS, "ten_a"))


def test_platform__only_the_gateway_on_the_cluster__the_observer_never_writes():
    bindings = principals.platform_bindings("cw")
    cluster = {b.principal for b in bindings if b.restype == ResourceType.BROKER}
    assert cluster == {"User:cronwheel-gateway"}
    observer = [b for b in bindings if b.principal == "User:cronwheel-observer"]
    assert observer and not {b.operation for b in observer} & WRITES


def test_roles__each_has_its_principal__unknown_refused():
    assert principals.username("relay") == "cronwheel-relay"
    assert set(principals.GRANTS) == set(principals.ROLES)
    try:
        principals.username("admin")
    except ValueError:
        pass
    else:
        raise AssertionError("admin is not a role a service may take")
