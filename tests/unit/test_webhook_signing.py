"""Standard Webhooks signatures: the spec's test vector, verification by the
`standardwebhooks` package, and both signatures during a rotation."""

from __future__ import annotations

import time

import pytest
from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError

from cronwheel.store.webhooks import new_secret
from services.webhook import signing


def test_signature__standard_webhooks_test_vector():
    key = signing.secret_key("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
    got = signing.signature(
        key, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, b'{"test": 2432232314}'
    )
    assert got == "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="


def test_headers__verify_with_the_standardwebhooks_package():
    secret = new_secret()
    body = '{"hello":"wörld"}'.encode()
    headers = signing.headers([secret], "0123abc", int(time.time()), body)
    assert Webhook(secret).verify(body, headers) == {"hello": "wörld"}
    with pytest.raises(WebhookVerificationError):
        Webhook(secret).verify(body + b" ", headers)
    with pytest.raises(WebhookVerificationError):
        Webhook(new_secret()).verify(body, headers)


def test_sign__two_secrets__either_one_verifies():
    new, old = new_secret(), new_secret()
    body = b"null"
    headers = signing.headers([new, old], "run-1", int(time.time()), body)
    assert len(headers["webhook-signature"].split(" ")) == 2
    for secret in (new, old):
        Webhook(secret).verify(body, headers, json_parse=False)


def test_new_secret__whsec_with_32_random_bytes():
    a, b = new_secret(), new_secret()
    assert a != b
    assert a.startswith("whsec_") and len(signing.secret_key(a)) == 32


@pytest.mark.parametrize("bad", ["whsec_", "whsec_c2hvcnQ=", "whsec_not base64!"])
def test_secret_key__short_or_malformed__refused(bad):
    with pytest.raises(ValueError):
        signing.secret_key(bad)


def test_sign__no_secret__refused():
    with pytest.raises(ValueError):
        signing.sign([], "run-1", 1, b"")
