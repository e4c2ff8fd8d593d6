-- The gateway's key check and tenant scope in one statement (docs/tenancy.md).
--
-- A tenant request used to take three statements before its first query: lift
-- the scope (''), look the key's hash up, confine the scope to its tenant. This
-- function does the three in one call and one round trip. It lifts the scope
-- only for its own lookup and leaves the transaction confined to the key's
-- tenant, or to '!none' (no tenant's rows) when the key is unknown or revoked,
-- so row-level security stays the second line behind the tenant filter every
-- query carries. The settings are transaction-local: call it inside the
-- request's transaction. SECURITY INVOKER: it needs nothing the caller lacks.
CREATE FUNCTION cronwheel_authenticate(key_hash bytea)
    RETURNS TABLE (tenant_id text, name text, cell text, priority_classes text[])
    LANGUAGE plpgsql VOLATILE
    AS $$
DECLARE
    k record;
BEGIN
    PERFORM set_config('cronwheel.tenant_id', '', true);
    SELECT t.tenant_id, t.name, t.cell, t.priority_classes INTO k
      FROM api_keys a JOIN tenants t ON t.tenant_id = a.tenant_id
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
