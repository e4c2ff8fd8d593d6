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

-- name: write_fence
-- A tenant's write holds this lock (shared) until its transaction ends; a
-- move's freeze takes it exclusive (moves.sql, move_lock, the same key), so
-- the freeze waits for the writes in flight and every later write waits for
-- the freeze and then reads its state (scope_state, a statement of its own:
-- its snapshot is taken after the lock). Held in the lock manager only: no
-- row is locked or written.
SELECT pg_advisory_xact_lock_shared(
    hashtextextended('cronwheel.move:' || coalesce(cronwheel_tenant_scope(), ''), 0));

-- name: scope_state
-- The scoped tenant's state in this cell (migration 0022): a write is served
-- only while it is `active`.
SELECT state FROM tenants WHERE tenant_id = cronwheel_tenant_scope();
