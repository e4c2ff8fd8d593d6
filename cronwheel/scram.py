"""A tenant's SCRAM credential as the broker holds it, so that a move can give
the same credential to another cell's broker (docs/cells.md, "Workers
follow"), without the platform ever holding the password.

SCRAM-SHA-512 (RFC 5802): the broker keeps, per user, a salt, an iteration
count and keys derived from SaltedPassword = PBKDF2-HMAC-SHA512(password,
salt, iterations). Kafka's AlterUserScramCredentials takes exactly (salt,
iterations, SaltedPassword), so whoever holds those three can make the same
credential on any broker: the tenant's client logs in there with the
password it has always had. The broker never gives them back (its Describe
names the mechanism and iterations only), so the platform keeps them from
the moment it makes the credential: it picks the salt itself, has the broker
derive the credential from (password, salt) and derives SaltedPassword the
same way to keep it (tenants.kafka_scram_*, migration 0023).

What SaltedPassword is worth to a thief: not the password, but enough to
log in with SCRAM as that tenant (ClientKey is derived from it). Anyone who
reads it could already read the tenant's runs and payloads in the same
database; what it adds is reading the tenant's queue topics and committing
its groups' offsets.

confluent-kafka (librdkafka) derives SaltedPassword itself from a password,
so the upsert of a kept credential is sent with aiokafka's protocol layer
(already a dependency of the platform, not of the SDK): one
AlterUserScramCredentials v0 request.
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
from dataclasses import dataclass

from aiokafka.client import AIOKafkaClient
from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.types import (
    CompactArray,
    CompactBytes,
    CompactString,
    Int8,
    Int16,
    Int32,
    Schema,
    TaggedFields,
)

MECHANISM_IDS = {"SCRAM-SHA-256": 1, "SCRAM-SHA-512": 2}
_HASH = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}


@dataclass(frozen=True)
class Verifier:
    """What a broker needs to make the credential: never the password."""

    mechanism: str
    iterations: int
    salt: bytes
    salted_password: bytes


def verifier(password: str, mechanism: str, iterations: int, salt: bytes | None = None) -> Verifier:
    """The credential of `password` with `salt` (a new random one by default),
    as the broker derives it (Kafka's ScramFormatter.hi)."""
    salt = salt if salt is not None else secrets.token_bytes(32)
    salted = hashlib.pbkdf2_hmac(_HASH[mechanism], password.encode(), salt, iterations)
    return Verifier(mechanism, iterations, salt, salted)


class _AlterResponse(Response):
    API_KEY = 51
    API_VERSION = 0
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        (
            "results",
            CompactArray(
                ("user", CompactString("utf-8")),
                ("error_code", Int16),
                ("error_message", CompactString("utf-8")),
                ("tags", TaggedFields),
            ),
        ),
        ("tags", TaggedFields),
    )


class _AlterStruct(RequestStruct):
    FLEXIBLE_VERSION = True
    API_KEY = 51
    API_VERSION = 0
    RESPONSE_TYPE = _AlterResponse
    SCHEMA = Schema(
        (
            "deletions",
            CompactArray(
                ("name", CompactString("utf-8")),
                ("mechanism", Int8),
                ("tags", TaggedFields),
            ),
        ),
        (
            "upsertions",
            CompactArray(
                ("name", CompactString("utf-8")),
                ("mechanism", Int8),
                ("iterations", Int32),
                ("salt", CompactBytes),
                ("salted_password", CompactBytes),
                ("tags", TaggedFields),
            ),
        ),
        ("tags", TaggedFields),
    )


class _Alter(Request[_AlterStruct]):
    """AlterUserScramCredentials, upsertions only (v0: the one version so far)."""

    API_KEY = 51

    def __init__(self, upsertions: list[tuple]):
        self.upsertions = upsertions

    def build(self, request_struct_class: type[_AlterStruct]) -> _AlterStruct:
        return request_struct_class(deletions=[], upsertions=self.upsertions, tags={})


def upsert(conf: dict, user: str, v: Verifier, timeout: float = 30) -> None:
    """Make (or replace) `user`'s credential on the broker of `conf` (librdkafka
    settings of a principal allowed to ALTER the cluster) from a kept
    Verifier. Raises RuntimeError with the broker's error."""
    asyncio.run(asyncio.wait_for(_upsert(conf, user, v), timeout))


async def _upsert(conf: dict, user: str, v: Verifier) -> None:
    sasl = {}
    if "sasl.username" in conf:
        sasl = {
            "sasl_mechanism": conf["sasl.mechanism"],
            "sasl_plain_username": conf["sasl.username"],
            "sasl_plain_password": conf["sasl.password"],
        }
    client = AIOKafkaClient(
        bootstrap_servers=conf["bootstrap.servers"],
        security_protocol=conf.get("security.protocol", "PLAINTEXT"),
        client_id="cronwheel-mover",
        **sasl,
    )
    await client.bootstrap()
    try:
        request = _Alter(
            [(user, MECHANISM_IDS[v.mechanism], v.iterations, v.salt, v.salted_password, {})]
        )
        answer = await client.send(client.get_random_node(), request)
    finally:
        await client.close()
    for name, code, message, _tags in answer.results:
        if code:
            raise RuntimeError(f"AlterUserScramCredentials for {name}: error {code}: {message}")
