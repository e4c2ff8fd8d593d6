-- The scope of a gateway transaction, read by the row-level security policies
-- of migration 0002 (cronwheel_tenant_scope()).

-- name: set_scope
-- '' lifts the scope for this transaction (key lookup, operator requests); a
-- tenant_id confines it to that tenant. Local: it ends with the transaction.
SELECT set_config('cronwheel.tenant_id', %(scope)s, true);

-- name: default_scope
-- A pooled session outside any declared scope sees no tenant's rows.
SET cronwheel.tenant_id = '!none';

-- name: ping
SELECT 1;
