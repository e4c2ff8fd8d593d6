"""Standard Webhooks signatures (https://www.standardwebhooks.com).

`webhook-signature` is `v1,<base64 HMAC-SHA256(key, "<id>.<timestamp>.<body>")>`,
one per secret, space-separated: during a rotation's overlap a delivery is
signed with the new and the old secret, so a receiver holding either verifies.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
from collections.abc import Sequence

PREFIX = "whsec_"


@functools.lru_cache(maxsize=4096)
def secret_key(secret: str) -> bytes:
    """The HMAC key a `whsec_` secret stands for (base64 after the prefix); cached,
    since every delivery of an owner decodes the same secrets."""
    text = secret[len(PREFIX) :] if secret.startswith(PREFIX) else secret
    key = base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    if len(key) < 24:
        raise ValueError("a webhook secret holds at least 24 bytes")
    return key


def signature(key: bytes, msg_id: str, timestamp: int, body: bytes) -> str:
    mac = hmac.new(key, b"%s.%d.%s" % (msg_id.encode(), timestamp, body), hashlib.sha256)
    return "v1," + base64.b64encode(mac.digest()).decode()


def sign(secrets: Sequence[str], msg_id: str, timestamp: int, body: bytes) -> str:
    """The `webhook-signature` header value: one signature per secret, in order."""
    if not secrets:
        raise ValueError("no secret to sign with")
    return " ".join(signature(secret_key(s), msg_id, timestamp, body) for s in secrets)


def headers(secrets: Sequence[str], msg_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The three Standard Webhooks headers for one delivery attempt."""
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": sign(secrets, msg_id, timestamp, body),
    }
