-- A move's source copy (the tenant's rows and topics in the cell it left)
-- may be kept for a retention period after the switch
-- (CRONWHEEL_MOVE_SOURCE_RETENTION_S, docs/cells.md "After the switch"):
-- when it was removed; NULL while it is kept. Moves that ended `done` before
-- this column had their source removed at the switch.
SET LOCAL lock_timeout = '5s';
SET LOCAL statement_timeout = '60s';

ALTER TABLE directory_moves ADD COLUMN source_removed_at timestamptz;

UPDATE directory_moves SET source_removed_at = finished_at WHERE state = 'done';
