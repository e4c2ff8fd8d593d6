-- A tenant's Kafka credential as its cell's broker keeps it (cronwheel/scram.py;
-- docs/cells.md "Workers follow"): the mechanism, the iteration count, the
-- salt and SaltedPassword, never the password. A move gives the same
-- credential to the target's broker with these, so the tenant's workers log in
-- there with the password they were given once. Written by the gateway when it
-- makes or rotates the tenant's principal; copied with the tenant's row by a
-- move (moves.sql rows_tenants). NULL for a tenant made before: its move
-- carries no credential, and its next rotation keeps one.
-- Nullable columns with no default: catalog-only; the lock is short, but give
-- up rather than queue behind a long transaction.
SET LOCAL lock_timeout = '2s';
SET LOCAL statement_timeout = '30s';
ALTER TABLE tenants
    ADD COLUMN kafka_scram_mechanism text,
    ADD COLUMN kafka_scram_iterations integer,
    ADD COLUMN kafka_scram_salt bytea,
    ADD COLUMN kafka_scram_salted_password bytea;
