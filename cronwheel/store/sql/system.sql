-- The platform's health as the operator reads it (GET /v1/system,
-- cronwheel/store/system.py the only caller). Every statement is bounded: by
-- the size of a platform table that does not grow with the tenants' work
-- (partition_leases: 1024 rows per service), or by a LIMIT on an index scan
-- (%(cap)s rows at most), so a backlog of millions costs what 100,000 rows
-- cost and says "at least" (bench/bench_system.py measures them on 100k+
-- runs).

-- name: time_limit
-- A safety net under the bounds below: no figure holds the operator's
-- connection (and the locks a statement takes) for longer than this.
SET LOCAL statement_timeout = '5s';

-- name: lease_services
-- Each service that takes partition leases (timer, relay, and the consumers
-- leasing tenants' topics, named by their group: `<prefix>.dispatcher`, ...):
-- of its 1024 partitions, how many an instance holds now; how many distinct
-- instances hold them or announced themselves (lease_members, renewed at each
-- tick); and when the newest lease runs out. A service that stopped keeps
-- its rows with leases in the past: seen, and not ready.
SELECT l.service,
       count(*) AS partitions,
       count(*) FILTER (WHERE l.expires_at > %(now)s) AS leased,
       count(DISTINCT l.owner) FILTER (WHERE l.expires_at > %(now)s) AS owners,
       max(l.expires_at) AS lease_until,
       (SELECT count(*) FROM lease_members m
         WHERE m.service = l.service AND m.expires_at > %(now)s) AS members,
       (SELECT max(m.expires_at) FROM lease_members m
         WHERE m.service = l.service) AS member_until
  FROM partition_leases l
 GROUP BY l.service
 ORDER BY l.service;

-- name: outbox_backlog
-- The relay's backlog: outbox rows it may publish now (`ready`) and rows a
-- timer fired ahead of their instant that it holds until then (`held`), among
-- the oldest %(cap)s rows by id (outbox_pkey: ids are handed out as rows are
-- written, so the first ids are the oldest rows). `scanned` = %(cap)s means
-- there are at least that many.
SELECT count(*) AS scanned,
       count(*) FILTER (WHERE o.not_before IS NULL OR o.not_before <= %(now)s) AS ready,
       count(*) FILTER (WHERE o.not_before > %(now)s) AS held,
       min(o.created_at) FILTER (WHERE o.not_before IS NULL OR o.not_before <= %(now)s)
           AS oldest_ready_at
  FROM (SELECT created_at, not_before FROM outbox ORDER BY id LIMIT %(cap)s) o;

-- name: overdue_timers
-- Timers due before %(before)s and still there: the firing loop is behind, or
-- no timer instance leases their partitions. A healthy timer claims a timer
-- within milliseconds of its due time (ahead of it, for jobs). timers_due
-- (priority, due_at) serves it as one range scan per class.
SELECT count(*) AS scanned, min(t.due_at) AS oldest_due_at
  FROM (SELECT due_at FROM timers
         WHERE priority IN (0, 1, 2, 3) AND due_at < %(before)s
         LIMIT %(cap)s) t;

-- name: lateness
-- Lateness of the runs of jobs whose scheduled instant lies in
-- [%(since)s, %(now)s]: fired = the run's creation (the firing transaction's
-- instant) less its instant, 0 for a run created ahead of it (the timer fires
-- up to CRONWHEEL_FIRE_AHEAD_MS early and the relay holds the record until
-- the instant); started = a first attempt's StartRun less the instant (the
-- worker's pickup included). Workflow nodes are left out: a node's instant is
-- its workflow run's, and it waits for its parents by design.
-- Read per tenant through runs_daily_tenant_created (tenant_id, created_at): a run
-- of an instant in the window was created at most a minute before the window
-- opened (firing ahead is 1 s by default). Bounded to a sample of about
-- %(sample)s runs: each tenant's newest runs, an equal share each (at least
-- %(min_share)s), so a busy platform costs what a quiet one does and every
-- tenant is in it; `sampled` says a tenant had more than its share.
WITH share AS (
    SELECT greatest(%(min_share)s, %(sample)s / greatest(1, count(*))) AS n FROM tenants
), recent AS (
    SELECT r.scheduled_at, r.created_at, r.started_at, r.attempt, r.nth, share.n
      FROM share, tenants t
     CROSS JOIN LATERAL (
           SELECT x.scheduled_at, x.created_at, x.started_at, x.attempt,
                  row_number() OVER (ORDER BY x.created_at DESC) AS nth
             FROM runs_daily x
            WHERE x.tenant_id = t.tenant_id
              AND x.created_at >= %(since)s - interval '1 minute'
              AND x.job_id IS NOT NULL
              AND x.scheduled_at >= %(since)s AND x.scheduled_at <= %(now)s
            ORDER BY x.created_at DESC
            LIMIT (SELECT n FROM share) + 1) r
), ms AS (
    -- A tenant's run past its share (the one more the LIMIT lets through)
    -- only says that it was sampled.
    SELECT greatest(0, (extract(epoch FROM created_at - scheduled_at) * 1000)::bigint) AS fired,
           CASE WHEN attempt = 1 AND started_at IS NOT NULL
                THEN (extract(epoch FROM started_at - scheduled_at) * 1000)::bigint END AS started,
           nth > n AS over
      FROM recent
)
SELECT count(*) FILTER (WHERE NOT over) AS runs,
       percentile_disc(0.5) WITHIN GROUP (ORDER BY fired) FILTER (WHERE NOT over) AS fired_p50_ms,
       percentile_disc(0.99) WITHIN GROUP (ORDER BY fired) FILTER (WHERE NOT over) AS fired_p99_ms,
       max(fired) FILTER (WHERE NOT over) AS fired_max_ms,
       count(started) FILTER (WHERE NOT over) AS started,
       percentile_disc(0.5) WITHIN GROUP (ORDER BY started) FILTER (WHERE NOT over)
           AS started_p50_ms,
       percentile_disc(0.99) WITHIN GROUP (ORDER BY started) FILTER (WHERE NOT over)
           AS started_p99_ms,
       max(started) FILTER (WHERE NOT over) AS started_max_ms,
       coalesce(bool_or(over), false) AS sampled
  FROM ms;

-- name: open_runs
-- Runs not finished, by state, and the PENDING ones the pending-deadline
-- sweep announced again because no worker started them by their deadline
-- (docs/pending-deadline.md): still waiting, and announced again since
-- %(since)s. runs_daily_unfinished (WHERE finished_at IS NULL) serves it; at most
-- %(cap)s open runs are read.
SELECT count(*) AS scanned,
       count(*) FILTER (WHERE o.state = 'PENDING') AS pending,
       count(*) FILTER (WHERE o.state = 'RUNNING') AS running,
       count(*) FILTER (WHERE o.state = 'RETRY_WAIT') AS retry_wait,
       count(*) FILTER (WHERE o.state = 'PENDING' AND o.reannounced IS NOT NULL)
           AS reannounced_waiting,
       count(*) FILTER (WHERE o.last_reannounced_at >= %(since)s) AS reannounced_recently,
       max(o.last_reannounced_at) AS last_reannounced_at
  FROM (SELECT state, reannounced, last_reannounced_at FROM runs_daily
         WHERE finished_at IS NULL
         ORDER BY partition_id, scheduled_at  -- runs_daily_unfinished's order: never a table scan
         LIMIT %(cap)s) o;
