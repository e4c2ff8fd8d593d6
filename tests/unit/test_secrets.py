"""Issue 23, "Secrets", without servers: sealing, the keyring's variable, what
the idempotency store keeps of an answer, the operator key check, and the
status line's database URL."""

from __future__ import annotations

import json
import secrets

import pytest

from cronwheel import config
from cronwheel.cli import masked_url
from cronwheel.core.sealing import Key, Keyring, SealingError, new_key, parse_keys
from services.gateway import idempotency
from services.gateway.main import operator_key_weakness


def ring(*ids: str) -> Keyring:
    return Keyring(parse_keys(",".join(f"{i}:{new_key()}" for i in ids)))


def test_seal__opens_with_any_key_of_the_ring__first_seals():
    old = ring("k1")
    sealed, key_id = old.seal("whsec_abc", "ctx")
    assert key_id == "k1" and b"whsec_abc" not in sealed
    both = Keyring((*ring("k2").keys, *old.keys))
    assert both.open(sealed, "k1", "ctx") == "whsec_abc"
    assert both.seal("x", "ctx")[1] == "k2"
    assert old.seal("whsec_abc", "ctx")[0] != sealed  # fresh data key and nonces


@pytest.mark.parametrize(
    "change",
    ["context", "key_id", "unknown_key", "flipped_bit", "truncated"],
)
def test_open__anything_changed__refused(change):
    keys = ring("k1", "k2")
    sealed, key_id = keys.seal("whsec_abc", "webhook_secrets|job_a|whs_1")
    context = "webhook_secrets|job_a|whs_1"
    match change:
        case "context":
            context = "webhook_secrets|job_b|whs_1"
        case "key_id":
            key_id = "k2"
        case "unknown_key":
            key_id = "k9"
        case "flipped_bit":
            sealed = sealed[:-1] + bytes([sealed[-1] ^ 1])
        case "truncated":
            sealed = sealed[:20]
    with pytest.raises(SealingError):
        keys.open(sealed, key_id, context)


@pytest.mark.parametrize(
    "text",
    ["", "nokey", "k1:short", "bad id:" + new_key(), "k1:" + new_key() + ",k1:" + new_key()],
    # Named, not by value: random keys would differ between xdist workers.
    ids=["empty", "no-key", "short-key", "bad-id", "same-id-twice"],
)
def test_parse_keys__bad__value_error_naming_no_key_material(text):
    with pytest.raises(ValueError) as e:
        parse_keys(text)
    for part in text.replace(",", ":").split(":"):
        if len(part) > 20:
            assert part not in str(e.value)


def test_keys_variable__bad_value__one_line_without_the_value(monkeypatch):
    material = new_key()
    with pytest.raises(config.SettingsError) as e:
        config.load(config.Secrets, {"CRONWHEEL_SECRET_KEYS": f"k1:{material[:-4]}"})
    assert str(e.value).startswith("CRONWHEEL_SECRET_KEYS='(not shown)': expected ")
    assert material[:-4] not in str(e.value) and "\n" not in str(e.value)


def test_local_keyring__generated_once_in_the_home__mode_0600(monkeypatch, tmp_path):
    monkeypatch.setenv("CRONWHEEL_HOME", str(tmp_path))
    monkeypatch.delenv("CRONWHEEL_SECRET_KEYS", raising=False)
    monkeypatch.setattr(config, "_keyring", None)
    first = config.secret_keyring()
    monkeypatch.setattr(config, "_keyring", None)
    assert config.secret_keyring().keys == first.keys
    assert first.current_id.startswith("local-")
    assert (tmp_path / "secret-keys").stat().st_mode & 0o777 == 0o600
    assert "Key(" in repr(first.keys[0]) and first.keys[0].secret.hex() not in repr(first)


def test_redact__secrets_shown_once__null_and_named():
    body = json.dumps(
        {
            "tenant_id": "t1",
            "api_key": "cw_secret",
            "kafka": {"username": "u", "password": "pw"},
            "payload": {"api_key": "a tenant's own data stays"},
        }
    )
    doc = json.loads(idempotency.redact(body))
    assert doc["api_key"] is None and doc["kafka"] == {"username": "u", "password": None}
    assert doc["payload"] == {"api_key": "a tenant's own data stays"}
    assert doc["not_shown_again"] == ["api_key", "kafka.password"]
    assert idempotency.not_shown(json.dumps(doc)) == "api_key, kafka.password"


def test_redact__batch_results_and_plain_answers():
    job = {"job_id": "j", "signing_secret": {"secret_id": "s", "secret": "whsec_x"}}
    body = json.dumps({"results": [{"status": 422, "problem": {}}, {"status": 201, "job": job}]})
    doc = json.loads(idempotency.redact(body))
    assert doc["results"][1]["job"]["signing_secret"] == {"secret_id": "s", "secret": None}
    assert doc["not_shown_again"] == ["results.1.job.signing_secret.secret"]
    plain = '{"job_id":"j","payload":{"n":1}}'
    assert idempotency.redact(plain) is plain and idempotency.not_shown(plain) is None
    assert idempotency.redact(None) is None


@pytest.mark.parametrize(
    ("key", "weak"),
    [
        ("CHANGE-ME", True),
        ("x" * 64, True),
        ("changemechangemechangemechangeme", True),
        ("password1234567890" * 2, True),
        ("cwop_" + secrets.token_urlsafe(32), False),
        (secrets.token_hex(32), False),
        (secrets.token_hex(16), False),
    ],
    ids=["change-me", "one-char", "changeme-x4", "password-x2", "cwop-token", "hex-64", "hex-32"],
)
def test_operator_key__weak_ones_refused(key, weak):
    assert (operator_key_weakness(key) is not None) == weak


def test_operator_key__the_local_stacks_generated_key_passes(monkeypatch, tmp_path):
    from cronwheel.demo import operator_key

    monkeypatch.setenv("CRONWHEEL_HOME", str(tmp_path))
    monkeypatch.delenv("CRONWHEEL_OPERATOR_KEY", raising=False)
    assert operator_key_weakness(operator_key()) is None


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://cw:s3cret@h:5432/db", "postgresql://cw:***@h:5432/db"),
        ("postgresql://cw@h/db?password=s3cret&x=1", "postgresql://cw@h/db?password=***&x=1"),
        ("postgresql://h/db", "postgresql://h/db"),
    ],
)
def test_status__database_url_shown_without_its_password(url, shown):
    assert masked_url(url) == shown


def test_key_repr__no_material():
    k = Key("k1", b"\x01" * 32)
    assert repr(k) == "Key('k1')"


def test_repr__of_a_caller_and_a_delivery_target__shows_no_key_header_or_secret():
    from cronwheel.store.webhooks import DeliveryTarget
    from services.gateway.auth import Caller

    caller = Caller("cw_live_key_value", False, object(), "idem-1", "acme")
    target = DeliveryTarget(
        "r-1", "acme", "RUNNING", 1,
        {"type": "webhook", "url": "https://x.example/h", "headers": {"Authorization": "Bearer tok_v"}},
        "null", 30_000, None, "j-1", "j-1", 0, ("whsec_value",),
    )  # fmt: skip
    shown = repr(caller) + repr(target)
    assert "acme" in shown and "r-1" in shown  # what a log line may say
    for secret in ("cw_live_key_value", "tok_v", "whsec_value"):
        assert secret not in shown
