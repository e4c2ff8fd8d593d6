-- Workflows, workflow runs and the completion step. Every statement names its
-- partition: a workflow, its runs, their nodes and the node runs share one.

-- name: insert_workflow
INSERT INTO workflows (partition_id, workflow_id, tenant_id, name, priority, node_count, schedule,
                       overlap, catchup, jitter_ms, anchor_at, last_instant, created_at, updated_at)
VALUES (%(p)s, %(wf)s, %(tenant_id)s, %(name)s, %(priority)s, %(node_count)s, %(schedule)s,
        %(overlap)s, %(catchup)s, %(jitter_ms)s, %(now)s, %(now)s, %(now)s, %(now)s);

-- name: insert_nodes
INSERT INTO workflow_nodes (partition_id, workflow_id, node, idx, spec, depends_on, children)
SELECT %(p)s, %(wf)s, v.node, v.idx, v.spec::jsonb,
       ARRAY(SELECT jsonb_array_elements_text(v.deps::jsonb)),
       ARRAY(SELECT jsonb_array_elements_text(v.kids::jsonb))
  FROM unnest(%(node)s::text[], %(idx)s::int[], %(spec)s::text[], %(deps)s::text[],
              %(kids)s::text[]) AS v(node, idx, spec, deps, kids);

-- name: get_workflow
SELECT w.*, t.due_at AS next_due_at
  FROM workflows w
  LEFT JOIN timers t ON t.partition_id = w.partition_id AND t.timer_id = 'workflow:' || w.workflow_id
 WHERE w.partition_id = %(p)s AND w.workflow_id = %(wf)s AND w.tenant_id = %(tenant_id)s
   AND w.deleted_at IS NULL;

-- name: lock_workflow_timer
-- Workflow operations lock the workflow's timer before the workflow row, the
-- order the firing loop takes them in (claim the timer, then advance the
-- workflow), as job operations do (jobs.sql lock_job_timer). Without it a
-- pause during a firing deadlocked, and PostgreSQL failed one side: a 503
-- to the caller (seen in CI, 2026-12-03, replay_retention's pause).
SELECT 1 FROM timers
 WHERE partition_id = %(p)s AND timer_id = 'workflow:' || %(wf)s
   FOR UPDATE;

-- name: lock_workflow
SELECT * FROM workflows
 WHERE partition_id = %(p)s AND workflow_id = %(wf)s AND tenant_id = %(tenant_id)s
   AND deleted_at IS NULL
   FOR UPDATE;

-- name: workflow_by_id
-- For the services (no tenant given): also a deleted or paused workflow.
SELECT * FROM workflows WHERE partition_id = %(p)s AND workflow_id = %(wf)s;

-- name: get_nodes
SELECT node, spec, depends_on FROM workflow_nodes
 WHERE partition_id = %(p)s AND workflow_id = %(wf)s
 ORDER BY idx;

-- name: list_workflows
-- Keyset pagination on (created_at, workflow_id): stable while workflows are added.
SELECT w.*, t.due_at AS next_due_at
  FROM workflows w
  LEFT JOIN timers t ON t.partition_id = w.partition_id AND t.timer_id = 'workflow:' || w.workflow_id
 WHERE w.tenant_id = %(tenant_id)s AND w.deleted_at IS NULL
   AND (%(after_created)s::timestamptz IS NULL
        OR (w.created_at, w.workflow_id) > (%(after_created)s, %(after_id)s))
 ORDER BY w.created_at, w.workflow_id
 LIMIT %(limit)s;

-- name: set_paused
UPDATE workflows SET paused = %(paused)s, updated_at = %(now)s
 WHERE partition_id = %(p)s AND workflow_id = %(wf)s;

-- name: soft_delete
UPDATE workflows SET deleted_at = %(now)s, updated_at = %(now)s
 WHERE partition_id = %(p)s AND workflow_id = %(wf)s;

-- name: running_workflow_runs
SELECT workflow_run_id FROM workflow_runs
 WHERE partition_id = %(p)s AND workflow_id = %(wf)s AND state = 'RUNNING';

-- name: workflows_for_timers
SELECT w.partition_id, w.workflow_id, w.tenant_id, w.priority, w.node_count, w.schedule,
       w.overlap, w.catchup, w.jitter_ms, w.anchor_at, w.last_instant, w.version,
       (w.overlap <> 'allow' AND EXISTS (
            SELECT 1 FROM workflow_runs r
             WHERE r.workflow_id = w.workflow_id AND r.partition_id = w.partition_id
               AND r.state = 'RUNNING')) AS has_active
  FROM workflows w
  JOIN unnest(%(partitions)s::smallint[], %(ids)s::text[]) AS k(p, id)
    ON w.partition_id = k.p AND w.workflow_id = k.id
 WHERE w.deleted_at IS NULL AND NOT w.paused AND w.schedule IS NOT NULL;

-- name: advance_workflow
UPDATE workflows
   SET last_instant = %(li)s,
       missed_count = missed_count + %(missed)s,
       fired_count = fired_count + %(fired)s,
       overlap_skipped = overlap_skipped + %(skipped)s,
       buffered_at = COALESCE(%(buffered)s, buffered_at)
 WHERE partition_id = %(p)s AND workflow_id = %(wf)s;

-- name: take_buffered_instant
-- overlap=buffer_one: the instant held back while a workflow run was active.
WITH old AS (
    SELECT partition_id, workflow_id, buffered_at FROM workflows
     WHERE partition_id = %(p)s AND workflow_id = %(wf)s AND buffered_at IS NOT NULL
       AND deleted_at IS NULL AND NOT paused
       FOR UPDATE)
UPDATE workflows w
   SET buffered_at = NULL
  FROM old
 WHERE w.partition_id = old.partition_id AND w.workflow_id = old.workflow_id
RETURNING old.buffered_at;


-- name: insert_workflow_run
-- Deterministic ids: a duplicate fire of the same instant inserts nothing.
INSERT INTO workflow_runs (partition_id, workflow_run_id, workflow_id, tenant_id, trigger,
                           scheduled_at, covers, priority, nodes_left, created_at, updated_at)
VALUES (%(p)s, %(wfr)s, %(wf)s, %(tenant_id)s, %(trigger)s, %(scheduled)s, %(covers)s,
        %(priority)s, %(nodes_left)s, %(now)s, %(now)s)
ON CONFLICT DO NOTHING
RETURNING workflow_run_id;

-- name: insert_run_nodes
-- Every node of the new workflow run, WAITING on all its parents; returns the
-- roots (no parents), whose runs are created in the same transaction.
WITH ins AS (
    INSERT INTO workflow_run_nodes (partition_id, workflow_run_id, node, idx, state,
                                    pending_deps, updated_at)
    SELECT partition_id, %(wfr)s, node, idx, 'WAITING', cardinality(depends_on), %(now)s
      FROM workflow_nodes
     WHERE partition_id = %(p)s AND workflow_id = %(wf)s
    RETURNING node, pending_deps)
SELECT n.node, n.spec
  FROM ins JOIN workflow_nodes n
    ON n.partition_id = %(p)s AND n.workflow_id = %(wf)s AND n.node = ins.node
 WHERE ins.pending_deps = 0
 ORDER BY n.idx;

-- name: create_node_runs
-- Runs for nodes whose parents all succeeded: the run (ON CONFLICT DO NOTHING, its
-- id is hash(workflow_run_id, node)) and the node's move WAITING -> CREATED, in
-- one statement. Returns the runs that are new.
WITH ins AS (
    INSERT INTO runs_daily (partition_id, run_id, tenant_id, workflow_run_id, node,
                            scheduled_at, covers, priority, spec, created_at, updated_at)
    SELECT %(p)s, v.id, %(tenant_id)s, %(wfr)s, v.node, %(scheduled)s, %(covers)s::jsonb,
           %(priority)s, v.spec::jsonb, %(now)s, %(now)s
      FROM unnest(%(id)s::text[], %(node)s::text[], %(spec)s::text[]) AS v(id, node, spec)
    ON CONFLICT DO NOTHING
    RETURNING run_id, node)
UPDATE workflow_run_nodes r
   SET state = 'CREATED', run_id = ins.run_id, updated_at = %(now)s
  FROM ins
 WHERE r.partition_id = %(p)s AND r.workflow_run_id = %(wfr)s AND r.node = ins.node
   AND r.state = 'WAITING' AND r.pending_deps = 0
RETURNING r.node, r.run_id;

-- name: get_workflow_run
SELECT wr.*, w.name AS workflow_name
  FROM workflow_runs wr
  JOIN workflows w ON w.partition_id = wr.partition_id AND w.workflow_id = wr.workflow_id
 WHERE wr.partition_id = %(p)s AND wr.workflow_run_id = %(wfr)s AND wr.tenant_id = %(tenant_id)s;

-- name: workflow_run_state
SELECT state FROM workflow_runs
 WHERE partition_id = %(p)s AND workflow_run_id = %(wfr)s AND tenant_id = %(tenant_id)s;

-- name: run_nodes_view
-- Each node's state: its run's state once the run exists, else the node's own
-- (WAITING, SKIPPED or CANCELLED).
SELECT n.node, n.state AS node_state, n.pending_deps, n.run_id, r.state AS run_state,
       r.attempt, wn.depends_on
  FROM workflow_run_nodes n
  JOIN workflow_runs wr
    ON wr.partition_id = n.partition_id AND wr.workflow_run_id = n.workflow_run_id
  JOIN workflow_nodes wn
    ON wn.partition_id = n.partition_id AND wn.workflow_id = wr.workflow_id AND wn.node = n.node
  LEFT JOIN runs_daily r ON r.partition_id = n.partition_id AND r.run_id = n.run_id
                        AND r.scheduled_at = wr.scheduled_at
 WHERE n.partition_id = %(p)s AND n.workflow_run_id = %(wfr)s
 ORDER BY n.idx;

-- name: list_workflow_runs
SELECT wr.*, w.name AS workflow_name
  FROM workflow_runs wr
  JOIN workflows w ON w.partition_id = wr.partition_id AND w.workflow_id = wr.workflow_id
 WHERE wr.partition_id = %(p)s AND wr.workflow_id = %(wf)s AND wr.tenant_id = %(tenant_id)s
   AND (%(before_created)s::timestamptz IS NULL
        OR (wr.created_at, wr.workflow_run_id) < (%(before_created)s, %(before_id)s))
 ORDER BY wr.created_at DESC, wr.workflow_run_id DESC
 LIMIT %(limit)s;

-- name: lock_workflow_run
-- Every step of one workflow run (a node's completion, a cancel) locks its row
-- first, so steps of one workflow run apply one after the other.
SELECT workflow_id, tenant_id, state, priority, scheduled_at, covers
  FROM workflow_runs
 WHERE partition_id = %(p)s AND workflow_run_id = %(wfr)s
   FOR UPDATE;


-- name: begin_step
-- The first statement of a node's completion step: lock its workflow run, check
-- the record against the database, then record it as processed; `fresh` is
-- false for a second delivery.
-- Every step of one workflow run (completions, cancel) locks that row first, so
-- steps apply one after the other, the statements after this one see all that
-- came before, and a transaction applying several records in workflow run
-- order cannot deadlock with another doing the same.
-- The record is believed only where `runs_daily` agrees with it (`refused` NULL): the
-- run exists, is the record's tenant's, belongs to the record's workflow run and
-- node (and that workflow run to the same tenant), is at the record's attempt
-- and in the terminal state the record claims. Otherwise `refused` names the
-- first claim that is false and nothing is recorded, so the genuine completion
-- still applies when it comes. A terminal run never changes again, so what this
-- statement saw stays true for the rest of the transaction: no lock on the run.
-- `run_error` is the run's own error, which a failed node's step writes into the
-- workflow run rather than the record's.
-- The run is looked for in the days [lo, hi) (cronwheel/store/run_days.py; the
-- bounds pass through date_trunc as lifecycle.sql says why): those around the
-- record's finished_at first, then every day when that found no run.
WITH wr AS (
    SELECT workflow_id, tenant_id, state, priority, scheduled_at, covers
      FROM workflow_runs
     WHERE partition_id = %(p)s AND workflow_run_id = %(wfr)s
       FOR UPDATE),
verdict AS (
    SELECT CASE
               WHEN r.run_id IS NULL THEN 'no_run'
               WHEN r.tenant_id <> %(tenant_id)s THEN 'tenant'
               WHEN r.workflow_run_id IS DISTINCT FROM %(wfr)s
                    OR r.node IS DISTINCT FROM %(node)s
                    OR wr.workflow_id IS NULL THEN 'workflow_run'
               WHEN wr.tenant_id <> %(tenant_id)s THEN 'tenant'
               WHEN r.attempt <> %(attempt)s THEN 'attempt'
               WHEN r.state <> %(state)s::run_state THEN 'state'
           END AS refused,
           r.error
      FROM (SELECT 1) AS one
      LEFT JOIN wr ON true
      LEFT JOIN runs_daily r
        ON r.partition_id = %(p)s AND r.run_id = %(key)s
       AND r.scheduled_at >= date_trunc('day', %(lo)s::timestamptz, 'UTC')
       AND r.scheduled_at < date_trunc('day', %(hi)s::timestamptz, 'UTC')),
fresh AS (
    INSERT INTO processed (consumer, message_key, processed_at)
    SELECT %(consumer)s, %(key)s, %(now)s FROM verdict WHERE refused IS NULL
    ON CONFLICT DO NOTHING
    RETURNING 1)
SELECT verdict.refused, EXISTS (SELECT 1 FROM fresh) AS fresh, wr.workflow_id, wr.tenant_id,
       wr.state, wr.priority, wr.scheduled_at, wr.covers, verdict.error AS run_error
  FROM verdict
  LEFT JOIN wr ON true;

-- name: node_succeeded
-- The node's run SUCCEEDED: CREATED -> SUCCEEDED (only for the run this node
-- created), one node fewer left (the last makes the workflow run SUCCEEDED) and
-- one dependency fewer for each child still waiting. Returns a first row with
-- the workflow run's state, then the children that reached zero with the
-- template their runs snapshot; no row at all when the node was not waiting for
-- this run.
WITH fin AS (
    UPDATE workflow_run_nodes
       SET state = 'SUCCEEDED', updated_at = %(now)s
     WHERE partition_id = %(p)s AND workflow_run_id = %(wfr)s AND node = %(node)s
       AND run_id = %(run_id)s AND state = 'CREATED'
    RETURNING node),
counted AS (
    UPDATE workflow_runs
       SET nodes_left = nodes_left - 1,
           state = CASE WHEN nodes_left = 1 AND state = 'RUNNING' THEN 'SUCCEEDED' ELSE state END,
           finished_at = CASE WHEN nodes_left = 1 AND state = 'RUNNING' THEN %(now)s
                              ELSE finished_at END,
           updated_at = %(now)s
     WHERE partition_id = %(p)s AND workflow_run_id = %(wfr)s AND EXISTS (SELECT 1 FROM fin)
    RETURNING state),
released AS (
    UPDATE workflow_run_nodes r
       SET pending_deps = r.pending_deps - 1, updated_at = %(now)s
      FROM workflow_nodes n
     WHERE n.partition_id = %(p)s AND n.workflow_id = %(wf)s AND n.node = %(node)s
       AND r.partition_id = %(p)s AND r.workflow_run_id = %(wfr)s
       AND r.node = ANY (n.children) AND r.state = 'WAITING'
       AND EXISTS (SELECT 1 FROM fin)
    RETURNING r.node, r.pending_deps, r.idx)
SELECT state, NULL::text AS node, NULL::jsonb AS spec, -1 AS idx FROM counted
UNION ALL
SELECT NULL, released.node, wn.spec, released.idx
  FROM released
  JOIN workflow_nodes wn
    ON wn.partition_id = %(p)s AND wn.workflow_id = %(wf)s AND wn.node = released.node
 WHERE released.pending_deps = 0
 ORDER BY idx;

-- name: node_failed
-- The node's run ended FAILED, TIMED_OUT or CANCELLED (retries are over by the
-- time RunCompleted is written): the node takes that state, a RUNNING workflow
-- run becomes FAILED, and every node below it that has no run yet is SKIPPED (it
-- never will have one). Runs already created elsewhere in the graph go on.
-- Returns whether the node was waiting for this run, the workflow run's new
-- state (NULL when it had already ended) and the nodes skipped.
WITH RECURSIVE fin AS (
    UPDATE workflow_run_nodes
       SET state = %(state)s, updated_at = %(now)s
     WHERE partition_id = %(p)s AND workflow_run_id = %(wfr)s AND node = %(node)s
       AND run_id = %(run_id)s AND state = 'CREATED'
    RETURNING node),
failed AS (
    UPDATE workflow_runs
       SET state = 'FAILED', error = %(error)s, finished_at = %(now)s, updated_at = %(now)s
     WHERE partition_id = %(p)s AND workflow_run_id = %(wfr)s AND state = 'RUNNING'
       AND EXISTS (SELECT 1 FROM fin)
    RETURNING state),
below (node) AS (
    SELECT unnest(children) FROM workflow_nodes
     WHERE partition_id = %(p)s AND workflow_id = %(wf)s AND node = %(node)s
    UNION
    SELECT unnest(n.children) FROM workflow_nodes n JOIN below b
        ON n.partition_id = %(p)s AND n.workflow_id = %(wf)s AND n.node = b.node),
skipped AS (
    UPDATE workflow_run_nodes r
       SET state = 'SKIPPED', updated_at = %(now)s
      FROM below
     WHERE r.partition_id = %(p)s AND r.workflow_run_id = %(wfr)s AND r.node = below.node
       AND r.state = 'WAITING' AND EXISTS (SELECT 1 FROM fin)
    RETURNING r.node, r.idx)
SELECT EXISTS (SELECT 1 FROM fin), (SELECT state FROM failed),
       ARRAY(SELECT node FROM skipped ORDER BY idx);

-- name: cancel_workflow_run
UPDATE workflow_runs
   SET state = CASE WHEN state = 'RUNNING' THEN 'CANCELLED' ELSE state END,
       error = CASE WHEN state = 'RUNNING' THEN %(error)s ELSE error END,
       finished_at = COALESCE(finished_at, %(now)s), updated_at = %(now)s
 WHERE partition_id = %(p)s AND workflow_run_id = %(wfr)s
RETURNING state;

-- name: created_node_runs
SELECT node, run_id FROM workflow_run_nodes
 WHERE partition_id = %(p)s AND workflow_run_id = %(wfr)s AND state = 'CREATED'
 ORDER BY idx;

-- name: cancel_nodes
-- Nodes with no run yet, and nodes whose run the cancel just ended.
UPDATE workflow_run_nodes
   SET state = 'CANCELLED', updated_at = %(now)s
 WHERE partition_id = %(p)s AND workflow_run_id = %(wfr)s
   AND (state = 'WAITING' OR (state = 'CREATED' AND node = ANY (%(cancelled)s::text[])))
RETURNING node;
