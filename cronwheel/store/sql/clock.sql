-- The database's clock, which judges leases and due times (docs/reliability.md,
-- "Clock skew"). clock_timestamp(), not now(): the time of the call, not of
-- the transaction's start.

-- name: db_now
SELECT clock_timestamp();
