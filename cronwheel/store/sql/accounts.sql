-- Tenants and their API keys, as the gateway manages them. Keys are stored only
-- as SHA-256 of the secret (see cronwheel/store/jobs.py hash_key).

-- name: list_tenants
SELECT tenant_id, name, cell, priority_classes, created_at
  FROM tenants
 WHERE %(after)s::text IS NULL OR tenant_id > %(after)s
 ORDER BY tenant_id
 LIMIT %(limit)s;

-- name: get_tenant
SELECT tenant_id, name, cell, priority_classes, created_at FROM tenants
 WHERE tenant_id = %(tenant_id)s;

-- name: insert_key
INSERT INTO api_keys (key_id, tenant_id, key_hash, label, created_at)
VALUES (%(key_id)s, %(tenant_id)s, %(hash)s, %(label)s, %(now)s)
RETURNING key_id, label, created_at, revoked_at;

-- name: list_keys
-- Keyset pagination on (created_at, key_id), as jobs page: stable while keys
-- are added. The cursor keeps microseconds (a tenant's first key has them).
SELECT key_id, label, created_at, revoked_at FROM api_keys
 WHERE tenant_id = %(tenant_id)s
   AND (%(after_created)s::timestamptz IS NULL
        OR (created_at, key_id) > (%(after_created)s, %(after_id)s))
 ORDER BY created_at, key_id
 LIMIT %(limit)s;

-- name: revoke_key
-- Idempotent: revoking a revoked key keeps its first revocation time.
UPDATE api_keys SET revoked_at = COALESCE(revoked_at, %(now)s)
 WHERE tenant_id = %(tenant_id)s AND key_id = %(key_id)s
RETURNING key_id, label, created_at, revoked_at;
