-- Run history partitioned by day (issue 25, retention), the expand step of
-- an expand -> migrate -> contract change (docs/migrations.md, "Worked
-- example: run retention"). `runs` and `run_attempts` grow without bound;
-- `runs_daily` and `run_attempts_daily` hold the same rows, range-partitioned
-- by the run's scheduled instant, one partition per UTC day, so history past
-- the retention horizon goes by dropping a whole partition (O(1) in its rows)
-- instead of a DELETE.
--
-- Partition key: scheduled_at, and the primary key is (partition_id, run_id,
-- scheduled_at). A run id determines its scheduled instant: a scheduled run's
-- id hashes (job, instant), a trigger's hashes (job, trigger instant) and
-- scheduled_at is that instant, a workflow node's hashes (workflow run, node)
-- and scheduled_at is the workflow run's, itself fixed by the workflow run's
-- id. So a duplicate fire carries the same scheduled_at, lands in the same
-- partition and meets the same key: the key with scheduled_at is as unique as
-- run_id alone, and `ON CONFLICT` still makes a double fire a no-op. And
-- scheduled_at never changes after the insert (no statement sets it).
--
-- This release writes both shapes in the same transaction: statement-level
-- triggers on `runs` and `run_attempts` mirror every insert, update and
-- delete into the new tables from the statement's transition table. A
-- trigger rather than a second statement in each of the ~20 writers: it
-- covers every writer, the previous release's too while the two run side by
-- side, and it is one statement per statement, not per row, so the firing
-- loop's batch insert pays one INSERT ... SELECT more. Reads stay on `runs`;
-- `cronwheel backfill` copies the rows older than this migration, then the
-- next release reads the new tables.
--
-- Partitions are made outside migrations, by `cronwheel retention` and
-- `cronwheel backfill` (as the owner: cronwheel/store/runs_daily.py), a week
-- ahead; the DEFAULT partition takes any row whose day has no partition yet
-- (a stack that never ran them, a job's backfill into a day already dropped)
-- and a non-terminal run kept past its day's drop. So this file, and
-- schema.sql, name no date.
SET LOCAL lock_timeout = '2s';
SET LOCAL statement_timeout = '60s';

CREATE TABLE runs_daily (
    partition_id smallint NOT NULL,
    run_id text NOT NULL,
    tenant_id text NOT NULL,
    job_id text,
    workflow_run_id text,
    node text,
    scheduled_at timestamptz NOT NULL,
    covers jsonb,
    priority text NOT NULL DEFAULT 'normal',
    spec jsonb NOT NULL,
    state run_state NOT NULL DEFAULT 'PENDING',
    attempt integer NOT NULL DEFAULT 1,
    start_token text,
    worker_id text,
    lease_expires_at timestamptz,
    result jsonb,
    error text,
    created_at timestamptz NOT NULL DEFAULT now(),
    started_at timestamptz,
    finished_at timestamptz,
    updated_at timestamptz NOT NULL DEFAULT now(),
    reannounced integer,
    last_reannounced_at timestamptz,
    CONSTRAINT runs_daily_pkey PRIMARY KEY (partition_id, run_id, scheduled_at),
    CONSTRAINT finished_iff_terminal CHECK (
        (state IN ('SUCCEEDED', 'FAILED', 'TIMED_OUT', 'CANCELLED', 'SKIPPED'))
        = (finished_at IS NOT NULL)),
    CONSTRAINT running_has_token CHECK (
        state <> 'RUNNING' OR (start_token IS NOT NULL AND lease_expires_at IS NOT NULL)),
    CONSTRAINT runs_attempt_check CHECK (attempt >= 1),
    CONSTRAINT runs_partition_id_check CHECK (partition_id >= 0 AND partition_id <= 1023),
    CONSTRAINT runs_reannounced_check CHECK (reannounced >= 1)
) PARTITION BY RANGE (scheduled_at);

-- An attempt carries its run's scheduled_at (its partition: a day's runs and
-- their attempts go together) and tenant_id (the gateway's scope, without a
-- join to the run).
CREATE TABLE run_attempts_daily (
    partition_id smallint NOT NULL,
    run_id text NOT NULL,
    attempt integer NOT NULL,
    worker_id text,
    started_at timestamptz NOT NULL,
    finished_at timestamptz,
    outcome text,
    error text,
    scheduled_at timestamptz NOT NULL,
    tenant_id text NOT NULL,
    CONSTRAINT run_attempts_daily_pkey PRIMARY KEY (partition_id, run_id, attempt, scheduled_at)
) PARTITION BY RANGE (scheduled_at);

-- The indexes of runs' reads, per partition (an index on a partitioned table
-- is one per partition; CONCURRENTLY does not exist for them, and both tables
-- are empty and new in this transaction).
-- squawk-ignore require-concurrent-index-creation -- runs_daily is created empty in this file
CREATE INDEX runs_daily_tenant_created ON runs_daily (tenant_id, created_at DESC, run_id DESC);
-- squawk-ignore require-concurrent-index-creation -- runs_daily is created empty in this file
CREATE INDEX runs_daily_job ON runs_daily (job_id, scheduled_at DESC) WHERE job_id IS NOT NULL;
-- The non-terminal runs of a day: what a partition's drop keeps (moved to the
-- default partition), found without reading the day.
-- squawk-ignore require-concurrent-index-creation -- runs_daily is created empty in this file
CREATE INDEX runs_daily_unfinished ON runs_daily (partition_id, scheduled_at)
 WHERE finished_at IS NULL;

CREATE TABLE runs_daily_default PARTITION OF runs_daily DEFAULT WITH (fillfactor = 80);
CREATE TABLE run_attempts_daily_default PARTITION OF run_attempts_daily DEFAULT;

-- Grants and policies as runs' (0018): the services' roles reach the rows
-- through the parents, whose privileges and policies alone are checked; a
-- partition is granted to the platform only (its policy is `true` anyway),
-- never to the gateway, whose scope lives on the parent.
GRANT SELECT, INSERT, UPDATE, DELETE ON runs_daily, run_attempts_daily
    TO cronwheel_platform, cronwheel_gateway, cronwheel_operator;
GRANT SELECT, INSERT, UPDATE, DELETE ON runs_daily_default, run_attempts_daily_default
    TO cronwheel_platform;
ALTER TABLE runs_daily ENABLE ROW LEVEL SECURITY;
ALTER TABLE run_attempts_daily ENABLE ROW LEVEL SECURITY;
CREATE POLICY platform ON runs_daily TO cronwheel_platform USING (true);
CREATE POLICY operator ON runs_daily TO cronwheel_operator USING (true);
CREATE POLICY tenant_scope ON runs_daily TO cronwheel_gateway
    USING (tenant_id = cronwheel_tenant_scope());
CREATE POLICY platform ON run_attempts_daily TO cronwheel_platform USING (true);
CREATE POLICY operator ON run_attempts_daily TO cronwheel_operator USING (true);
CREATE POLICY tenant_scope ON run_attempts_daily TO cronwheel_gateway
    USING (tenant_id = cronwheel_tenant_scope());

-- The mirror: the statement's changed rows, from its transition table, as
-- one upsert (an insert, or an update of a row the backfill has not copied
-- yet: the new row whole, so no update is lost to a copy in flight; the
-- backfill inserts with DO NOTHING and never overwrites) or one delete. The
-- functions run as the caller: the gateway's writes stay in its tenant's
-- scope on the new tables as on the old.
CREATE FUNCTION runs_daily_mirror_upsert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO runs_daily SELECT * FROM mirrored
    ON CONFLICT (partition_id, run_id, scheduled_at) DO UPDATE SET
        tenant_id = EXCLUDED.tenant_id, job_id = EXCLUDED.job_id,
        workflow_run_id = EXCLUDED.workflow_run_id, node = EXCLUDED.node,
        covers = EXCLUDED.covers, priority = EXCLUDED.priority, spec = EXCLUDED.spec,
        state = EXCLUDED.state, attempt = EXCLUDED.attempt,
        start_token = EXCLUDED.start_token, worker_id = EXCLUDED.worker_id,
        lease_expires_at = EXCLUDED.lease_expires_at, result = EXCLUDED.result,
        error = EXCLUDED.error, created_at = EXCLUDED.created_at,
        started_at = EXCLUDED.started_at, finished_at = EXCLUDED.finished_at,
        updated_at = EXCLUDED.updated_at, reannounced = EXCLUDED.reannounced,
        last_reannounced_at = EXCLUDED.last_reannounced_at;
    RETURN NULL;
END $$;

CREATE FUNCTION runs_daily_mirror_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM runs_daily d USING mirrored o
     WHERE d.partition_id = o.partition_id AND d.run_id = o.run_id
       AND d.scheduled_at = o.scheduled_at;
    RETURN NULL;
END $$;

-- An attempt's run is in `runs` when the attempt is written (run_attempts'
-- foreign key): its scheduled_at and tenant_id come from there.
CREATE FUNCTION run_attempts_daily_mirror_upsert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO run_attempts_daily
    SELECT a.partition_id, a.run_id, a.attempt, a.worker_id, a.started_at, a.finished_at,
           a.outcome, a.error, r.scheduled_at, r.tenant_id
      FROM mirrored a
      JOIN runs r ON r.partition_id = a.partition_id AND r.run_id = a.run_id
    ON CONFLICT (partition_id, run_id, attempt, scheduled_at) DO UPDATE SET
        worker_id = EXCLUDED.worker_id, started_at = EXCLUDED.started_at,
        finished_at = EXCLUDED.finished_at, outcome = EXCLUDED.outcome,
        error = EXCLUDED.error;
    RETURN NULL;
END $$;

-- Deletes of attempts come with their runs' (a tenant moved out, the foreign
-- key's cascade), when the run may be gone already: matched without
-- scheduled_at, so every partition's key is probed. Rare (moves only).
CREATE FUNCTION run_attempts_daily_mirror_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM run_attempts_daily d USING mirrored o
     WHERE d.partition_id = o.partition_id AND d.run_id = o.run_id AND d.attempt = o.attempt;
    RETURN NULL;
END $$;

CREATE TRIGGER runs_daily_mirror_insert AFTER INSERT ON runs
    REFERENCING NEW TABLE AS mirrored
    FOR EACH STATEMENT EXECUTE FUNCTION runs_daily_mirror_upsert();
CREATE TRIGGER runs_daily_mirror_update AFTER UPDATE ON runs
    REFERENCING NEW TABLE AS mirrored
    FOR EACH STATEMENT EXECUTE FUNCTION runs_daily_mirror_upsert();
CREATE TRIGGER runs_daily_mirror_delete AFTER DELETE ON runs
    REFERENCING OLD TABLE AS mirrored
    FOR EACH STATEMENT EXECUTE FUNCTION runs_daily_mirror_delete();
CREATE TRIGGER run_attempts_daily_mirror_insert AFTER INSERT ON run_attempts
    REFERENCING NEW TABLE AS mirrored
    FOR EACH STATEMENT EXECUTE FUNCTION run_attempts_daily_mirror_upsert();
CREATE TRIGGER run_attempts_daily_mirror_update AFTER UPDATE ON run_attempts
    REFERENCING NEW TABLE AS mirrored
    FOR EACH STATEMENT EXECUTE FUNCTION run_attempts_daily_mirror_upsert();
CREATE TRIGGER run_attempts_daily_mirror_delete AFTER DELETE ON run_attempts
    REFERENCING OLD TABLE AS mirrored
    FOR EACH STATEMENT EXECUTE FUNCTION run_attempts_daily_mirror_delete();

-- The backfill's progress (cronwheel backfill; cronwheel migrate --status):
-- its keyset cursor over runs' primary key, committed in the transaction of
-- the batch it ends, so a killed backfill resumes after the last batch that
-- committed and visits every row once. A database with no run yet has
-- nothing older than the triggers: done from the start.
CREATE TABLE backfills (
    name text PRIMARY KEY,
    after_partition_id smallint,
    after_run_id text,
    visited bigint NOT NULL DEFAULT 0,
    copied bigint NOT NULL DEFAULT 0,
    copied_attempts bigint NOT NULL DEFAULT 0,
    total bigint,
    started_at timestamptz,
    updated_at timestamptz,
    finished_at timestamptz
);
GRANT SELECT, INSERT, UPDATE, DELETE ON backfills TO cronwheel_platform;
INSERT INTO backfills (name, finished_at)
SELECT 'runs_daily', CASE WHEN EXISTS (SELECT 1 FROM runs) THEN NULL ELSE now() END;

-- A tenant's own retention, in days (null: CRONWHEEL_RUN_RETENTION_DAYS).
-- Nullable, no default: catalog-only. NOT VALID: every existing row is null.
ALTER TABLE tenants ADD COLUMN run_retention_days integer;
ALTER TABLE tenants ADD CONSTRAINT tenants_run_retention_days_check
    CHECK (run_retention_days BETWEEN 1 AND 3650) NOT VALID;
