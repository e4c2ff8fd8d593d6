-- No run waits forever (docs/pending-deadline.md): the `pending` timer kind's
-- statements over runs. cronwheel/store/pending.py is the only caller; the
-- sweep timers themselves are timers.sql's (arm_sweeps).

-- name: reannounce_overdue
-- PENDING runs of the swept partitions that no worker started by their
-- deadline, marked re-announced; their rows come back for new RunReady
-- records at the same attempt. The deadline counts from when the run last
-- became startable or was last announced (the greatest of its instant, its
-- last change of state -- a retry's return to PENDING -- and its last
-- re-announcement), and doubles with each re-announcement up to
-- 2^max_doublings times the class's deadline (%(deadline_ms)b, by rank, the
-- class looked up in %(classes)b as timers.CLASS_PARAMS does).
-- Fenced here: the runs are locked (SKIP LOCKED: a StartRun holding one is
-- starting it) and the UPDATE is conditional on PENDING again, so a run that
-- started before this statement is never announced again; one that starts
-- after it waits for this transaction and then starts as usual.
-- runs_daily_unfinished (partition_id, scheduled_at) WHERE finished_at IS NULL
-- serves the scan: only open runs whose instant is older than the shortest
-- deadline (%(oldest)s) are read, never a partition's history.
WITH overdue AS (
    SELECT r.partition_id, r.run_id, r.scheduled_at
      FROM runs_daily r
     WHERE r.partition_id = ANY(%(partitions)b::smallint[])
       AND r.finished_at IS NULL
       AND r.scheduled_at <= %(oldest)s
       AND r.state = 'PENDING'
       -- Not a tenant being moved in or out of this cell (migration 0022):
       -- its copied runs are another cell's to announce.
       AND NOT EXISTS (SELECT 1 FROM tenants h
                        WHERE h.tenant_id = r.tenant_id AND h.state <> 'active')
       AND greatest(r.scheduled_at, r.updated_at, r.last_reannounced_at)
           + make_interval(secs => (%(deadline_ms)b::int8[])[
                 coalesce(array_position(%(classes)b::text[], r.priority), %(normal_rank)s + 1)]
               * power(2, least(coalesce(r.reannounced, 0), %(max_doublings)s)) / 1000.0)
           <= %(now)s
     ORDER BY r.scheduled_at
     LIMIT %(limit)s
       FOR UPDATE OF r SKIP LOCKED)
UPDATE runs_daily r
   SET reannounced = coalesce(r.reannounced, 0) + 1, last_reannounced_at = %(now)s
  FROM overdue o
 WHERE r.partition_id = o.partition_id AND r.run_id = o.run_id
   AND r.scheduled_at = o.scheduled_at AND r.state = 'PENDING'
RETURNING r.partition_id, r.run_id, r.tenant_id, r.attempt, r.spec, r.job_id,
          r.workflow_run_id, r.node, r.scheduled_at, r.priority, r.covers;

-- name: forget_forwarded
-- The dispatcher skips a (run_id, attempt) it has recorded as forwarded
-- (cronwheel/store/dispatch.py, message_key): the record a run was re-announced
-- for may be the one it forwarded and a worker then lost, so that mark goes
-- with the re-announcement, in its transaction. A record of the first
-- announcement still unread is forwarded as well: a duplicate on a queue
-- topic, which StartRun answers ALREADY_STARTED.
DELETE FROM processed
 WHERE consumer = %(consumer)s AND message_key = ANY(%(keys)b::text[]);
