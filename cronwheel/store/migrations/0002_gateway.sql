-- The gateway: labelled API keys, Idempotency-Key responses, and the database's
-- second line of tenant isolation (row-level security). See docs/tenancy.md.

-- A name per key, so a tenant rotating keys can tell them apart.
ALTER TABLE api_keys ADD COLUMN label text;
CREATE INDEX api_keys_tenant ON api_keys (tenant_id, created_at, key_id);

-- The first response to a POST that carried an Idempotency-Key, per tenant (or
-- the operator) and key. The row is inserted in the same transaction as the
-- request's effect, so a concurrent duplicate waits on it and then replays.
CREATE TABLE idempotency_keys (
    scope       text NOT NULL,          -- the tenant_id, or 'operator'
    key         text NOT NULL,
    fingerprint bytea NOT NULL,         -- SHA-256 of method, path and canonical body
    status      smallint,               -- NULL only inside the first request's transaction
    body        text,                   -- the response's JSON text, replayed byte for byte
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (scope, key)
);
CREATE INDEX idempotency_keys_created ON idempotency_keys (created_at);

-- Row-level security keyed on a per-transaction setting. The gateway runs each
-- tenant request with `set_config('cronwheel.tenant_id', <tenant>, true)`; its
-- pooled sessions default to a value that matches no tenant, so a gateway
-- query outside a declared scope sees nothing. Sessions that never set it (the
-- timer, relay, dispatcher and other services, migrations, psql) see every
-- row, as before. The services connect as the tables' owner, hence FORCE.
CREATE FUNCTION cronwheel_tenant_scope() RETURNS text
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$ SELECT NULLIF(current_setting('cronwheel.tenant_id', true), '') $$;

ALTER TABLE tenants ENABLE ROW LEVEL SECURITY;
ALTER TABLE tenants FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_scope ON tenants
    USING (cronwheel_tenant_scope() IS NULL OR tenant_id = cronwheel_tenant_scope());

ALTER TABLE api_keys ENABLE ROW LEVEL SECURITY;
ALTER TABLE api_keys FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_scope ON api_keys
    USING (cronwheel_tenant_scope() IS NULL OR tenant_id = cronwheel_tenant_scope());

ALTER TABLE jobs ENABLE ROW LEVEL SECURITY;
ALTER TABLE jobs FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_scope ON jobs
    USING (cronwheel_tenant_scope() IS NULL OR tenant_id = cronwheel_tenant_scope());

ALTER TABLE runs ENABLE ROW LEVEL SECURITY;
ALTER TABLE runs FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_scope ON runs
    USING (cronwheel_tenant_scope() IS NULL OR tenant_id = cronwheel_tenant_scope());

-- Tables without a tenant column follow their owner row.
ALTER TABLE run_attempts ENABLE ROW LEVEL SECURITY;
ALTER TABLE run_attempts FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_scope ON run_attempts
    USING (cronwheel_tenant_scope() IS NULL OR EXISTS (
        SELECT 1 FROM runs r
         WHERE r.partition_id = run_attempts.partition_id AND r.run_id = run_attempts.run_id
           AND r.tenant_id = cronwheel_tenant_scope()));

-- Timers of jobs and runs follow them; kinds owned by later features (workflow)
-- pass until their migration adds the owner check.
ALTER TABLE timers ENABLE ROW LEVEL SECURITY;
ALTER TABLE timers FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_scope ON timers
    USING (cronwheel_tenant_scope() IS NULL
        OR kind NOT IN ('job', 'lease', 'timeout', 'retry')
        OR (kind = 'job' AND EXISTS (
            SELECT 1 FROM jobs j
             WHERE j.partition_id = timers.partition_id AND j.job_id = timers.owner_id
               AND j.tenant_id = cronwheel_tenant_scope()))
        OR (kind <> 'job' AND EXISTS (
            SELECT 1 FROM runs r
             WHERE r.partition_id = timers.partition_id AND r.run_id = timers.owner_id
               AND r.tenant_id = cronwheel_tenant_scope())));

-- No policy on the outbox: the gateway only appends to it, and any policy there
-- makes the planner guess the scope check passes 0.5% of rows, which turns the
-- relay's ordered read (index on id, stop at LIMIT) into a full scan and sort.

ALTER TABLE idempotency_keys ENABLE ROW LEVEL SECURITY;
ALTER TABLE idempotency_keys FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_scope ON idempotency_keys
    USING (cronwheel_tenant_scope() IS NULL OR scope = cronwheel_tenant_scope());
