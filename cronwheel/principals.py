"""Who may do what on the broker: the platform's principals, the tenants'
principals, and the ACLs that hold each to the least it needs.

The broker authenticates every client (SASL SCRAM-SHA-512) and authorizes
every request with Kafka's StandardAuthorizer, denying what no ACL allows
(`allow.everyone.if.no.acl.found=false`) and creating no topic by itself
(`auto.create.topics.enable=false`). This module is the one place that says
what each principal may touch; `cronwheel up` and `cronwheel kafka grant`
apply it for the platform, the gateway for each tenant it creates.

What holds, for a deployment's topic prefix P (Topics.prefix):

- A tenant reads its own queue topics (`P.q.<tenant>.`, a prefix ending in a
  dot: tenant ids cannot contain one, so no tenant's prefix covers
  another's) and commits offsets only under its group prefix. It writes
  nothing and reads no other topic: run topics, webhook and managed topics,
  `run-completed` and the dead letters are the platform's.
- Each platform service has its own principal with the topics its role
  needs (GRANTS). Only the gateway may create principals and ACLs (ALTER on
  the cluster), because it creates tenants; an operator who provisions
  tenants out of band can withhold that grant and `CRONWHEEL_KAFKA_TENANTS`
  (off) stops the gateway from trying.
- The admin principal is the broker's only super user; no service uses it.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass

from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialDeletion,
    UserScramCredentialUpsertion,
)

from cronwheel import scram
from cronwheel.kafka import Topics

ADMIN = "cronwheel-admin"
MECHANISM = "SCRAM-SHA-512"
SCRAM_ITERATIONS = 8192  # librdkafka derives the salted password client-side

# The platform's roles, each a principal `cronwheel-<role>`.
ROLES = ("relay", "dispatcher", "workflow", "webhook", "executor", "gateway", "observer")

R, W, D, C, A = (
    AclOperation.READ,
    AclOperation.WRITE,
    AclOperation.DESCRIBE,
    AclOperation.CREATE,
    AclOperation.ALTER,
)
TOPIC, GROUP, CLUSTER = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.BROKER
PREFIXED, LITERAL = ResourcePatternType.PREFIXED, ResourcePatternType.LITERAL


@dataclass(frozen=True)
class Grant:
    """Operations on one resource pattern; `name` is formatted with the prefix P."""

    resource: ResourceType
    name: str
    pattern: ResourcePatternType
    operations: tuple[AclOperation, ...]


def _topics(name: str, *ops: AclOperation, pattern=PREFIXED) -> Grant:
    return Grant(TOPIC, name, pattern, ops)


def _group(name: str) -> Grant:
    # Committing and fetching offsets under a group needs READ on it. Prefixed:
    # a second group of the same service (`P.dispatcher-replay`, a rerun from
    # offset 0) is the service's too.
    return Grant(GROUP, name, PREFIXED, (R,))


_DEAD_LETTERS = _topics("{P}.dead-letter", W, D, C, pattern=LITERAL)

# What each platform role needs, and nothing more (see each service's module
# for the why of its topics). CREATE where a service creates the topics it
# writes or reads on demand; ALTER where it grows them (CreatePartitions).
GRANTS: dict[str, tuple[Grant, ...]] = {
    # Publishes the outbox: RunReady to run topics (grown when a priority
    # class first appears) and RunCompleted to `run-completed`.
    "relay": (
        _topics("{P}.runs.", W, D, C, A),
        _topics("{P}.run-completed", W, D, C, pattern=LITERAL),
        # Wakes a tenant's run topic before its records (cronwheel.dozing).
        _topics("{P}.wake", W, D, C, pattern=LITERAL),
    ),
    # Reads run topics (creating a new tenant's before it assigns it) and
    # forwards each record to its destination topic, which it creates and grows.
    "dispatcher": (
        _topics("{P}.runs.", R, D, C),
        # Read whole, never committed; written to end a fetch (cronwheel.dozing).
        _topics("{P}.wake", R, W, D, C, pattern=LITERAL),
        _topics("{P}.q.", W, D, C, A),
        _topics("{P}.webhook.", W, D, C, A),
        _topics("{P}.managed.", W, D, C, A),
        _DEAD_LETTERS,
        _group("{P}.dispatcher"),
    ),
    "workflow": (
        _topics("{P}.run-completed", R, D, C, pattern=LITERAL),
        _DEAD_LETTERS,
        _group("{P}.workflow"),
    ),
    # Each also reads and writes a topic of its own, read whole and never
    # committed, written to end its consumer's fetch (cronwheel.fetch_nudge).
    "webhook": (
        _topics("{P}.webhook.", R, D),
        _topics("{P}.nudge.webhook", R, W, D, C, pattern=LITERAL),
        _DEAD_LETTERS,
        _group("{P}.webhook"),
    ),
    "executor": (
        _topics("{P}.managed.", R, D),
        _topics("{P}.nudge.executor", R, W, D, C, pattern=LITERAL),
        _DEAD_LETTERS,
        _group("{P}.executor"),
    ),
    # Grows a tenant's queue topics (PUT .../queues/{q}/partitions) and creates
    # tenants' principals and ACLs (ALTER and DESCRIBE on the cluster).
    # Creates a new tenant's run topic and a new job's destination before
    # answering (services/gateway/topics_ready.py): CREATE, never WRITE.
    # For the operator's GET /v1/system (services/gateway/system.py): the
    # offsets of the deployment's topics and groups (DESCRIBE: metadata and
    # offsets, never a record) for consumer lag, and the dead letters read
    # back to show the last few (READ on that one topic; its reader joins no
    # group and commits nothing).
    "gateway": (
        _topics("{P}.q.", D, C, A),
        _topics("{P}.runs.", C),
        _topics("{P}.webhook.", C),
        _topics("{P}.managed.", C),
        Grant(CLUSTER, "kafka-cluster", LITERAL, (A, D)),
        _topics("{P}.", D),
        _topics("{P}.dead-letter", R, pattern=LITERAL),
        Grant(GROUP, "{P}.", PREFIXED, (D,)),
    ),
    # Reads every topic of the deployment and writes nothing: for an
    # operator's inspection (and the test suite's), never for a service.
    "observer": (
        _topics("{P}.", R, D),
        Grant(GROUP, "cronwheel-observer.", PREFIXED, (R,)),
    ),
}


def username(role: str) -> str:
    """The principal of a platform role."""
    if role not in ROLES:
        raise ValueError(f"not a platform role: {role!r}")
    return f"cronwheel-{role}"


def tenant_username(tenant_id: str) -> str:
    return f"tenant-{tenant_id}"


def tenant_group_prefix(topics: Topics, tenant_id: str) -> str:
    """The consumer groups a tenant may use: the SDK's default group for a
    queue topic (`cronwheel-worker.<topic>`) falls under it."""
    return f"cronwheel-worker.{topics.prefix}.q.{tenant_id}."


def tenant_topic_prefix(topics: Topics, tenant_id: str) -> str:
    return f"{topics.prefix}.q.{tenant_id}."


def _bindings(principal: str, grants: tuple[Grant, ...], prefix: str) -> list[AclBinding]:
    return [
        AclBinding(
            g.resource,
            g.name.format(P=prefix),
            g.pattern,
            f"User:{principal}",
            "*",
            op,
            AclPermissionType.ALLOW,
        )
        for g in grants
        for op in g.operations
    ]


def platform_bindings(prefix: str) -> list[AclBinding]:
    return [b for role in ROLES for b in _bindings(username(role), GRANTS[role], prefix)]


def tenant_bindings(topics: Topics, tenant_id: str) -> list[AclBinding]:
    user = tenant_username(tenant_id)
    grants = (
        Grant(TOPIC, tenant_topic_prefix(topics, tenant_id), PREFIXED, (R, D)),
        Grant(GROUP, tenant_group_prefix(topics, tenant_id), PREFIXED, (R,)),
    )
    return _bindings(user, grants, topics.prefix)


def new_password() -> str:
    return secrets.token_urlsafe(24)


def upsert_users(
    admin: AdminClient,
    passwords: dict[str, str],
    timeout: float = 30,
    salts: dict[str, bytes] | None = None,
) -> None:
    """Create or replace SCRAM credentials: {principal: password}, each with
    the salt `salts` names (else one librdkafka picks)."""
    if not passwords:
        return
    salts = salts or {}
    info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, SCRAM_ITERATIONS)
    futures = admin.alter_user_scram_credentials(
        [
            UserScramCredentialUpsertion(u, info, p.encode(), salts.get(u))
            for u, p in passwords.items()
        ],
        request_timeout=timeout,
    )
    for fut in futures.values():
        fut.result(timeout)


def delete_users(admin: AdminClient, users: list[str], timeout: float = 30) -> None:
    """Remove SCRAM credentials; a user that has none is not an error."""
    if not users:
        return
    futures = admin.alter_user_scram_credentials(
        [UserScramCredentialDeletion(u, ScramMechanism.SCRAM_SHA_512) for u in users],
        request_timeout=timeout,
    )
    for fut in futures.values():
        try:
            fut.result(timeout)
        except Exception as exc:  # RESOURCE_NOT_FOUND: nothing to delete
            if "RESOURCE_NOT_FOUND" not in str(exc) and "not found" not in str(exc).lower():
                raise


def create_acls(admin: AdminClient, bindings: list[AclBinding], timeout: float = 30) -> None:
    """Create the bindings (creating one that exists is a no-op), then wait
    until the broker authorizes with them: CreateAcls answers once the
    controller committed them, a moment before the broker applies them."""
    if not bindings:
        return
    for fut in admin.create_acls(bindings, request_timeout=timeout).values():
        fut.result(timeout)
    _await_acls(admin, bindings, timeout)


def _await_acls(admin: AdminClient, bindings: list[AclBinding], timeout: float) -> None:
    """Until the broker lists every binding: one DescribeAcls per resource,
    which answers with that resource's bindings only. (By principal, each
    answer held every binding of the principal: a platform role's grows with
    every topic prefix granted, and a test session's grants slowed from 90 to
    350 ms each.)"""

    def key(b: AclBinding) -> tuple:
        return (b.restype, b.name, b.resource_pattern_type, b.principal, b.operation)

    want: dict[tuple, set[tuple]] = {}
    for b in bindings:
        want.setdefault((b.restype, b.name, b.resource_pattern_type), set()).add(key(b))
    deadline = time.monotonic() + timeout
    while want:
        for resource in list(want):
            restype, name, pattern = resource
            f = AclBindingFilter(
                restype, name, pattern, None, None, AclOperation.ANY, AclPermissionType.ANY
            )
            have = admin.describe_acls(f, request_timeout=timeout).result(timeout)
            if want[resource] <= {key(b) for b in have}:
                del want[resource]
        if want and time.monotonic() > deadline:
            raise TimeoutError(
                f"ACLs on {sorted(str(r) for r in want)} not in force after {timeout}s"
            )
        if want:
            time.sleep(0.02)


def delete_acls_of(admin: AdminClient, principals: list[str], timeout: float = 30) -> None:
    """Remove every ACL naming one of these principals."""
    filters = [
        AclBindingFilter(
            ResourceType.ANY,
            None,
            ResourcePatternType.ANY,
            f"User:{p}",
            None,
            AclOperation.ANY,
            AclPermissionType.ANY,
        )  # fmt: skip
        for p in principals
    ]
    if filters:
        for fut in admin.delete_acls(filters, request_timeout=timeout).values():
            fut.result(timeout)


def delete_acls_on_prefixes(admin: AdminClient, prefixes: list[str], timeout: float = 30) -> None:
    """Remove the platform's ACLs for topic prefixes `prefixes` (tests', when
    they end), in one request per 500 filters: one request per prefix took
    70 ms each, 14 s for 200 prefixes, at the end of every test worker."""
    filters = list(
        {
            AclBindingFilter(
                b.restype,
                b.name,
                b.resource_pattern_type,
                None,
                None,
                AclOperation.ANY,
                AclPermissionType.ANY,
            )  # fmt: skip
            for prefix in prefixes
            # Only the bindings on this prefix's resources: the observer's group
            # prefix and the gateway's cluster grant are shared by every prefix.
            for b in platform_bindings(prefix)
            if b.name.startswith(f"{prefix}.")
        }
    )
    for i in range(0, len(filters), 500):
        for fut in admin.delete_acls(filters[i : i + 500], request_timeout=timeout).values():
            fut.result(timeout)


def grant_platform(admin: AdminClient, prefix: str, passwords: dict[str, str] | None = None):
    """The platform's principals (when `passwords` names them: {role: password})
    and their ACLs for topic prefix `prefix`. Idempotent."""
    if passwords:
        upsert_users(admin, {username(r): p for r, p in passwords.items()})
    create_acls(admin, platform_bindings(prefix))


def provision_tenant(admin: AdminClient, topics: Topics, tenant_id: str) -> str:
    """A tenant's principal with a new password (returned, shown once) and its ACLs."""
    return provision_tenant_kept(admin, topics, tenant_id)[0]


def provision_tenant_kept(
    admin: AdminClient, topics: Topics, tenant_id: str
) -> tuple[str, scram.Verifier]:
    """provision_tenant, and the credential as the broker keeps it (never the
    password): what a move gives the next cell's broker (cronwheel.scram)."""
    password = new_password()
    kept = scram.verifier(password, MECHANISM, SCRAM_ITERATIONS)
    user = tenant_username(tenant_id)
    upsert_users(admin, {user: password}, salts={user: kept.salt})
    create_acls(admin, tenant_bindings(topics, tenant_id))
    return password, kept


def carry_tenant(conf: dict, admin: AdminClient, topics: Topics, tenant_id: str, kept) -> None:
    """The tenant's principal, with the credential it has in its old cell
    (`kept`, a scram.Verifier; None: a tenant made before credentials were
    kept gets none, and its next rotation makes one), and its ACLs, on the
    broker of `conf` / `admin` (a move's target). Idempotent."""
    if kept is not None:
        scram.upsert(conf, tenant_username(tenant_id), kept)
    create_acls(admin, tenant_bindings(topics, tenant_id))


def rotate_tenant(admin: AdminClient, tenant_id: str) -> str:
    """A new password for the tenant's principal (the old one stops working)."""
    password = new_password()
    upsert_users(admin, {tenant_username(tenant_id): password})
    return password


def remove_tenant(admin: AdminClient, tenant_id: str) -> None:
    user = tenant_username(tenant_id)
    delete_acls_of(admin, [user])
    delete_users(admin, [user])
