-- Services connect as roles made for them, and row-level security fails
-- closed (docs/tenancy.md, "Roles"). Until now every service connected as the
-- tables' owner, and every policy read `cronwheel_tenant_scope() IS NULL OR
-- tenant_id = ...`: a session that never set the scope saw every tenant's rows.
--
-- Three group roles (NOLOGIN; a deployment grants them to its login roles):
--   cronwheel_platform  the internal services (timer, relay, dispatcher,
--                       workflow, webhook, executor): every row, by a policy of
--                       its own, USING (true);
--   cronwheel_gateway   the HTTP gateway: a tenant's rows while the transaction
--                       is scoped to it (cronwheel.tenant_id), no row otherwise;
--   cronwheel_operator  what the gateway becomes (SET LOCAL ROLE) for an
--                       operator request: every row, by its own policy.
-- cronwheel_gateway is NOINHERIT, so the operator's policies apply only after
-- that explicit SET LOCAL ROLE, never to a plain gateway session.
-- cronwheel_platform may SET ROLE cronwheel_gateway (the gateway of `cronwheel
-- dev` and of the tests logs in as the platform and narrows itself at once).
--
-- Roles belong to the cluster, not to this database: they are made here only
-- when missing (which needs CREATEROLE), so a second database of the same
-- cluster (a test's clone, a cell) finds them and changes nothing. Passwords
-- are not a migration's business: `cronwheel migrate` sets them afterwards
-- (CRONWHEEL_DB_*_PASSWORD, or the local stack's).
--
-- Each ALTER TABLE and ALTER POLICY below takes its table's ACCESS EXCLUSIVE
-- lock for an instant (no rewrite, no scan): behind a long transaction it
-- would queue every service's statements on that table, so it gives up
-- instead and `cronwheel migrate` is run again.
SET LOCAL lock_timeout = '5s';
SET LOCAL statement_timeout = '60s';

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'cronwheel_platform') THEN
        CREATE ROLE cronwheel_platform NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'cronwheel_gateway') THEN
        CREATE ROLE cronwheel_gateway NOLOGIN NOINHERIT;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'cronwheel_operator') THEN
        CREATE ROLE cronwheel_operator NOLOGIN;
    END IF;
    IF (SELECT rolinherit FROM pg_roles WHERE rolname = 'cronwheel_gateway') THEN
        ALTER ROLE cronwheel_gateway NOINHERIT;
    END IF;
    IF NOT pg_has_role('cronwheel_gateway', 'cronwheel_operator', 'MEMBER') THEN
        GRANT cronwheel_operator TO cronwheel_gateway;
    END IF;
    IF NOT pg_has_role('cronwheel_platform', 'cronwheel_gateway', 'MEMBER') THEN
        GRANT cronwheel_gateway TO cronwheel_platform;
    END IF;
END $$;

-- The owner keeps the tables and bypasses their policies (no FORCE): it runs
-- the migrations and owns cronwheel_authenticate below. No service may log in
-- as it; services/entrypoints.py refuses to start one that does
-- (cronwheel/store/db.py, refuse_unsafe_role).
ALTER TABLE tenants NO FORCE ROW LEVEL SECURITY;
ALTER TABLE api_keys NO FORCE ROW LEVEL SECURITY;
ALTER TABLE jobs NO FORCE ROW LEVEL SECURITY;
ALTER TABLE runs NO FORCE ROW LEVEL SECURITY;
ALTER TABLE run_attempts NO FORCE ROW LEVEL SECURITY;
ALTER TABLE timers NO FORCE ROW LEVEL SECURITY;
ALTER TABLE idempotency_keys NO FORCE ROW LEVEL SECURITY;
ALTER TABLE workflows NO FORCE ROW LEVEL SECURITY;
ALTER TABLE workflow_runs NO FORCE ROW LEVEL SECURITY;
ALTER TABLE workflow_nodes NO FORCE ROW LEVEL SECURITY;
ALTER TABLE workflow_run_nodes NO FORCE ROW LEVEL SECURITY;
ALTER TABLE webhook_secrets NO FORCE ROW LEVEL SECURITY;
ALTER TABLE tenant_quotas NO FORCE ROW LEVEL SECURITY;
ALTER TABLE tenant_limits NO FORCE ROW LEVEL SECURITY;

-- The tenant scope, for the gateway alone, without "unset means everything":
-- an unset scope is NULL, `x = NULL` is never true, so no row passes.
ALTER POLICY tenant_scope ON tenants TO cronwheel_gateway
    USING (tenant_id = cronwheel_tenant_scope());
ALTER POLICY tenant_scope ON api_keys TO cronwheel_gateway
    USING (tenant_id = cronwheel_tenant_scope());
ALTER POLICY tenant_scope ON jobs TO cronwheel_gateway
    USING (tenant_id = cronwheel_tenant_scope());
ALTER POLICY tenant_scope ON runs TO cronwheel_gateway
    USING (tenant_id = cronwheel_tenant_scope());
ALTER POLICY tenant_scope ON run_attempts TO cronwheel_gateway
    USING (EXISTS (
        SELECT 1 FROM runs r
         WHERE r.partition_id = run_attempts.partition_id AND r.run_id = run_attempts.run_id
           AND r.tenant_id = cronwheel_tenant_scope()));
ALTER POLICY tenant_scope ON timers TO cronwheel_gateway
    USING (tenant_id = cronwheel_tenant_scope());
ALTER POLICY tenant_scope ON idempotency_keys TO cronwheel_gateway
    USING (scope = cronwheel_tenant_scope());
ALTER POLICY tenant_scope ON workflows TO cronwheel_gateway
    USING (tenant_id = cronwheel_tenant_scope());
ALTER POLICY tenant_scope ON workflow_runs TO cronwheel_gateway
    USING (tenant_id = cronwheel_tenant_scope());
ALTER POLICY tenant_scope ON workflow_nodes TO cronwheel_gateway
    USING (EXISTS (
        SELECT 1 FROM workflows w
         WHERE w.partition_id = workflow_nodes.partition_id
           AND w.workflow_id = workflow_nodes.workflow_id
           AND w.tenant_id = cronwheel_tenant_scope()));
ALTER POLICY tenant_scope ON workflow_run_nodes TO cronwheel_gateway
    USING (EXISTS (
        SELECT 1 FROM workflow_runs r
         WHERE r.partition_id = workflow_run_nodes.partition_id
           AND r.workflow_run_id = workflow_run_nodes.workflow_run_id
           AND r.tenant_id = cronwheel_tenant_scope()));
ALTER POLICY tenant_scope ON webhook_secrets TO cronwheel_gateway
    USING (tenant_id = cronwheel_tenant_scope());
ALTER POLICY tenant_scope ON tenant_quotas TO cronwheel_gateway
    USING (tenant_id = cronwheel_tenant_scope());
ALTER POLICY tenant_scope ON tenant_limits TO cronwheel_gateway
    USING (tenant_id = cronwheel_tenant_scope());

-- The platform's services and the operator work on every tenant by design;
-- each says so with a policy of its own rather than through an unset scope.
CREATE POLICY platform ON tenants TO cronwheel_platform USING (true);
CREATE POLICY platform ON api_keys TO cronwheel_platform USING (true);
CREATE POLICY platform ON jobs TO cronwheel_platform USING (true);
CREATE POLICY platform ON runs TO cronwheel_platform USING (true);
CREATE POLICY platform ON run_attempts TO cronwheel_platform USING (true);
CREATE POLICY platform ON timers TO cronwheel_platform USING (true);
CREATE POLICY platform ON idempotency_keys TO cronwheel_platform USING (true);
CREATE POLICY platform ON workflows TO cronwheel_platform USING (true);
CREATE POLICY platform ON workflow_runs TO cronwheel_platform USING (true);
CREATE POLICY platform ON workflow_nodes TO cronwheel_platform USING (true);
CREATE POLICY platform ON workflow_run_nodes TO cronwheel_platform USING (true);
CREATE POLICY platform ON webhook_secrets TO cronwheel_platform USING (true);
CREATE POLICY platform ON tenant_quotas TO cronwheel_platform USING (true);
CREATE POLICY platform ON tenant_limits TO cronwheel_platform USING (true);

CREATE POLICY operator ON tenants TO cronwheel_operator USING (true);
CREATE POLICY operator ON api_keys TO cronwheel_operator USING (true);
CREATE POLICY operator ON jobs TO cronwheel_operator USING (true);
CREATE POLICY operator ON runs TO cronwheel_operator USING (true);
CREATE POLICY operator ON run_attempts TO cronwheel_operator USING (true);
CREATE POLICY operator ON timers TO cronwheel_operator USING (true);
CREATE POLICY operator ON idempotency_keys TO cronwheel_operator USING (true);
CREATE POLICY operator ON workflows TO cronwheel_operator USING (true);
CREATE POLICY operator ON workflow_runs TO cronwheel_operator USING (true);
CREATE POLICY operator ON workflow_nodes TO cronwheel_operator USING (true);
CREATE POLICY operator ON workflow_run_nodes TO cronwheel_operator USING (true);
CREATE POLICY operator ON webhook_secrets TO cronwheel_operator USING (true);
CREATE POLICY operator ON tenant_quotas TO cronwheel_operator USING (true);
CREATE POLICY operator ON tenant_limits TO cronwheel_operator USING (true);

-- Table privileges. The platform: every table. The gateway and the operator:
-- the tenant tables above, each behind its policies, and the outbox to append
-- to only (it has no policy, see 0002: reading it would show every tenant's
-- records). A table a later migration adds is closed to all three until that
-- migration grants it (and, with row-level security, gives it its policies):
-- no default privileges, which would also tie the schema to the name of the
-- role that runs the migrations (tests/integration/test_db_roles.py checks
-- that every table is the platform's and has the three policies).
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO cronwheel_platform;
GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO cronwheel_platform;

GRANT SELECT, INSERT, UPDATE, DELETE ON
    tenants, api_keys, jobs, runs, run_attempts, timers, idempotency_keys, workflows,
    workflow_runs, workflow_nodes, workflow_run_nodes, webhook_secrets, tenant_quotas,
    tenant_limits
    TO cronwheel_gateway, cronwheel_operator;
GRANT INSERT ON outbox TO cronwheel_gateway, cronwheel_operator;

-- The key check (0007) looked the key up after lifting the scope to '', which
-- now shows nothing. It runs as its owner instead (SECURITY DEFINER: the owner
-- bypasses the policies) and still leaves the caller's transaction confined to
-- the key's tenant, or to '!none'. A fixed search_path, as every SECURITY
-- DEFINER function needs, so a caller's objects cannot stand in for ours.
CREATE OR REPLACE FUNCTION cronwheel_authenticate(key_hash bytea)
    RETURNS TABLE (tenant_id text, name text, cell text, priority_classes text[])
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, public
    AS $$
DECLARE
    k record;
BEGIN
    SELECT t.tenant_id, t.name, t.cell, t.priority_classes INTO k
      FROM public.api_keys a JOIN public.tenants t ON t.tenant_id = a.tenant_id
     WHERE a.key_hash = cronwheel_authenticate.key_hash AND a.revoked_at IS NULL;
    IF NOT FOUND THEN
        PERFORM set_config('cronwheel.tenant_id', '!none', true);
        RETURN;
    END IF;
    PERFORM set_config('cronwheel.tenant_id', k.tenant_id, true);
    tenant_id := k.tenant_id;
    name := k.name;
    cell := k.cell;
    priority_classes := k.priority_classes;
    RETURN NEXT;
END $$;
REVOKE EXECUTE ON FUNCTION cronwheel_authenticate(bytea) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION cronwheel_authenticate(bytea) TO cronwheel_gateway, cronwheel_platform;
