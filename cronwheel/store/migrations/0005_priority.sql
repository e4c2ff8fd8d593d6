-- Priority classes and per-tenant fairness (docs/priority.md): timers and
-- outbox rows carry what the firing loop and the relay need to serve classes
-- in order and tenants round-robin within a class; operators set per-tenant
-- token buckets on firing and dispatch rates.

-- Timers know their tenant, so a due class is claimed round-robin across
-- tenants (lanes) instead of in one due-time order that a storm monopolises.
-- '' (never NULL: a row comparison with NULL ends the lane walk) until filled.
ALTER TABLE timers ADD COLUMN tenant_id text NOT NULL DEFAULT '';

-- Every writer of timers goes through store/sql/firing.sql upsert_timer, which
-- fills it from the owner (job, workflow, or the run of a lease/timeout/retry
-- timer). A trigger would cover bulk loads too but cost ~40% on them; a row
-- left '' is served as one more lane, never lost.

-- Backfill what exists (one statement per owner kind; the table is small on a
-- fresh install and one pass on a live one).
UPDATE timers t SET tenant_id = j.tenant_id FROM jobs j
 WHERE t.kind = 'job' AND t.tenant_id = ''
   AND j.partition_id = t.partition_id AND j.job_id = t.owner_id;
UPDATE timers t SET tenant_id = w.tenant_id FROM workflows w
 WHERE t.kind = 'workflow' AND t.tenant_id = ''
   AND w.partition_id = t.partition_id AND w.workflow_id = t.owner_id;
UPDATE timers t SET tenant_id = r.tenant_id FROM runs r
 WHERE t.kind IN ('lease', 'timeout', 'retry') AND t.tenant_id = ''
   AND r.partition_id = t.partition_id AND r.run_id = t.owner_id;

-- Lanes: the walk over (priority, tenant_id) finds each lane in one index
-- descent, and a lane's due timers are a range of it.
CREATE INDEX timers_lane ON timers (priority, tenant_id, due_at);

-- Outbox rows carry their class (0 critical .. 3 low; rows that are not a
-- RunReady are normal); the topic is the lane (a tenant's run topic, or a
-- shared topic such as run-completed). The relay reads class by class and
-- round-robin across lanes, oldest first within a lane.
ALTER TABLE outbox ADD COLUMN priority smallint NOT NULL DEFAULT 2
    CHECK (priority BETWEEN 0 AND 3);
CREATE INDEX outbox_lane ON outbox (priority, topic, id);

-- Per-tenant token buckets set by the operator: `fire` limits the runs its
-- job timers create per second, `dispatch` the records the dispatcher forwards
-- per second. No row: no limit. tokens may go below zero (two instances took
-- at once): the debt is paid back before the tenant gets more.
CREATE TABLE tenant_quotas (
    tenant_id   text NOT NULL REFERENCES tenants (tenant_id) ON DELETE CASCADE,
    kind        text NOT NULL CHECK (kind IN ('fire', 'dispatch')),
    rate_per_s  double precision NOT NULL CHECK (rate_per_s > 0),
    burst       double precision NOT NULL CHECK (burst >= 1),
    tokens      double precision NOT NULL,
    refilled_at timestamptz NOT NULL,
    -- What the bucket held back: items it refused (counted once per pass that
    -- refused them), and when it last did.
    held_total  bigint NOT NULL DEFAULT 0,
    held_at     timestamptz,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, kind)
);

ALTER TABLE tenant_quotas ENABLE ROW LEVEL SECURITY;
ALTER TABLE tenant_quotas FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_scope ON tenant_quotas
    USING (cronwheel_tenant_scope() IS NULL OR tenant_id = cronwheel_tenant_scope());
