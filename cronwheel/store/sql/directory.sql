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

-- Moves (directory migration 0002, cronwheel/moves.py). Every write to a move
-- is conditional on the state the mover read, and returns the row it changed:
-- no row back, another mover took the step first.

-- name: record_move
INSERT INTO directory_moves (move_id, tenant_id, source, target, epoch)
VALUES (%(move_id)s, %(tenant_id)s, %(source)s, %(target)s, %(epoch)s)
RETURNING move_id, tenant_id, source, target, epoch, state, error, started_at, frozen_at,
          unfrozen_at, finished_at, source_removed_at;

-- name: move
SELECT move_id, tenant_id, source, target, epoch, state, error, started_at, frozen_at,
       unfrozen_at, finished_at, source_removed_at
  FROM directory_moves WHERE move_id = %(move_id)s;

-- name: latest_move
SELECT move_id, tenant_id, source, target, epoch, state, error, started_at, frozen_at,
       unfrozen_at, finished_at, source_removed_at
  FROM directory_moves WHERE tenant_id = %(tenant_id)s
 ORDER BY started_at DESC, move_id DESC
 LIMIT 1;

-- name: open_moves
SELECT move_id FROM directory_moves
 WHERE state IN ('copying', 'freezing', 'switching')
 ORDER BY started_at;

-- name: kept_sources
-- Moves done whose source copy is still kept: those past the retention
-- (finished at least %(retention_s)s seconds ago, on the directory's clock),
-- or, with %(tenant_id)s, that tenant's kept in cell %(cell)s whatever their
-- age (a move back into a cell that keeps the tenant's old copy).
SELECT move_id, tenant_id, source, target, epoch, state, error, started_at, frozen_at,
       unfrozen_at, finished_at, source_removed_at
  FROM directory_moves
 WHERE state = 'done' AND source_removed_at IS NULL
   AND CASE WHEN %(tenant_id)s::text IS NULL
            THEN finished_at <= now() - make_interval(secs => %(retention_s)s)
            ELSE tenant_id = %(tenant_id)s AND source = %(cell)s END
 ORDER BY finished_at;

-- name: mark_source_removed
UPDATE directory_moves
   SET source_removed_at = coalesce(source_removed_at, now()), updated_at = now()
 WHERE move_id = %(move_id)s AND state = 'done'
RETURNING move_id, tenant_id, source, target, epoch, state, error, started_at, frozen_at,
          unfrozen_at, finished_at, source_removed_at;

-- name: step_move
-- The move's next state, from the one the mover read. frozen_at and
-- unfrozen_at are set once (the first mover to get there), finished_at with
-- a final state.
UPDATE directory_moves
   SET state = %(to)s,
       error = coalesce(%(error)s, error),
       frozen_at = CASE WHEN %(frozen)s THEN coalesce(frozen_at, now()) ELSE frozen_at END,
       unfrozen_at = CASE WHEN %(unfrozen)s THEN coalesce(unfrozen_at, now()) ELSE unfrozen_at END,
       finished_at = CASE WHEN %(to)s IN ('done', 'failed', 'rolled_back') THEN now() END,
       updated_at = now()
 WHERE move_id = %(move_id)s AND state = %(from)s
RETURNING move_id, tenant_id, source, target, epoch, state, error, started_at, frozen_at,
          unfrozen_at, finished_at, source_removed_at;

-- name: mark_frozen
-- When the source froze (the first time only): the start of the freeze window.
UPDATE directory_moves SET frozen_at = coalesce(frozen_at, now()), updated_at = now()
 WHERE move_id = %(move_id)s
RETURNING frozen_at;
