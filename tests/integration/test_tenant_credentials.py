"""A tenant's kept Kafka credential is sealed at rest (migration 0027): the
row never holds SaltedPassword in the clear, a sealed one copied to another
tenant's row does not open, and rows written before 0027 are read as they are
until `reseal` seals them (cronwheel/store/tenant_credentials.py)."""

from __future__ import annotations

import base64
import uuid

import psycopg
import pytest

from cronwheel import scram
from cronwheel.core.sealing import Keyring, SealingError, new_key, parse_keys
from cronwheel.store import sealed, tenant_credentials
from cronwheel.store.jobs import create_tenant

pytestmark = pytest.mark.integration


@pytest.fixture
def conn(database_url):
    with psycopg.connect(database_url, autocommit=True) as c:
        yield c


def stored(conn, tenant_id: str) -> tuple[bytes | None, str | None]:
    return conn.execute(
        "SELECT kafka_scram_salted_password, kafka_scram_key_id FROM tenants WHERE tenant_id = %s",
        [tenant_id],
    ).fetchone()


def a_tenant(conn) -> str:
    return create_tenant(conn, f"creds-{uuid.uuid4().hex[:8]}")["tenant_id"]


def test_kept_credential__sealed_in_the_row__opens_as_written(conn, keyring):
    tenant = a_tenant(conn)
    kept = scram.verifier(uuid.uuid4().hex, "SCRAM-SHA-512", 8192)
    tenant_credentials.keep(conn, tenant, kept)

    raw, key_id = stored(conn, tenant)
    assert key_id == keyring.current_id
    assert kept.salted_password not in bytes(raw)
    assert base64.b64encode(kept.salted_password) not in bytes(raw)
    assert tenant_credentials.kept(conn, tenant) == kept

    # The sealed value copied into another tenant's row does not open there.
    other = a_tenant(conn)
    tenant_credentials.keep(conn, other, scram.verifier("x", "SCRAM-SHA-512", 8192))
    conn.execute(
        "UPDATE tenants SET kafka_scram_salted_password = %s WHERE tenant_id = %s", [raw, other]
    )
    with pytest.raises(SealingError):
        tenant_credentials.kept(conn, other)


def test_credential_in_the_clear_from_before_0027__read__then_resealed(conn, keyring):
    tenant = a_tenant(conn)
    kept = scram.verifier(uuid.uuid4().hex, "SCRAM-SHA-512", 8192)
    conn.execute(  # as 0023's code wrote it
        "UPDATE tenants SET kafka_scram_mechanism = %s, kafka_scram_iterations = %s,"
        " kafka_scram_salt = %s, kafka_scram_salted_password = %s WHERE tenant_id = %s",
        [kept.mechanism, kept.iterations, kept.salt, kept.salted_password, tenant],
    )
    assert tenant_credentials.kept(conn, tenant) == kept

    assert tenant_credentials.reseal(conn, batch=1) >= 1
    raw, key_id = stored(conn, tenant)
    assert key_id == keyring.current_id and kept.salted_password not in bytes(raw)
    assert tenant_credentials.kept(conn, tenant) == kept

    # A new first key: reseal moves the row to it; the old key may then go.
    newer = Keyring((*parse_keys(f"test-b:{new_key()}"), *keyring.keys))
    sealed.use_keyring(newer)
    tenant_credentials.reseal(conn)
    assert stored(conn, tenant)[1] == "test-b"
    sealed.use_keyring(Keyring(newer.keys[:1]))
    assert tenant_credentials.kept(conn, tenant) == kept
    assert tenant_credentials.reseal(conn) == 0
