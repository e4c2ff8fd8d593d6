-- The operator's view of the platform's health (GET /v1/system, docs/api.md;
-- cronwheel/store/sql/system.sql): which instances hold the partition leases
-- and how far behind the relay is. An operator request runs as
-- cronwheel_operator (0018), which could read every tenant's rows but not
-- these tables of the platform's own. It gets reads only, and of the outbox
-- only the columns that say how old and how held a row is: never its topic,
-- key, headers or value (a run's payload), which it does not need. Neither
-- table has row-level security, so the grant alone decides.
-- Catalog-only: a grant takes no lock that waits for readers or writers.
GRANT SELECT ON partition_leases, lease_members TO cronwheel_operator;
GRANT SELECT (id, created_at, not_before) ON outbox TO cronwheel_operator;
