-- Workflows: static DAGs of job templates with success-only edges, and their
-- runs. Every row carries partition_id = hash(workflow_id) mod 1024, and so do
-- the node runs (run_id_for_node), so creating a workflow run, completing a node
-- and creating its children are each one single-partition transaction.

CREATE TABLE workflows (
    partition_id    smallint NOT NULL CHECK (partition_id BETWEEN 0 AND 1023),
    workflow_id     text NOT NULL,
    tenant_id       text NOT NULL REFERENCES tenants (tenant_id),
    name            text NOT NULL,
    priority        text NOT NULL DEFAULT 'normal'
                    CHECK (priority IN ('critical', 'high', 'normal', 'low')),
    -- The API's limit (500, cronwheel.core.workflows.MAX_NODES) is policy, kept
    -- in the code so that it can change without a migration.
    node_count      integer NOT NULL CHECK (node_count >= 1),
    -- The schedule proper (cron/timezone/dst, every_ms or at); NULL: trigger only.
    schedule        jsonb,
    overlap         text NOT NULL DEFAULT 'allow' CHECK (overlap IN ('allow', 'skip', 'buffer_one')),
    catchup         jsonb NOT NULL,
    jitter_ms       integer NOT NULL DEFAULT 0 CHECK (jitter_ms >= 0),
    paused          boolean NOT NULL DEFAULT false,
    version         integer NOT NULL DEFAULT 1,
    -- As for jobs: every_ms counts from anchor_at; last_instant is the last
    -- scheduled instant the timer handled (fired, skipped or missed).
    anchor_at       timestamptz NOT NULL,
    last_instant    timestamptz NOT NULL,
    missed_count    bigint NOT NULL DEFAULT 0,
    fired_count     bigint NOT NULL DEFAULT 0,
    overlap_skipped bigint NOT NULL DEFAULT 0,
    -- overlap=buffer_one: an instant that came while a workflow run was active.
    buffered_at     timestamptz,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    deleted_at      timestamptz,
    PRIMARY KEY (partition_id, workflow_id)
);
CREATE INDEX workflows_tenant ON workflows (tenant_id, created_at, workflow_id)
    WHERE deleted_at IS NULL;

-- The graph, one row per node: the job template its runs snapshot (`spec`: target,
-- payload, retry, timeout_ms, lease_ms) and its edges in both directions. Immutable
-- once written: a workflow's graph never changes under its running workflow runs.
CREATE TABLE workflow_nodes (
    partition_id smallint NOT NULL,
    workflow_id  text NOT NULL,
    node         text NOT NULL,
    idx          integer NOT NULL,
    spec         jsonb NOT NULL,
    depends_on   text[] NOT NULL DEFAULT '{}',
    children     text[] NOT NULL DEFAULT '{}',
    PRIMARY KEY (partition_id, workflow_id, node),
    FOREIGN KEY (partition_id, workflow_id) REFERENCES workflows (partition_id, workflow_id)
);

-- One row per firing or trigger of a workflow. RUNNING until every node
-- succeeded (SUCCEEDED), a node failed after its retries (FAILED) or it was
-- cancelled (CANCELLED). nodes_left counts the nodes not yet SUCCEEDED.
CREATE TABLE workflow_runs (
    partition_id    smallint NOT NULL CHECK (partition_id BETWEEN 0 AND 1023),
    workflow_run_id text NOT NULL,
    workflow_id     text NOT NULL,
    tenant_id       text NOT NULL,
    trigger         text NOT NULL CHECK (trigger IN ('schedule', 'manual')),
    scheduled_at    timestamptz NOT NULL,
    covers          jsonb,
    priority        text NOT NULL,
    state           text NOT NULL DEFAULT 'RUNNING'
                    CHECK (state IN ('RUNNING', 'SUCCEEDED', 'FAILED', 'CANCELLED')),
    nodes_left      integer NOT NULL CHECK (nodes_left >= 0),
    error           text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    finished_at     timestamptz,
    PRIMARY KEY (partition_id, workflow_run_id),
    FOREIGN KEY (partition_id, workflow_id) REFERENCES workflows (partition_id, workflow_id),
    CONSTRAINT workflow_finished_iff_terminal CHECK ((state <> 'RUNNING') = (finished_at IS NOT NULL)),
    CONSTRAINT workflow_succeeded_all_nodes CHECK (state <> 'SUCCEEDED' OR nodes_left = 0)
);
CREATE INDEX workflow_runs_workflow ON workflow_runs (workflow_id, created_at DESC, workflow_run_id DESC);
CREATE INDEX workflow_runs_active ON workflow_runs (workflow_id) WHERE state = 'RUNNING';

-- Per node of a workflow run: WAITING (parents not all succeeded; no run yet),
-- CREATED (its run exists: the run's own state says how far it got), then the
-- run's terminal state once the workflow service processed its RunCompleted, or
-- SKIPPED (below a failed node) / CANCELLED (the workflow run was cancelled)
-- without a run ever being created. pending_deps counts parents not yet
-- SUCCEEDED; a run exists only once it is zero.
CREATE TABLE workflow_run_nodes (
    partition_id    smallint NOT NULL,
    workflow_run_id text NOT NULL,
    node            text NOT NULL,
    idx             integer NOT NULL,
    state           text NOT NULL DEFAULT 'WAITING'
                    CHECK (state IN ('WAITING', 'CREATED', 'SUCCEEDED', 'FAILED', 'TIMED_OUT',
                                     'CANCELLED', 'SKIPPED')),
    pending_deps    integer NOT NULL CHECK (pending_deps >= 0),
    run_id          text,
    updated_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (partition_id, workflow_run_id, node),
    FOREIGN KEY (partition_id, workflow_run_id)
        REFERENCES workflow_runs (partition_id, workflow_run_id),
    CONSTRAINT node_run_after_all_parents CHECK (run_id IS NULL OR pending_deps = 0),
    CONSTRAINT node_run_iff_started CHECK (
        (state IN ('WAITING', 'SKIPPED') AND run_id IS NULL)
        OR (state IN ('CREATED', 'SUCCEEDED', 'FAILED', 'TIMED_OUT') AND run_id IS NOT NULL)
        OR state = 'CANCELLED')
);

-- No new index on `runs`: building one would lock that hot table inside this
-- migration's transaction. A workflow run's node runs are found through
-- workflow_run_nodes.run_id, or by (partition_id, workflow_run_id) with the
-- partition read from the workflow run id (partition_of_workflow_run).

-- Row-level security, as 0002 set it up for the core tables: a gateway
-- transaction scoped to a tenant sees only that tenant's workflows; services
-- that never set the scope see every row.
ALTER TABLE workflows ENABLE ROW LEVEL SECURITY;
ALTER TABLE workflows FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_scope ON workflows
    USING (cronwheel_tenant_scope() IS NULL OR tenant_id = cronwheel_tenant_scope());

ALTER TABLE workflow_runs ENABLE ROW LEVEL SECURITY;
ALTER TABLE workflow_runs FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_scope ON workflow_runs
    USING (cronwheel_tenant_scope() IS NULL OR tenant_id = cronwheel_tenant_scope());

ALTER TABLE workflow_nodes ENABLE ROW LEVEL SECURITY;
ALTER TABLE workflow_nodes FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_scope ON workflow_nodes
    USING (cronwheel_tenant_scope() IS NULL OR EXISTS (
        SELECT 1 FROM workflows w
         WHERE w.partition_id = workflow_nodes.partition_id
           AND w.workflow_id = workflow_nodes.workflow_id
           AND w.tenant_id = cronwheel_tenant_scope()));

ALTER TABLE workflow_run_nodes ENABLE ROW LEVEL SECURITY;
ALTER TABLE workflow_run_nodes FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_scope ON workflow_run_nodes
    USING (cronwheel_tenant_scope() IS NULL OR EXISTS (
        SELECT 1 FROM workflow_runs r
         WHERE r.partition_id = workflow_run_nodes.partition_id
           AND r.workflow_run_id = workflow_run_nodes.workflow_run_id
           AND r.tenant_id = cronwheel_tenant_scope()));

-- 0002 lets `workflow` timers pass until this migration: from here a scoped
-- transaction sees a workflow's timer only when it sees the workflow. A
-- restrictive policy is ANDed with 0002's, so that one stays as it is.
CREATE POLICY workflow_owner ON timers AS RESTRICTIVE
    USING (cronwheel_tenant_scope() IS NULL OR kind <> 'workflow' OR EXISTS (
        SELECT 1 FROM workflows w
         WHERE w.partition_id = timers.partition_id AND w.workflow_id = timers.owner_id
           AND w.tenant_id = cronwheel_tenant_scope()));
