-- Moving a tenant between cells, the cells' side (cronwheel/store/moves.py,
-- docs/cells.md "Moving a tenant"). Run by the mover as each cell's database
-- owner: it reads and writes one tenant's rows across every table, outside
-- row-level security. The directory's side is in directory.sql.
--
-- rows_<table>: the tenant's rows of that table, every column in the table's
-- order (both cells run the same migrations, checked first), so the rows
-- copy as they are (COPY ... binary). %(t)s is the tenant.

-- name: rows_tenants
SELECT * FROM tenants WHERE tenant_id = %(t)s;

-- name: rows_api_keys
SELECT * FROM api_keys WHERE tenant_id = %(t)s;

-- name: rows_tenant_limits
SELECT * FROM tenant_limits WHERE tenant_id = %(t)s;

-- name: rows_tenant_quotas
SELECT * FROM tenant_quotas WHERE tenant_id = %(t)s;

-- name: rows_idempotency_keys
-- A tenant's requests are remembered under its id (the operator's under
-- 'operator', which stays).
SELECT * FROM idempotency_keys WHERE scope = %(t)s;

-- name: rows_jobs
SELECT * FROM jobs WHERE tenant_id = %(t)s;

-- name: rows_runs_daily
SELECT * FROM runs_daily WHERE tenant_id = %(t)s;

-- name: rows_run_attempts_daily
-- Through the tenant's runs (runs_daily_tenant_created) and each one's
-- attempts by key: run_attempts_daily has no index on tenant_id.
SELECT a.* FROM run_attempts_daily a
  JOIN runs_daily r ON r.partition_id = a.partition_id AND r.run_id = a.run_id
                   AND r.scheduled_at = a.scheduled_at
 WHERE r.tenant_id = %(t)s;

-- name: rows_timers
-- Its armed timers and those a freeze parked (the source's, after the
-- freeze: all of them are parked).
SELECT * FROM timers WHERE tenant_id = %(t)s
UNION ALL
SELECT * FROM timers_parked WHERE tenant_id = %(t)s;

-- name: rows_webhook_secrets
SELECT * FROM webhook_secrets WHERE tenant_id = %(t)s;

-- name: rows_workflows
SELECT * FROM workflows WHERE tenant_id = %(t)s;

-- name: rows_workflow_nodes
SELECT n.* FROM workflow_nodes n
  JOIN workflows w ON w.partition_id = n.partition_id AND w.workflow_id = n.workflow_id
 WHERE w.tenant_id = %(t)s;

-- name: rows_workflow_runs
SELECT * FROM workflow_runs WHERE tenant_id = %(t)s;

-- name: rows_workflow_run_nodes
SELECT n.* FROM workflow_run_nodes n
  JOIN workflow_runs w ON w.partition_id = n.partition_id
                      AND w.workflow_run_id = n.workflow_run_id
 WHERE w.tenant_id = %(t)s;

-- name: compare_tenants
-- What must match across the cells: all but `cell` and `state`, which differ
-- by design while the tenant is frozen in one and standby in the other. The
-- Kafka credential too: a rotation during the move copies again.
SELECT tenant_id, name, priority_classes, created_at, kafka_scram_mechanism,
       kafka_scram_iterations, kafka_scram_salt, kafka_scram_salted_password
  FROM tenants WHERE tenant_id = %(t)s;

-- name: delete_history
-- The tenant's runs and workflow runs with their attempts and nodes (every
-- CTE sees the rows as the statement began, so the children are found
-- through the parents it deletes). With delete_small: all of the tenant.
WITH a AS (
    DELETE FROM run_attempts_daily a USING runs_daily r
     WHERE r.partition_id = a.partition_id AND r.run_id = a.run_id
       AND r.scheduled_at = a.scheduled_at AND r.tenant_id = %(t)s),
wrn AS (
    DELETE FROM workflow_run_nodes n USING workflow_runs w
     WHERE w.partition_id = n.partition_id AND w.workflow_run_id = n.workflow_run_id
       AND w.tenant_id = %(t)s),
r AS (DELETE FROM runs_daily WHERE tenant_id = %(t)s)
DELETE FROM workflow_runs WHERE tenant_id = %(t)s;

-- name: delete_small
-- Everything of the tenant but its history. The freeze's catch-up
-- (store/moves.py catch_up) copies these tables whole again (a tenant has a
-- few rows in them per job, workflow or key), and of the history only what
-- can have changed since the first copy: runs and workflow runs unfinished,
-- or finished since `since` (a finished one does not change), with their
-- attempts and nodes. The checksums that follow
-- compare every row, so a change this misses makes the move copy whole.
WITH wn AS (
    DELETE FROM workflow_nodes n USING workflows w
     WHERE w.partition_id = n.partition_id AND w.workflow_id = n.workflow_id
       AND w.tenant_id = %(t)s),
     k AS (DELETE FROM api_keys WHERE tenant_id = %(t)s),
     l AS (DELETE FROM tenant_limits WHERE tenant_id = %(t)s),
     q AS (DELETE FROM tenant_quotas WHERE tenant_id = %(t)s),
     i AS (DELETE FROM idempotency_keys WHERE scope = %(t)s),
     j AS (DELETE FROM jobs WHERE tenant_id = %(t)s),
     s AS (DELETE FROM webhook_secrets WHERE tenant_id = %(t)s),
     w AS (DELETE FROM workflows WHERE tenant_id = %(t)s)
DELETE FROM tenants WHERE tenant_id = %(t)s;

-- name: defer_workflow_refs
SET CONSTRAINTS workflow_runs_partition_id_workflow_id_fkey DEFERRED;

-- name: recent_runs_daily
SELECT * FROM runs_daily
 WHERE tenant_id = %(t)s AND (finished_at IS NULL OR finished_at >= %(since)s);

-- name: recent_run_attempts_daily
SELECT a.* FROM run_attempts_daily a
  JOIN runs_daily r ON r.partition_id = a.partition_id AND r.run_id = a.run_id
                   AND r.scheduled_at = a.scheduled_at
 WHERE r.tenant_id = %(t)s AND (r.finished_at IS NULL OR r.finished_at >= %(since)s);

-- name: recent_workflow_runs
SELECT * FROM workflow_runs
 WHERE tenant_id = %(t)s AND (finished_at IS NULL OR finished_at >= %(since)s);

-- name: recent_workflow_run_nodes
SELECT n.* FROM workflow_run_nodes n
  JOIN workflow_runs w ON w.partition_id = n.partition_id
                      AND w.workflow_run_id = n.workflow_run_id
 WHERE w.tenant_id = %(t)s AND (w.finished_at IS NULL OR w.finished_at >= %(since)s);

-- name: stage_runs_daily
-- The recent rows are copied into temporary tables first (dropped at
-- commit), then merged.
CREATE TEMP TABLE moved_runs_daily (LIKE runs_daily) ON COMMIT DROP;

-- name: stage_run_attempts_daily
CREATE TEMP TABLE moved_run_attempts_daily (LIKE run_attempts_daily) ON COMMIT DROP;

-- name: stage_workflow_runs
CREATE TEMP TABLE moved_workflow_runs (LIKE workflow_runs) ON COMMIT DROP;

-- name: stage_workflow_run_nodes
CREATE TEMP TABLE moved_workflow_run_nodes (LIKE workflow_run_nodes) ON COMMIT DROP;

-- name: forget_recent_children
-- The target's unfinished history of the tenant goes, to be replaced by the
-- source's recent rows; its older finished rows stay as the first copy
-- wrote them.
WITH a AS (
    DELETE FROM run_attempts_daily a USING runs_daily r
     WHERE r.partition_id = a.partition_id AND r.run_id = a.run_id
       AND r.scheduled_at = a.scheduled_at AND r.tenant_id = %(t)s
       AND (r.finished_at IS NULL OR r.finished_at >= %(since)s)),
wrn AS (
    DELETE FROM workflow_run_nodes n USING workflow_runs w
     WHERE w.partition_id = n.partition_id AND w.workflow_run_id = n.workflow_run_id
       AND w.tenant_id = %(t)s AND (w.finished_at IS NULL OR w.finished_at >= %(since)s))
SELECT 1;

-- name: forget_recent_parents
WITH r AS (
    DELETE FROM runs_daily r
     WHERE r.tenant_id = %(t)s AND (r.finished_at IS NULL OR r.finished_at >= %(since)s))
DELETE FROM workflow_runs w
 WHERE w.tenant_id = %(t)s AND (w.finished_at IS NULL OR w.finished_at >= %(since)s);

-- name: drop_staged_runs_daily
-- What is left of the recent rows' ids in the target (a row the first copy
-- saw finished before `since` that the source changed since) goes too;
-- then the recent rows go in.
DELETE FROM runs_daily r USING moved_runs_daily m
 WHERE r.partition_id = m.partition_id AND r.run_id = m.run_id
   AND r.scheduled_at = m.scheduled_at;

-- name: drop_staged_run_attempts_daily
DELETE FROM run_attempts_daily a USING moved_run_attempts_daily m
 WHERE a.partition_id = m.partition_id AND a.run_id = m.run_id AND a.attempt = m.attempt
   AND a.scheduled_at = m.scheduled_at;

-- name: drop_staged_workflow_runs
DELETE FROM workflow_runs w USING moved_workflow_runs m
 WHERE w.partition_id = m.partition_id AND w.workflow_run_id = m.workflow_run_id;

-- name: drop_staged_workflow_run_nodes
DELETE FROM workflow_run_nodes n USING moved_workflow_run_nodes m
 WHERE n.partition_id = m.partition_id AND n.workflow_run_id = m.workflow_run_id
   AND n.node = m.node;

-- name: insert_staged_runs_daily
INSERT INTO runs_daily SELECT * FROM moved_runs_daily;

-- name: insert_staged_run_attempts_daily
INSERT INTO run_attempts_daily SELECT * FROM moved_run_attempts_daily;

-- name: insert_staged_workflow_runs
INSERT INTO workflow_runs SELECT * FROM moved_workflow_runs;

-- name: insert_staged_workflow_run_nodes
INSERT INTO workflow_run_nodes SELECT * FROM moved_workflow_run_nodes;

-- name: tenant_state
SELECT state FROM tenants WHERE tenant_id = %(t)s;

-- name: lock_tenant
-- remove's check: the tenant's state, its row locked until the deletes commit
-- (a move back copying the tenant in waits, or finds it gone).
SELECT state FROM tenants WHERE tenant_id = %(t)s FOR UPDATE;

-- name: standby
-- The target after a copy: the tenant's rows are here, it is not served or
-- fired here yet (the claims skip a tenant that is not active).
UPDATE tenants SET state = 'standby', cell = %(cell)s WHERE tenant_id = %(t)s;

-- name: move_lock
-- The freeze's first statement: exclusive, on the key every write of the
-- tenant holds shared (transactions.sql, write_fence): it waits for the
-- writes in flight, and the writes after it see the tenant frozen.
SELECT pg_advisory_xact_lock(hashtextextended('cronwheel.move:' || %(t)s, 0));

-- name: freeze
-- The source's freeze, one transaction with timers.sql park_timers: from its commit no
-- firing transaction can claim a timer of the tenant (they are not in
-- `timers` any more, and the claims skip a tenant that is not active). The
-- row lock on the tenant waits for a transaction that holds it.
UPDATE tenants SET state = 'frozen' WHERE tenant_id = %(t)s AND state IN ('active', 'frozen')
RETURNING state;

-- name: reactivate
UPDATE tenants SET state = 'active' WHERE tenant_id = %(t)s AND state = 'frozen';

-- name: activate
-- The target after the flip: served and fired here from now on.
UPDATE tenants SET state = 'active', cell = %(cell)s WHERE tenant_id = %(t)s
RETURNING state;

-- name: wake_timers
-- The cell's firing loops look now (services/timer: a notify's payload is the
-- due millisecond): the tenant's timers just became claimable.
SELECT pg_notify('cw_timers', (extract(epoch FROM clock_timestamp()) * 1000)::bigint::text);

-- name: tenant_runs
SELECT count(*) FROM runs_daily WHERE tenant_id = %(t)s;

-- name: workflows_under_way
-- Through the tenant's workflows (workflows_tenant) and each one's running
-- runs (workflow_runs_active). A deleted workflow has none: its delete
-- cancelled them.
SELECT EXISTS (
    SELECT 1 FROM workflows w
      JOIN workflow_runs r ON r.partition_id = w.partition_id AND r.workflow_id = w.workflow_id
     WHERE w.tenant_id = %(t)s AND w.deleted_at IS NULL AND r.state = 'RUNNING');

-- name: platform_attempts
-- The tenant's runs held by the webhook or executor service (worker ids
-- `webhook:<instance>`, `executor:<instance>`; a tenant's own worker may
-- call itself so too, and is then waited for as well, up to the timeout).
SELECT count(*) FROM runs_daily
 WHERE tenant_id = %(t)s AND finished_at IS NULL AND state = 'RUNNING'
   AND (worker_id LIKE 'webhook:%%' OR worker_id LIKE 'executor:%%');

-- name: outbox_high
SELECT coalesce(max(id), 0) FROM outbox;

-- name: outbox_left
-- Records of the tenant (its topics name it), and of the platform's shared
-- topics (every tenant's), appended up to the freeze and not yet published
-- by the relay.
SELECT count(*) FROM outbox
 WHERE id <= %(upto)s AND (strpos(topic, %(needle)s) > 0 OR topic = ANY(%(shared)s));

-- name: migrations
SELECT coalesce(array_agg(version ORDER BY version), '{}') FROM schema_migrations;

-- name: checksum_of
-- A table's checksum over one of the rows_ / compare_ blocks above, put in
-- place of ROWS by the caller: how many rows and an md5 over their text in
-- a stable order (the text of a timestamp is the session's time zone's:
-- store/moves.py connects in UTC).
SELECT count(*), coalesce(md5(string_agg(x, '' ORDER BY x)), '')
  FROM (SELECT md5(r::text) AS x FROM (ROWS) r) s;
