"""What the service sends: the job's headers never replace the signature or the
fencing headers; settings from the environment."""

from __future__ import annotations

import dataclasses
import time

from standardwebhooks import Webhook

from cronwheel import config
from cronwheel.kafka import Topics
from cronwheel.store.webhooks import DeliveryTarget, new_secret
from services.webhook.main import TuningSettings
from services.webhook.service import Settings, WebhookService


def target(secret: str, headers: dict) -> DeliveryTarget:
    return DeliveryTarget(
        run_id="0a1" + "0" * 29,
        tenant_id="ten_1",
        state="PENDING",
        attempt=2,
        target={"type": "webhook", "url": "https://x.example/h", "headers": headers},
        payload='{"a":1}',
        lease_ms=30_000,
        timeout_ms=None,
        owner_id="job_1",
        job_id="job_1",
        scheduled_ms=1_800_000_000_000,
        secrets=(secret,),
    )


def test_headers__job_headers_kept__reserved_and_framing_ones_dropped():
    secret = new_secret()
    service = WebhookService(
        "postgresql://unused", "unused:9092", Topics("t"), instance="i", allow=[]
    )
    t = target(
        secret,
        {
            "Authorization": "Bearer abc",
            "Content-Type": "application/cloudevents+json",
            "Webhook-Signature": "v1,forged",
            "cronwheel-fencing-token": "forged",
            "Host": "evil.example",
            "Content-Length": "1",
        },
    )
    body = t.payload.encode()
    got = service._headers(t, {"attempt": 2, "start_token": "tok"}, body)
    assert got["authorization"] == "Bearer abc"
    assert got["content-type"] == "application/cloudevents+json"
    assert got["cronwheel-fencing-token"] == "tok"
    assert got["cronwheel-attempt"] == "2"
    assert got["webhook-id"] == t.run_id == got["cronwheel-run-id"]
    assert got["cronwheel-scheduled-at"] == "2027-01-15T08:00:00.000Z"
    # The run's trace, the attempt its parent span (docs/events.md).
    assert got["traceparent"] == f"00-{t.run_id}-{2:016x}-00"
    assert "host" not in got and "content-length" not in got
    assert abs(int(got["webhook-timestamp"]) - time.time()) < 5
    Webhook(secret).verify(body, got)


def test_settings__read_from_the_environment_by_the_services_settings():
    tuning = config.load(
        TuningSettings,
        {"CRONWHEEL_WEBHOOK_PER_ENDPOINT": "4", "CRONWHEEL_WEBHOOK_BREAKER_COOLDOWN_MS": "500"},
    )
    got = Settings(**dataclasses.asdict(tuning))
    assert (got.per_endpoint, got.breaker_cooldown_ms, got.max_in_flight) == (4, 500, 512)


def test_worker_id__names_the_instance():
    service = WebhookService(
        "postgresql://unused", "unused:9092", Topics("t"), instance="b7", allow=[]
    )
    assert service.worker_id == "webhook:b7"
