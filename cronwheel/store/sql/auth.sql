-- The key check of a tenant request (migrations 0007 and 0018: the function
-- reads every tenant's keys as the tables' owner, SECURITY DEFINER, and the
-- caller sees no key but through it).

-- name: authenticate
-- The key's tenant, or no row when it is unknown or revoked; the transaction's
-- scope is then that tenant, or '!none'. One statement for what took three.
SELECT tenant_id, name, cell, priority_classes FROM cronwheel_authenticate(%(hash)s);

-- name: key_tenant
-- The key's tenant for the gateway's key cache and rate limit (services/gateway/
-- auth.py), run on its own, outside a transaction block: the scope it sets ends
-- with the statement. No row: unknown or revoked.
SELECT tenant_id FROM cronwheel_authenticate(%(hash)s);
