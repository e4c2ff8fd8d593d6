"""A moved tenant's Kafka side (issue 24; docs/cells.md, "Workers follow"):
what the move does on the two cells' brokers, beside what cronwheel/moves.py
does in their databases. The mover reaches each broker as that cell's
admin principal (as it reaches each database as its owner).

- At the copy (and again in the freeze, for a queue made meanwhile): the
  target gets the tenant's principal with the credential it has in the
  source (cronwheel/scram.py: the same password logs in there), its ACLs,
  and every queue topic the tenant has in the source, with as many
  partitions. Its run, webhook and managed topics come as a new tenant's do:
  the relay and the dispatcher create them when they first write.
- In the freeze, after the outbox drain: the source's dispatcher has
  forwarded every record of the tenant's run topic to its queue topic (its
  committed offsets reach the end), so no record reaches the source's queue
  topics after the flip: what a worker finds there at the flip is all there
  will be. And its workflow group has committed the end of run-completed as
  it was after the drain: every completion of the tenant's runs is applied
  to its workflow runs before the last copy (a workflow run would not go on
  in the target otherwise).
- After the flip: the source's topics, groups and principal are removed once
  the tenant's workers have consumed its queue topics to the end (their
  groups' committed offsets), or after `linger_s` whatever is left: a record
  not read by then is a run PENDING in the target, announced again there by
  its pending deadline (docs/pending-deadline.md).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from cronwheel import principals
from cronwheel.kafka import Topics

log = logging.getLogger("cronwheel.moves")


@dataclass(frozen=True)
class Broker:
    """One cell's broker as the mover reaches it: librdkafka settings of a
    principal that may alter the cluster (bootstrap.servers included)."""

    cell: str
    conf: dict

    def __repr__(self) -> str:  # never print the password
        return f"Broker({self.cell!r}, {self.conf.get('bootstrap.servers')!r})"

    def admin(self) -> AdminClient:
        return AdminClient({**self.conf, "log_level": 3})


@dataclass(frozen=True)
class CellBrokers:
    """What a mover needs to move tenants' Kafka side: each cell's Broker by
    name, and the deployment's topic names (the same prefix in every cell)."""

    brokers: Mapping[str, Broker]
    topics: Topics


def deployment_brokers(text: str) -> dict[str, Broker]:
    """CRONWHEEL_CELL_BROKERS: `NAME=USER:PASSWORD@BOOTSTRAP,...`, each cell's
    broker and a principal that may alter it (the password percent-encoded
    where it holds `:`, `@`, `,` or `%`). The security protocol, mechanism and
    CA are the router's own (CRONWHEEL_KAFKA_SECURITY_PROTOCOL, ..._SASL_MECHANISM,
    ..._CA_FILE), as every cell's brokers are configured alike. ValueError
    (no password in it) for a malformed entry."""
    from urllib.parse import unquote

    from cronwheel import config

    auth = config.load(config.KafkaAuth)
    out = {}
    for item in (i.strip() for i in text.split(",")):
        if not item:
            continue
        name, eq, rest = item.partition("=")
        who, at, bootstrap = rest.rpartition("@")
        user, colon, password = who.partition(":")
        name, user, bootstrap = name.strip() if eq else "", user.strip(), bootstrap.strip()
        if not (at and colon and name and user and bootstrap):
            raise ValueError(  # the cell's name only: the rest may hold a password
                f"NAME=USER:PASSWORD@HOST:PORT[;HOST:PORT...] per cell, comma-separated"
                f" (the entry of cell {name or '?'!r} is not)"
            )
        conf = {
            # several bootstrap servers are `;`-separated: `,` separates cells
            "bootstrap.servers": bootstrap.replace(";", ","),
            "security.protocol": auth.security_protocol or "SASL_SSL",
            "sasl.mechanism": auth.mechanism,
            "sasl.username": unquote(user),
            "sasl.password": unquote(password),
        }
        if auth.ca_file:
            conf["ssl.ca.location"] = auth.ca_file
        out[name] = Broker(name, conf)
    return out


def local_brokers() -> dict[str, Broker]:
    """The local stack's cells' brokers (cells.json), each as its admin
    principal (the password `cronwheel up` wrote in the cell's home)."""
    from cronwheel.stack import cells

    out = {}
    for cell in cells.configured():
        conf = {"bootstrap.servers": cell.kafka_bootstrap, "security.protocol": "PLAINTEXT"}
        path = Path(cell.home) / "kafka" / "principals.json"
        if path.exists():
            password = json.loads(path.read_text())["passwords"]["admin"]
            conf.update({
                "security.protocol": "SASL_PLAINTEXT",
                "sasl.mechanism": principals.MECHANISM,
                "sasl.username": principals.ADMIN,
                "sasl.password": password,
            })  # fmt: skip
        out[cell.name] = Broker(cell.name, conf)
    return out


def tenant_topics(admin: AdminClient, topics: Topics, tenant_id: str) -> dict[str, object]:
    """Every topic of the tenant on this broker (queue, run, webhook,
    managed), with its metadata."""
    names = (
        principals.tenant_topic_prefix(topics, tenant_id),
        topics.runs(tenant_id),
        topics.webhook(tenant_id),
        topics.managed(tenant_id),
    )
    listed = admin.list_topics(timeout=10).topics
    return {n: md for n, md in listed.items() if n.startswith(names[0]) or n in names[1:]}


def carry(source: Broker, target: Broker, topics: Topics, tenant_id: str, kept) -> list[str]:
    """The tenant's principal (with `kept`, its scram.Verifier, or none), ACLs
    and queue topics made on the target's broker as they are on the
    source's; returns the queue topics. Idempotent."""
    src, dst = source.admin(), target.admin()
    queues = {
        n: md for n, md in tenant_topics(src, topics, tenant_id).items()
        if n.startswith(principals.tenant_topic_prefix(topics, tenant_id))
    }  # fmt: skip
    if queues:
        have = dst.list_topics(timeout=10).topics
        wanted = [
            NewTopic(n, len(md.partitions), _replicas(md))
            for n, md in queues.items()
            if n not in have
        ]
        for name, fut in dst.create_topics(wanted, operation_timeout=10).items() if wanted else []:
            try:
                fut.result()
            except Exception as e:  # made by an earlier try of this step
                if "TOPIC_ALREADY_EXISTS" not in str(e):
                    raise
            log.info("move of %s: topic %s made in %s", tenant_id, name, target.cell)
    principals.carry_tenant(target.conf, dst, topics, tenant_id, kept)
    return sorted(queues)


def _replicas(md) -> int:
    parts = list(md.partitions.values())
    return max(1, len(parts[0].replicas)) if parts else 1


def groups_of(admin: AdminClient) -> list[str]:
    """Every consumer group the cluster has. RuntimeError when a broker did
    not answer: a partial list would make a group look absent, and a move
    then skipped the wait for it. (The client must stay referenced until the
    answer: one dropped right after the call answered "handle destroyed" as
    an error beside an empty list.)"""
    listed = admin.list_consumer_groups(request_timeout=10).result()
    if listed.errors:
        raise RuntimeError(f"consumer groups not listed: {listed.errors[0]}")
    return [g.group_id for g in listed.valid]


def await_forwarded(
    source: Broker, topics: Topics, tenant_id: str, timeout_s: float, sleep: Callable = time.sleep
) -> bool:
    """Wait until the source's dispatcher group has committed the end of the
    tenant's run topic (every record forwarded); False after `timeout_s`."""
    group = f"{topics.prefix}.dispatcher"
    admin = source.admin()
    if group not in groups_of(admin):
        return True  # no dispatcher has ever consumed there: nothing forwards
    return _await_end(source, admin, [topics.runs(tenant_id)], [group], timeout_s, sleep)


def await_applied(
    source: Broker, topics: Topics, timeout_s: float, sleep: Callable = time.sleep
) -> bool:
    """Wait until the source's workflow group has committed, on every
    partition of the platform's run-completed topic, the end as it is now:
    every completion published so far applied to its workflow runs in the
    source's database. The topic is every tenant's, so its end is read once,
    not followed. False after `timeout_s`."""
    group = f"{topics.prefix}.workflow"
    admin = source.admin()
    if group not in groups_of(admin):
        return True  # no workflow service has ever consumed there: nothing applies
    names = [topics.run_completed]
    return _await_end(source, admin, names, [group], timeout_s, sleep, follow=False)


def await_started(
    source: Broker, topics: Topics, tenant_id: str, timeout_s: float, sleep: Callable = time.sleep
) -> bool:
    """Wait until the source's webhook and executor groups have committed
    the end of the tenant's webhook and managed topics: each commits a
    record once its run is started (or found not startable), so nothing
    forwarded to them is left to start. False after `timeout_s`."""
    admin = source.admin()
    mine = {f"{topics.prefix}.webhook", f"{topics.prefix}.executor"}
    groups = [g for g in groups_of(admin) if g in mine]
    if not groups:
        return True  # neither service has ever consumed there: nothing starts
    names = [topics.webhook(tenant_id), topics.managed(tenant_id)]
    return _await_end(source, admin, names, groups, timeout_s, sleep)


def await_consumed(
    source: Broker, topics: Topics, tenant_id: str, timeout_s: float, sleep: Callable = time.sleep
) -> bool:
    """Wait until the tenant's groups have committed the end of every queue
    topic of the tenant on the source; False after `timeout_s`."""
    admin = source.admin()
    queues = [
        n for n in tenant_topics(admin, topics, tenant_id)
        if n.startswith(principals.tenant_topic_prefix(topics, tenant_id))
    ]  # fmt: skip
    prefix = principals.tenant_group_prefix(topics, tenant_id)
    groups = [g for g in groups_of(admin) if g.startswith(prefix)]
    return _await_end(source, admin, queues, groups, timeout_s, sleep)


def _await_end(
    broker: Broker,
    admin: AdminClient,
    names: list[str],
    groups: list[str],
    timeout_s: float,
    sleep: Callable,
    follow: bool = True,
) -> bool:
    """Every partition of `names` whose high watermark is past its low has an
    offset committed at the high watermark by one of `groups`: the watermark
    read again each time (`follow`), or the one read first. `admin` is the
    caller's client of `broker`."""
    deadline = time.monotonic() + timeout_s
    probe = Consumer({**broker.conf, "group.id": "cronwheel-mover", "log_level": 3})
    try:
        md = admin.list_topics(timeout=10).topics
        parts = [
            TopicPartition(n, p) for n in names if n in md for p in md[n].partitions
        ]  # fmt: skip
        ends: dict[tuple[str, int], int] | None = None
        while True:
            if ends is None or follow:
                ends = {}
                for tp in parts:
                    low, high = probe.get_watermark_offsets(tp, timeout=10, cached=False)
                    if high > low:
                        ends[(tp.topic, tp.partition)] = high
            done: dict[tuple[str, int], int] = {}
            for group in groups:
                got = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])
                for tp in got[group].result().topic_partitions:
                    key = (tp.topic, tp.partition)
                    done[key] = max(done.get(key, -1), tp.offset)
            left = {k: v for k, v in ends.items() if done.get(k, -1) < v}
            if not left:
                return True
            if time.monotonic() > deadline:
                log.info("%s: %d partitions not consumed to the end: %s",
                         broker.cell, len(left), sorted(left)[:5])  # fmt: skip
                return False
            sleep(0.2)
    finally:
        probe.close()


def remove(source: Broker, topics: Topics, tenant_id: str) -> list[str]:
    """The tenant's topics, groups, ACLs and principal, gone from the source's
    broker (after the flip). Idempotent; returns the topics it deleted."""
    admin = source.admin()
    names = sorted(tenant_topics(admin, topics, tenant_id))
    if names:
        for name, fut in admin.delete_topics(names, operation_timeout=30).items():
            try:
                fut.result()
            except Exception as e:  # deleted by an earlier try
                if "UNKNOWN_TOPIC" not in str(e):
                    raise
            log.info("move of %s: topic %s removed from %s", tenant_id, name, source.cell)
    prefix = principals.tenant_group_prefix(topics, tenant_id)
    groups = [g for g in groups_of(admin) if g.startswith(prefix)]
    if groups:
        for fut in admin.delete_consumer_groups(groups, request_timeout=10).values():
            try:
                fut.result()
            except Exception as e:  # a member still in it: the group goes empty later
                log.info("move of %s: group left in %s: %s", tenant_id, source.cell, e)
    principals.remove_tenant(admin, tenant_id)
    return names
