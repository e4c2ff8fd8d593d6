-- The key check of a tenant request (migration 0007).

-- name: authenticate
-- The key's tenant, or no row when it is unknown or revoked; the transaction's
-- scope is then that tenant, or '!none'. One statement for what took three.
SELECT tenant_id, name, cell, priority_classes FROM cronwheel_authenticate(%(hash)s);
