-- The day-partitioned run history becomes the one the code writes (issue 25,
-- the release after the reads switched; docs/migrations.md, "Worked example:
-- run retention", step 3). From this release every statement on runs reads
-- and writes runs_daily and run_attempts_daily; `runs` and `run_attempts`
-- are kept whole for the previous release, which still writes them while
-- the two run side by side, until the contract step drops them.
--
-- So the mirror now runs both ways, each direction in the writer's
-- transaction:
-- - runs -> runs_daily (0025's triggers): the previous release's writes;
-- - runs_daily -> runs (below): this release's, so the previous release
--   reads every run this one fires, starts or ends.
-- Each direction skips a statement fired by the other's trigger
-- (pg_trigger_depth() > 1: the user's own statement fires its table's
-- triggers at depth 1, the mirror's write fires the other table's at depth
-- 2), so a write goes across once and does not come back. Both are upserts
-- of the whole row (deletes delete), so whichever table a release wrote, the
-- other holds the same row at commit. A run written by the two releases at
-- once is locked in one table by each, and the second to reach the other's
-- table waits for the first: the rows stay equal, at worst one of the two
-- transactions is chosen as a deadlock's victim and fails (a StartRun or
-- CompleteRun then answered with an error and retried by its caller), which
-- lasts only while both releases write.
SET LOCAL lock_timeout = '2s';
SET LOCAL statement_timeout = '60s';

-- An attempt of this release is written to run_attempts_daily and comes
-- back to run_attempts from that statement's trigger; the run it belongs to
-- may reach `runs` from a trigger of the same statement fired after it (a
-- StartRun changes both in one statement), so the key to `runs` could not
-- hold at each row. Dropping a constraint reads no row; the lock is brief.
-- Nothing relies on its cascade: every release's deletes of runs (a tenant
-- moved out, store/sql/moves.sql) delete the attempts themselves.
-- squawk-ignore ban-drop-constraint -- no writer relies on it, and the mirror cannot keep it
ALTER TABLE run_attempts DROP CONSTRAINT run_attempts_partition_id_run_id_fkey;

-- 0025's four mirror functions, now skipping what the reverse mirror wrote.
CREATE OR REPLACE FUNCTION runs_daily_mirror_upsert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF pg_trigger_depth() > 1 THEN
        RETURN NULL;
    END IF;
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

CREATE OR REPLACE FUNCTION runs_daily_mirror_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF pg_trigger_depth() > 1 THEN
        RETURN NULL;
    END IF;
    DELETE FROM runs_daily d USING mirrored o
     WHERE d.partition_id = o.partition_id AND d.run_id = o.run_id
       AND d.scheduled_at = o.scheduled_at;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION run_attempts_daily_mirror_upsert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF pg_trigger_depth() > 1 THEN
        RETURN NULL;
    END IF;
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

CREATE OR REPLACE FUNCTION run_attempts_daily_mirror_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF pg_trigger_depth() > 1 THEN
        RETURN NULL;
    END IF;
    DELETE FROM run_attempts_daily d USING mirrored o
     WHERE d.partition_id = o.partition_id AND d.run_id = o.run_id AND d.attempt = o.attempt;
    RETURN NULL;
END $$;

-- The reverse mirror, runs_daily -> runs. Statement-level triggers with
-- transition tables on the partitioned parents: one statement per statement,
-- whichever partitions the rows are in. As the caller, so the gateway's
-- writes stay in its tenant's scope on both tables.
CREATE FUNCTION runs_legacy_mirror_upsert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF pg_trigger_depth() > 1 THEN
        RETURN NULL;
    END IF;
    INSERT INTO runs SELECT * FROM mirrored
    ON CONFLICT (partition_id, run_id) DO UPDATE SET
        tenant_id = EXCLUDED.tenant_id, job_id = EXCLUDED.job_id,
        workflow_run_id = EXCLUDED.workflow_run_id, node = EXCLUDED.node,
        scheduled_at = EXCLUDED.scheduled_at,
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

CREATE FUNCTION runs_legacy_mirror_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF pg_trigger_depth() > 1 THEN
        RETURN NULL;
    END IF;
    DELETE FROM runs d USING mirrored o
     WHERE d.partition_id = o.partition_id AND d.run_id = o.run_id;
    RETURN NULL;
END $$;

CREATE FUNCTION run_attempts_legacy_mirror_upsert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF pg_trigger_depth() > 1 THEN
        RETURN NULL;
    END IF;
    INSERT INTO run_attempts (partition_id, run_id, attempt, worker_id, started_at,
                              finished_at, outcome, error)
    SELECT partition_id, run_id, attempt, worker_id, started_at, finished_at, outcome, error
      FROM mirrored
    ON CONFLICT (partition_id, run_id, attempt) DO UPDATE SET
        worker_id = EXCLUDED.worker_id, started_at = EXCLUDED.started_at,
        finished_at = EXCLUDED.finished_at, outcome = EXCLUDED.outcome,
        error = EXCLUDED.error;
    RETURN NULL;
END $$;

CREATE FUNCTION run_attempts_legacy_mirror_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF pg_trigger_depth() > 1 THEN
        RETURN NULL;
    END IF;
    DELETE FROM run_attempts d USING mirrored o
     WHERE d.partition_id = o.partition_id AND d.run_id = o.run_id AND d.attempt = o.attempt;
    RETURN NULL;
END $$;

CREATE TRIGGER runs_legacy_mirror_insert AFTER INSERT ON runs_daily
    REFERENCING NEW TABLE AS mirrored
    FOR EACH STATEMENT EXECUTE FUNCTION runs_legacy_mirror_upsert();
CREATE TRIGGER runs_legacy_mirror_update AFTER UPDATE ON runs_daily
    REFERENCING NEW TABLE AS mirrored
    FOR EACH STATEMENT EXECUTE FUNCTION runs_legacy_mirror_upsert();
CREATE TRIGGER runs_legacy_mirror_delete AFTER DELETE ON runs_daily
    REFERENCING OLD TABLE AS mirrored
    FOR EACH STATEMENT EXECUTE FUNCTION runs_legacy_mirror_delete();
CREATE TRIGGER run_attempts_legacy_mirror_insert AFTER INSERT ON run_attempts_daily
    REFERENCING NEW TABLE AS mirrored
    FOR EACH STATEMENT EXECUTE FUNCTION run_attempts_legacy_mirror_upsert();
CREATE TRIGGER run_attempts_legacy_mirror_update AFTER UPDATE ON run_attempts_daily
    REFERENCING NEW TABLE AS mirrored
    FOR EACH STATEMENT EXECUTE FUNCTION run_attempts_legacy_mirror_upsert();
CREATE TRIGGER run_attempts_legacy_mirror_delete AFTER DELETE ON run_attempts_daily
    REFERENCING OLD TABLE AS mirrored
    FOR EACH STATEMENT EXECUTE FUNCTION run_attempts_legacy_mirror_delete();

-- runs_open_job's (0010) twin: a job's unfinished runs, which the firing
-- loop asks of every job whose overlap is not `allow` (jobs.sql,
-- jobs_for_timers) and a job's delete locks (lifecycle.sql). On the parent
-- only: its entry in the catalog, no row read; each partition's index is
-- built CONCURRENTLY and attached by `cronwheel migrate` right after this
-- step (runs_daily.ensure_indexes), and a partition made later gets its own
-- with its table.
-- squawk-ignore require-concurrent-index-creation -- ON ONLY: the parent's entry alone, partitions' built concurrently after
CREATE INDEX runs_daily_open_job ON ONLY runs_daily (job_id)
 WHERE finished_at IS NULL AND job_id IS NOT NULL;
