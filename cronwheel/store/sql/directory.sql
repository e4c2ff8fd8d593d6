-- The directory of cells (cronwheel/store/directory.py, docs/cells.md):
-- tenant -> (cell, epoch, state), and the cells themselves.

-- name: cells
SELECT name, position, api_url, kafka_bootstrap FROM directory_cells ORDER BY position, name;

-- name: placement
SELECT tenant_id, cell, epoch, state FROM directory_tenants WHERE tenant_id = %(tenant_id)s;

-- name: operator_role
-- A placement is the operator's to write (what the gateway becomes for an
-- operator request); for this transaction alone.
SET LOCAL ROLE cronwheel_operator;

-- name: place
-- A new tenant's home, at epoch 1.
INSERT INTO directory_tenants (tenant_id, cell)
VALUES (%(tenant_id)s, %(cell)s)
RETURNING tenant_id, cell, epoch, state;

-- name: compare_and_set
-- The move protocol's one write: the row changes only while its epoch is
-- still the one the caller read; a change of cell takes the next epoch. No
-- row back: another writer got there first.
UPDATE directory_tenants
   SET cell = %(cell)s,
       state = %(state)s,
       epoch = epoch + (CASE WHEN cell <> %(cell)s THEN 1 ELSE 0 END),
       updated_at = now()
 WHERE tenant_id = %(tenant_id)s AND epoch = %(epoch)s
RETURNING tenant_id, cell, epoch, state;

-- name: register_cell
INSERT INTO directory_cells (name, position, api_url, kafka_bootstrap)
VALUES (%(name)s, %(position)s, %(api_url)s, %(kafka_bootstrap)s)
ON CONFLICT (name) DO UPDATE
   SET position = EXCLUDED.position, api_url = EXCLUDED.api_url,
       kafka_bootstrap = EXCLUDED.kafka_bootstrap;
