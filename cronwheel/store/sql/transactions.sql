-- The roles and scope of a gateway transaction (migration 0018,
-- docs/tenancy.md "Roles"): the gateway's policies show the rows of the tenant
-- named by cronwheel.tenant_id (cronwheel_tenant_scope()), and no row at all
-- while it is unset.

-- name: gateway_role
-- Every pooled session acts as cronwheel_gateway from its start, whichever
-- login it came in on (the gateway's own, or the platform's in `cronwheel dev`
-- and the tests): its statements see a tenant's rows only inside that
-- tenant's scope, which cronwheel_authenticate sets per transaction.
SET ROLE cronwheel_gateway;

-- name: operator_role
-- An operator request (and the gateway's own work across tenants: pruning
-- Idempotency-Keys) becomes cronwheel_operator for its transaction alone,
-- whose policies show every row. Local: it ends with the transaction, and the
-- session is the gateway again.
SET LOCAL ROLE cronwheel_operator;

-- name: ping
SELECT 1;
