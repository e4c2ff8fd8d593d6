-- Webhook signing secrets sealed at rest (expand step; docs/webhooks.md,
-- "Signing secrets at rest"). New secrets are written to `sealed` (AES-256-GCM
-- envelope, cronwheel/core/sealing.py) with the id of the key that sealed them,
-- and `secret` stays NULL. Rows written before keep their plaintext `secret`
-- and are still read until `webhooks.reseal` (`cronwheel secrets reseal`)
-- seals them in batches while the system runs. A later release (contract)
-- drops `secret` once no row holds one.

ALTER TABLE webhook_secrets
    ADD COLUMN sealed bytea,
    -- Which key of CRONWHEEL_SECRET_KEYS sealed it (a rotation re-seals the
    -- rows whose key is not the first).
    ADD COLUMN key_id text,
    ALTER COLUMN secret DROP NOT NULL;

-- Every row holds its secret in one form or the other.
ALTER TABLE webhook_secrets ADD CONSTRAINT webhook_secrets_held
    CHECK (secret IS NOT NULL OR (sealed IS NOT NULL AND key_id IS NOT NULL)) NOT VALID;
ALTER TABLE webhook_secrets VALIDATE CONSTRAINT webhook_secrets_held;
