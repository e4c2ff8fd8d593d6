-- Timers carry their tenant since 0005 (filled from the owner by every writer,
-- upsert_timer in store/sql/firing.sql). Scope them by it, as jobs and runs
-- are, instead of by a lookup of the owner per kind: the lookups (three
-- sub-plans) cost the planner 2-8 ms on every claim of the firing loop, more
-- than executing it. A timer whose owner was missing when it was written
-- keeps tenant_id '' and is visible to no tenant, only to the services.
DROP POLICY workflow_owner ON timers;
DROP POLICY tenant_scope ON timers;
CREATE POLICY tenant_scope ON timers
    USING (cronwheel_tenant_scope() IS NULL OR tenant_id = cronwheel_tenant_scope());

-- Each firing updates its job's bookkeeping (last_instant, counters), none of
-- it indexed: with room on the page the update is HOT (no index entries). A
-- full page (bulk-loaded or long-lived jobs) forces a new version elsewhere
-- and an entry in every index of jobs. Leave a quarter of each page free.
-- (Existing pages gain the room as they are rewritten; new ones have it.)
ALTER TABLE jobs SET (fillfactor = 75);
