-- A tenant's own run retention (tenants.run_retention_days, migration 0025):
-- null is CRONWHEEL_RUN_RETENTION_DAYS. Set by the operator
-- (PUT /v1/tenants/{id}/retention); cronwheel retention keeps every day until
-- the longest has passed, and the tenant's run reads stop at its own.

-- name: get_retention
SELECT tenant_id, run_retention_days FROM tenants WHERE tenant_id = %(tenant_id)s;

-- name: set_retention
UPDATE tenants SET run_retention_days = %(days)s
 WHERE tenant_id = %(tenant_id)s
RETURNING tenant_id, run_retention_days;
