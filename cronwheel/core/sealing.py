"""Secrets at rest: envelope encryption with AES-256-GCM (docs/webhooks.md,
"Signing secrets at rest").

Each value is sealed with a fresh 256-bit data key; the data key is wrapped
with a key-encryption key (KEK) from the operator's keyring. A sealed value is
one byte string:

    0x01 | wrap nonce (12) | wrapped data key (32 + 16 tag) | nonce (12) | ciphertext + tag

and is stored beside the id of the KEK that wrapped it. Both layers
authenticate their context (associated data): the data key its KEK's id, the
value the place it belongs to (e.g. the table, owner and secret id), so a
sealed value copied to another row, or a key id changed, fails to open instead
of opening as someone else's secret.

The keyring holds several KEKs: the first seals, every one opens, so keys
rotate without downtime: put the new key first, keep the old ones, re-seal
(`cronwheel secrets reseal`), then drop the old ones. Pure functions; where the
keys come from is cronwheel/config.py (`secret_keyring`).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import re
from dataclasses import dataclass

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

VERSION = b"\x01"
KEY_BYTES = 32
NONCE_BYTES = 12
TAG_BYTES = 16
_WRAPPED = KEY_BYTES + TAG_BYTES
_HEADER = 1 + NONCE_BYTES + _WRAPPED + NONCE_BYTES
KEY_ID = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


class SealingError(ValueError):
    """A sealed value that does not open: an unknown key id, or data that fails
    authentication (tampered, moved to another row, or a wrong key)."""


@dataclass(frozen=True)
class Key:
    key_id: str
    secret: bytes  # 32 bytes

    def __repr__(self) -> str:  # never print the key itself
        return f"Key({self.key_id!r})"


def new_key() -> str:
    """A fresh key as the keyring's text holds it: urlsafe base64 of 32 bytes."""
    return base64.urlsafe_b64encode(os.urandom(KEY_BYTES)).decode()


def derived_id(secret: bytes, prefix: str = "local") -> str:
    """An id that tells keys apart without revealing them (for generated keys)."""
    return f"{prefix}-{hashlib.sha256(b'cronwheel-key-id|' + secret).hexdigest()[:12]}"


def parse_keys(text: str) -> tuple[Key, ...]:
    """`id1:key1,id2:key2`; ValueError (naming no key material) when it is not."""
    keys: list[Key] = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        key_id, sep, material = item.partition(":")
        key_id = key_id.strip()
        if not sep or not KEY_ID.match(key_id):
            raise ValueError("a key id of 1-64 letters, digits, '_', '.' or '-' before ':'")
        raw = _b64(material.strip())
        if raw is None or len(raw) != KEY_BYTES:
            raise ValueError(f"key {key_id!r}: not base64 of {KEY_BYTES} bytes")
        if any(k.key_id == key_id for k in keys):
            raise ValueError(f"key {key_id!r} is listed twice")
        keys.append(Key(key_id, raw))
    if not keys:
        raise ValueError("no key")
    return tuple(keys)


def format_keys(keys: tuple[Key, ...]) -> str:
    return ",".join(f"{k.key_id}:{base64.urlsafe_b64encode(k.secret).decode()}" for k in keys)


def _b64(text: str) -> bytes | None:
    padded = text + "=" * (-len(text) % 4)
    for decode in (base64.urlsafe_b64decode, base64.b64decode):
        try:
            return decode(padded.encode())
        except (binascii.Error, ValueError):
            continue
    return None


class Keyring:
    """The operator's KEKs: `current` (the first) seals, all of them open."""

    def __init__(self, keys: tuple[Key, ...]):
        if not keys:
            raise ValueError("a keyring needs at least one key")
        self.keys = tuple(keys)
        self._by_id = {k.key_id: AESGCM(k.secret) for k in keys}

    @property
    def current_id(self) -> str:
        return self.keys[0].key_id

    def __repr__(self) -> str:
        return f"Keyring({[k.key_id for k in self.keys]!r})"

    def seal(self, plaintext: str, context: str) -> tuple[bytes, str]:
        """(sealed, key_id) of `plaintext`, bound to `context`."""
        key_id = self.current_id
        data_key = AESGCM.generate_key(bit_length=256)
        wrap_nonce, nonce = os.urandom(NONCE_BYTES), os.urandom(NONCE_BYTES)
        wrapped = self._by_id[key_id].encrypt(wrap_nonce, data_key, _wrap_aad(key_id))
        body = AESGCM(data_key).encrypt(nonce, plaintext.encode(), _aad(key_id, context))
        return VERSION + wrap_nonce + wrapped + nonce + body, key_id

    def open(self, sealed: bytes, key_id: str, context: str) -> str:
        """The plaintext, or SealingError."""
        kek = self._by_id.get(key_id)
        if kek is None:
            raise SealingError(f"sealed with key {key_id!r}, which the keyring does not hold")
        sealed = bytes(sealed)
        if len(sealed) < _HEADER + TAG_BYTES or sealed[:1] != VERSION:
            raise SealingError("not a sealed value this version reads")
        wrap_nonce = sealed[1 : 1 + NONCE_BYTES]
        wrapped = sealed[1 + NONCE_BYTES : 1 + NONCE_BYTES + _WRAPPED]
        nonce = sealed[1 + NONCE_BYTES + _WRAPPED : _HEADER]
        try:
            data_key = kek.decrypt(wrap_nonce, wrapped, _wrap_aad(key_id))
            return AESGCM(data_key).decrypt(nonce, sealed[_HEADER:], _aad(key_id, context)).decode()
        except InvalidTag:
            raise SealingError("the sealed value does not authenticate") from None


def _wrap_aad(key_id: str) -> bytes:
    return b"cronwheel-data-key|" + key_id.encode()


def _aad(key_id: str, context: str) -> bytes:
    return b"cronwheel-sealed|" + key_id.encode() + b"|" + context.encode()
