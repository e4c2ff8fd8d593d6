-- Webhook targets: the signing secrets of jobs (and workflows) whose runs the
-- webhook service delivers. Standard Webhooks scheme: `whsec_` + base64 of 32
-- random bytes, HMAC-SHA256 over "<webhook-id>.<timestamp>.<body>".
--
-- The secret is stored as issued (the service needs it to sign); the API shows
-- it once, at creation and on rotation, and otherwise only its secret_id.
-- Rotation keeps the old secret until `expires_at` (the overlap window): until
-- then every delivery carries both signatures, so a receiver can switch keys
-- without dropping a delivery.

CREATE TABLE webhook_secrets (
    -- partition_of(owner_id): the owner's partition, which is also the partition
    -- of its runs, so a run and the secrets that sign it are read together.
    partition_id smallint NOT NULL CHECK (partition_id BETWEEN 0 AND 1023),
    -- The job (or the workflow, for webhook nodes) whose runs are signed with it.
    owner_id     text NOT NULL,
    secret_id    text NOT NULL,
    tenant_id    text NOT NULL REFERENCES tenants (tenant_id),
    -- whsec_ + base64 of at least 24 random bytes (32 are issued).
    secret       text NOT NULL CHECK (secret LIKE 'whsec\_%' AND length(secret) >= 38),
    created_at   timestamptz NOT NULL DEFAULT now(),
    -- NULL while the secret is the current one; set by a rotation to the end of
    -- the overlap window, after which it no longer signs.
    expires_at   timestamptz,
    PRIMARY KEY (partition_id, owner_id, secret_id)
);
CREATE UNIQUE INDEX webhook_secrets_id ON webhook_secrets (secret_id);
-- One current secret per owner: two concurrent rotations cannot both win.
CREATE UNIQUE INDEX webhook_secrets_current ON webhook_secrets (partition_id, owner_id)
    WHERE expires_at IS NULL;

-- Row-level security as 0002 set it up: a gateway transaction scoped to a
-- tenant sees (and inserts) only its own secrets; services see every row.
ALTER TABLE webhook_secrets ENABLE ROW LEVEL SECURITY;
ALTER TABLE webhook_secrets FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_scope ON webhook_secrets
    USING (cronwheel_tenant_scope() IS NULL OR tenant_id = cronwheel_tenant_scope());
