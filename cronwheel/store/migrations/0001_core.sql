-- The core store: tenants, keys, jobs, the one timers table, runs, the outbox,
-- and partition leases. Every row that changes with a job's life carries
-- partition_id = hash(owner) mod 1024 so each state change is one partition.

CREATE TABLE tenants (
    tenant_id        text PRIMARY KEY,
    name             text NOT NULL UNIQUE,
    cell             text NOT NULL DEFAULT 'local',
    priority_classes text[] NOT NULL DEFAULT '{high,normal,low}',
    created_at       timestamptz NOT NULL DEFAULT now()
);

-- Keys are stored only as SHA-256 of the secret; tenant_id NULL is never used:
-- the operator key comes from the environment, not from this table.
CREATE TABLE api_keys (
    key_id      text PRIMARY KEY,
    tenant_id   text NOT NULL REFERENCES tenants (tenant_id) ON DELETE CASCADE,
    key_hash    bytea NOT NULL UNIQUE,
    created_at  timestamptz NOT NULL DEFAULT now(),
    revoked_at  timestamptz
);

CREATE TABLE jobs (
    partition_id  smallint NOT NULL CHECK (partition_id BETWEEN 0 AND 1023),
    job_id        text NOT NULL,
    tenant_id     text NOT NULL REFERENCES tenants (tenant_id),
    name          text NOT NULL,
    schedule      jsonb NOT NULL,
    target        jsonb NOT NULL,
    payload       text NOT NULL DEFAULT 'null',
    priority      text NOT NULL DEFAULT 'normal'
                  CHECK (priority IN ('critical', 'high', 'normal', 'low')),
    retry         jsonb NOT NULL,
    timeout_ms    integer CHECK (timeout_ms > 0),
    lease_ms      integer NOT NULL DEFAULT 30000 CHECK (lease_ms > 0),
    overlap       text NOT NULL DEFAULT 'allow' CHECK (overlap IN ('allow', 'skip', 'buffer_one')),
    catchup       jsonb NOT NULL,
    jitter_ms     integer NOT NULL DEFAULT 0 CHECK (jitter_ms >= 0),
    paused        boolean NOT NULL DEFAULT false,
    version       integer NOT NULL DEFAULT 1,
    -- every_ms schedules fire at anchor_at + k * every_ms.
    anchor_at     timestamptz NOT NULL,
    -- The last scheduled instant the timer handled (fired or skipped): where the
    -- next instant is computed from, and what catch-up counts missed instants from.
    last_instant  timestamptz,
    missed_count  bigint NOT NULL DEFAULT 0,
    fired_count   bigint NOT NULL DEFAULT 0,
    overlap_skipped bigint NOT NULL DEFAULT 0,
    -- overlap=buffer_one: an instant that arrived while a run was active.
    buffered_at   timestamptz,
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    deleted_at    timestamptz,
    PRIMARY KEY (partition_id, job_id)
);
CREATE INDEX jobs_tenant ON jobs (tenant_id, created_at, job_id) WHERE deleted_at IS NULL;

-- Every time-driven event goes through this one table and one firing loop.
-- priority: 0 critical, 1 high, 2 normal, 3 low (claimed in that order).
CREATE TABLE timers (
    partition_id smallint NOT NULL CHECK (partition_id BETWEEN 0 AND 1023),
    timer_id     text NOT NULL,
    kind         text NOT NULL CHECK (kind IN ('job', 'retry', 'lease', 'timeout', 'workflow')),
    owner_id     text NOT NULL,
    due_at       timestamptz NOT NULL,
    priority     smallint NOT NULL DEFAULT 2 CHECK (priority BETWEEN 0 AND 3),
    -- For lease/timeout/retry timers: the attempt they belong to, so a timer of
    -- an attempt that already ended changes nothing.
    attempt      integer,
    PRIMARY KEY (partition_id, timer_id)
);
CREATE INDEX timers_due ON timers (priority, due_at);

CREATE TYPE run_state AS ENUM (
    'PENDING', 'RUNNING', 'RETRY_WAIT',
    'SUCCEEDED', 'FAILED', 'TIMED_OUT', 'CANCELLED', 'SKIPPED'
);

CREATE TABLE runs (
    partition_id     smallint NOT NULL CHECK (partition_id BETWEEN 0 AND 1023),
    run_id           text NOT NULL,
    tenant_id        text NOT NULL,
    job_id           text,
    workflow_run_id  text,
    node             text,
    scheduled_at     timestamptz NOT NULL,
    -- catch-up policy `latest`: the instants (UTC ms) this one run stands for.
    covers           jsonb,
    priority         text NOT NULL DEFAULT 'normal',
    -- A snapshot of what to run (target, payload, retry, timeout_ms, lease_ms):
    -- an edit of the job does not change a run already created.
    spec             jsonb NOT NULL,
    state            run_state NOT NULL DEFAULT 'PENDING',
    attempt          integer NOT NULL DEFAULT 1 CHECK (attempt >= 1),
    start_token      text,
    worker_id        text,
    lease_expires_at timestamptz,
    result           jsonb,
    error            text,
    created_at       timestamptz NOT NULL DEFAULT now(),
    started_at       timestamptz,
    finished_at      timestamptz,
    updated_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (partition_id, run_id),
    CONSTRAINT finished_iff_terminal CHECK (
        (state IN ('SUCCEEDED', 'FAILED', 'TIMED_OUT', 'CANCELLED', 'SKIPPED'))
        = (finished_at IS NOT NULL)),
    CONSTRAINT running_has_token CHECK (
        state <> 'RUNNING' OR (start_token IS NOT NULL AND lease_expires_at IS NOT NULL))
);
CREATE UNIQUE INDEX runs_run_id ON runs (run_id);
CREATE INDEX runs_tenant_created ON runs (tenant_id, created_at DESC, run_id DESC);
CREATE INDEX runs_job ON runs (job_id, scheduled_at DESC) WHERE job_id IS NOT NULL;
CREATE INDEX runs_active_job ON runs (job_id)
    WHERE state IN ('PENDING', 'RUNNING', 'RETRY_WAIT') AND job_id IS NOT NULL;

-- The history of a run's attempts, one row per StartRun that won.
CREATE TABLE run_attempts (
    partition_id smallint NOT NULL,
    run_id       text NOT NULL,
    attempt      integer NOT NULL,
    worker_id    text,
    started_at   timestamptz NOT NULL,
    finished_at  timestamptz,
    outcome      text,
    error        text,
    PRIMARY KEY (partition_id, run_id, attempt),
    FOREIGN KEY (partition_id, run_id) REFERENCES runs (partition_id, run_id) ON DELETE CASCADE
);

-- Written in the same transaction as the state change it announces; the relay
-- publishes and then deletes. It keeps no cursor, so a row that commits late is
-- simply read on a later pass: nothing is skipped.
CREATE TABLE outbox (
    id           bigint GENERATED ALWAYS AS IDENTITY,
    partition_id smallint NOT NULL CHECK (partition_id BETWEEN 0 AND 1023),
    topic        text NOT NULL,
    key          bytea,
    value        bytea NOT NULL,
    headers      jsonb,
    created_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (id)
);
CREATE INDEX outbox_partition ON outbox (partition_id, id);

-- Which instance of a service owns which partitions. The epoch rises on every
-- change of owner; writers check (owner, epoch) in their transaction, so a
-- paused or partitioned former owner is fenced out.
CREATE TABLE partition_leases (
    service      text NOT NULL,
    partition_id smallint NOT NULL CHECK (partition_id BETWEEN 0 AND 1023),
    owner        text,
    epoch        bigint NOT NULL DEFAULT 0,
    expires_at   timestamptz NOT NULL DEFAULT '-infinity',
    PRIMARY KEY (service, partition_id)
);

-- Idempotent consumers record what they processed in the same transaction as
-- the effect (the dispatcher: run_id + attempt; the workflow service: run_id).
CREATE TABLE processed (
    consumer     text NOT NULL,
    message_key  text NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, message_key)
);

-- Instances that want partitions, so a newcomer with none yet is counted when
-- the others size their share.
CREATE TABLE lease_members (
    service    text NOT NULL,
    instance   text NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (service, instance)
);
