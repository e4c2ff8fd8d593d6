-- Per-tenant object quotas the operator raised (or lowered) from the gateway's
-- defaults (CRONWHEEL_QUOTA_JOBS, _WORKFLOWS, _KEYS): live jobs, live
-- workflows, unrevoked API keys. No row: the default applies. The gateway
-- counts a tenant's objects under a transaction-scoped advisory lock per
-- (tenant, kind) before it creates any, so two creations cannot both take the
-- last slot (cronwheel/store/quotas.py, docs/tenancy.md "Object quotas").
CREATE TABLE tenant_limits (
    tenant_id  text NOT NULL REFERENCES tenants (tenant_id) ON DELETE CASCADE,
    kind       text NOT NULL CHECK (kind IN ('jobs', 'workflows', 'keys')),
    max_count  integer NOT NULL CHECK (max_count >= 0),
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, kind)
);

ALTER TABLE tenant_limits ENABLE ROW LEVEL SECURITY;
ALTER TABLE tenant_limits FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_scope ON tenant_limits
    USING (cronwheel_tenant_scope() IS NULL OR tenant_id = cronwheel_tenant_scope());
