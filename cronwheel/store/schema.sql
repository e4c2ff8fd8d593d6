-- cronwheel's whole database schema: what every migration, applied in order,
-- makes of an empty database (tests/integration/test_schema_snapshot.py checks it).
-- Generated: do not edit. After adding a migration run `make schema`
-- (`cronwheel migrate --dump-schema`) and commit this file with it, and run
-- `make check-migrations` (squawk: docs/migrations.md, The migration lint).
-- pg_dump --schema-only --no-owner of PostgreSQL 15, session settings removed.

--
-- Name: run_state; Type: TYPE; Schema: public
--

CREATE TYPE public.run_state AS ENUM (
    'PENDING',
    'RUNNING',
    'RETRY_WAIT',
    'SUCCEEDED',
    'FAILED',
    'TIMED_OUT',
    'CANCELLED',
    'SKIPPED'
);

--
-- Name: cronwheel_authenticate(bytea); Type: FUNCTION; Schema: public
--

CREATE FUNCTION public.cronwheel_authenticate(key_hash bytea) RETURNS TABLE(tenant_id text, name text, cell text, priority_classes text[])
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'public'
    AS $$
DECLARE
    k record;
BEGIN
    SELECT t.tenant_id, t.name, t.cell, t.priority_classes INTO k
      FROM public.api_keys a JOIN public.tenants t ON t.tenant_id = a.tenant_id
     WHERE a.key_hash = cronwheel_authenticate.key_hash AND a.revoked_at IS NULL;
    IF NOT FOUND THEN
        PERFORM set_config('cronwheel.tenant_id', '!none', true);
        RETURN;
    END IF;
    PERFORM set_config('cronwheel.tenant_id', k.tenant_id, true);
    tenant_id := k.tenant_id;
    name := k.name;
    cell := k.cell;
    priority_classes := k.priority_classes;
    RETURN NEXT;
END $$;

--
-- Name: cronwheel_notify_destination(); Type: FUNCTION; Schema: public
--

CREATE FUNCTION public.cronwheel_notify_destination() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    PERFORM pg_notify(
        'cw_destinations',
        NEW.tenant_id || ':' || (NEW.target->>'type') || ':' || coalesce(NEW.target->>'queue', ''));
    RETURN NULL;
END
$$;

--
-- Name: cronwheel_notify_tenant(); Type: FUNCTION; Schema: public
--

CREATE FUNCTION public.cronwheel_notify_tenant() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    PERFORM pg_notify('cw_tenants', NEW.tenant_id);
    RETURN NULL;
END
$$;

--
-- Name: cronwheel_tenant_scope(); Type: FUNCTION; Schema: public
--

CREATE FUNCTION public.cronwheel_tenant_scope() RETURNS text
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$ SELECT NULLIF(current_setting('cronwheel.tenant_id', true), '') $$;

--
-- Name: api_keys; Type: TABLE; Schema: public
--

CREATE TABLE public.api_keys (
    key_id text NOT NULL,
    tenant_id text NOT NULL,
    key_hash bytea NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    revoked_at timestamp with time zone,
    label text
);

--
-- Name: backfills; Type: TABLE; Schema: public
--

CREATE TABLE public.backfills (
    name text NOT NULL,
    after_partition_id smallint,
    after_run_id text,
    visited bigint DEFAULT 0 NOT NULL,
    copied bigint DEFAULT 0 NOT NULL,
    copied_attempts bigint DEFAULT 0 NOT NULL,
    total bigint,
    started_at timestamp with time zone,
    updated_at timestamp with time zone,
    finished_at timestamp with time zone
);

--
-- Name: idempotency_keys; Type: TABLE; Schema: public
--

CREATE TABLE public.idempotency_keys (
    scope text NOT NULL,
    key text NOT NULL,
    fingerprint bytea NOT NULL,
    status smallint,
    body text,
    created_at timestamp with time zone DEFAULT now() NOT NULL
);

--
-- Name: jobs; Type: TABLE; Schema: public
--

CREATE TABLE public.jobs (
    partition_id smallint NOT NULL,
    job_id text NOT NULL,
    tenant_id text NOT NULL,
    name text NOT NULL,
    schedule jsonb NOT NULL,
    target jsonb NOT NULL,
    payload text DEFAULT 'null'::text NOT NULL,
    priority text DEFAULT 'normal'::text NOT NULL,
    retry jsonb NOT NULL,
    timeout_ms integer,
    lease_ms integer DEFAULT 30000 NOT NULL,
    overlap text DEFAULT 'allow'::text NOT NULL,
    catchup jsonb NOT NULL,
    jitter_ms integer DEFAULT 0 NOT NULL,
    paused boolean DEFAULT false NOT NULL,
    version integer DEFAULT 1 NOT NULL,
    anchor_at timestamp with time zone NOT NULL,
    last_instant timestamp with time zone,
    missed_count bigint DEFAULT 0 NOT NULL,
    fired_count bigint DEFAULT 0 NOT NULL,
    overlap_skipped bigint DEFAULT 0 NOT NULL,
    buffered_at timestamp with time zone,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    deleted_at timestamp with time zone,
    CONSTRAINT jobs_jitter_ms_check CHECK ((jitter_ms >= 0)),
    CONSTRAINT jobs_lease_ms_check CHECK ((lease_ms > 0)),
    CONSTRAINT jobs_overlap_check CHECK ((overlap = ANY (ARRAY['allow'::text, 'skip'::text, 'buffer_one'::text]))),
    CONSTRAINT jobs_partition_id_check CHECK (((partition_id >= 0) AND (partition_id <= 1023))),
    CONSTRAINT jobs_priority_check CHECK ((priority = ANY (ARRAY['critical'::text, 'high'::text, 'normal'::text, 'low'::text]))),
    CONSTRAINT jobs_timeout_ms_check CHECK ((timeout_ms > 0))
)
WITH (fillfactor='75', autovacuum_analyze_threshold='50000');

--
-- Name: lease_members; Type: TABLE; Schema: public
--

CREATE TABLE public.lease_members (
    service text NOT NULL,
    instance text NOT NULL,
    expires_at timestamp with time zone NOT NULL
);

--
-- Name: outbox; Type: TABLE; Schema: public
--

CREATE TABLE public.outbox (
    id bigint NOT NULL,
    partition_id smallint NOT NULL,
    topic text NOT NULL,
    key bytea,
    value bytea NOT NULL,
    headers jsonb,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    priority smallint DEFAULT 2 NOT NULL,
    not_before timestamp with time zone,
    CONSTRAINT outbox_partition_id_check CHECK (((partition_id >= 0) AND (partition_id <= 1023))),
    CONSTRAINT outbox_priority_check CHECK (((priority >= 0) AND (priority <= 3)))
)
WITH (autovacuum_vacuum_scale_factor='0', autovacuum_vacuum_threshold='2000', autovacuum_vacuum_insert_scale_factor='0', autovacuum_vacuum_insert_threshold='2000', autovacuum_vacuum_cost_delay='0', autovacuum_analyze_threshold='50000');

--
-- Name: outbox_id_seq; Type: SEQUENCE; Schema: public
--

ALTER TABLE public.outbox ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.outbox_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

--
-- Name: partition_leases; Type: TABLE; Schema: public
--

CREATE TABLE public.partition_leases (
    service text NOT NULL,
    partition_id smallint NOT NULL,
    owner text,
    epoch bigint DEFAULT 0 NOT NULL,
    expires_at timestamp with time zone DEFAULT '-infinity'::timestamp with time zone NOT NULL,
    CONSTRAINT partition_leases_partition_id_check CHECK (((partition_id >= 0) AND (partition_id <= 1023)))
)
WITH (autovacuum_analyze_threshold='50000');

--
-- Name: processed; Type: TABLE; Schema: public
--

CREATE TABLE public.processed (
    consumer text NOT NULL,
    message_key text NOT NULL,
    processed_at timestamp with time zone DEFAULT now() NOT NULL
);

--
-- Name: run_attempts_daily; Type: TABLE; Schema: public
--

CREATE TABLE public.run_attempts_daily (
    partition_id smallint NOT NULL,
    run_id text NOT NULL,
    attempt integer NOT NULL,
    worker_id text,
    started_at timestamp with time zone NOT NULL,
    finished_at timestamp with time zone,
    outcome text,
    error text,
    scheduled_at timestamp with time zone NOT NULL,
    tenant_id text NOT NULL
)
PARTITION BY RANGE (scheduled_at);

--
-- Name: run_attempts_daily_default; Type: TABLE; Schema: public
--

CREATE TABLE public.run_attempts_daily_default (
    partition_id smallint NOT NULL,
    run_id text NOT NULL,
    attempt integer NOT NULL,
    worker_id text,
    started_at timestamp with time zone NOT NULL,
    finished_at timestamp with time zone,
    outcome text,
    error text,
    scheduled_at timestamp with time zone NOT NULL,
    tenant_id text NOT NULL
);

--
-- Name: runs_daily; Type: TABLE; Schema: public
--

CREATE TABLE public.runs_daily (
    partition_id smallint NOT NULL,
    run_id text NOT NULL,
    tenant_id text NOT NULL,
    job_id text,
    workflow_run_id text,
    node text,
    scheduled_at timestamp with time zone NOT NULL,
    covers jsonb,
    priority text DEFAULT 'normal'::text NOT NULL,
    spec jsonb NOT NULL,
    state public.run_state DEFAULT 'PENDING'::public.run_state NOT NULL,
    attempt integer DEFAULT 1 NOT NULL,
    start_token text,
    worker_id text,
    lease_expires_at timestamp with time zone,
    result jsonb,
    error text,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    started_at timestamp with time zone,
    finished_at timestamp with time zone,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    reannounced integer,
    last_reannounced_at timestamp with time zone,
    CONSTRAINT finished_iff_terminal CHECK (((state = ANY (ARRAY['SUCCEEDED'::public.run_state, 'FAILED'::public.run_state, 'TIMED_OUT'::public.run_state, 'CANCELLED'::public.run_state, 'SKIPPED'::public.run_state])) = (finished_at IS NOT NULL))),
    CONSTRAINT running_has_token CHECK (((state <> 'RUNNING'::public.run_state) OR ((start_token IS NOT NULL) AND (lease_expires_at IS NOT NULL)))),
    CONSTRAINT runs_attempt_check CHECK ((attempt >= 1)),
    CONSTRAINT runs_partition_id_check CHECK (((partition_id >= 0) AND (partition_id <= 1023))),
    CONSTRAINT runs_reannounced_check CHECK ((reannounced >= 1))
)
PARTITION BY RANGE (scheduled_at);

--
-- Name: runs_daily_default; Type: TABLE; Schema: public
--

CREATE TABLE public.runs_daily_default (
    partition_id smallint NOT NULL,
    run_id text NOT NULL,
    tenant_id text NOT NULL,
    job_id text,
    workflow_run_id text,
    node text,
    scheduled_at timestamp with time zone NOT NULL,
    covers jsonb,
    priority text DEFAULT 'normal'::text NOT NULL,
    spec jsonb NOT NULL,
    state public.run_state DEFAULT 'PENDING'::public.run_state NOT NULL,
    attempt integer DEFAULT 1 NOT NULL,
    start_token text,
    worker_id text,
    lease_expires_at timestamp with time zone,
    result jsonb,
    error text,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    started_at timestamp with time zone,
    finished_at timestamp with time zone,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    reannounced integer,
    last_reannounced_at timestamp with time zone,
    CONSTRAINT finished_iff_terminal CHECK (((state = ANY (ARRAY['SUCCEEDED'::public.run_state, 'FAILED'::public.run_state, 'TIMED_OUT'::public.run_state, 'CANCELLED'::public.run_state, 'SKIPPED'::public.run_state])) = (finished_at IS NOT NULL))),
    CONSTRAINT running_has_token CHECK (((state <> 'RUNNING'::public.run_state) OR ((start_token IS NOT NULL) AND (lease_expires_at IS NOT NULL)))),
    CONSTRAINT runs_attempt_check CHECK ((attempt >= 1)),
    CONSTRAINT runs_partition_id_check CHECK (((partition_id >= 0) AND (partition_id <= 1023))),
    CONSTRAINT runs_reannounced_check CHECK ((reannounced >= 1))
)
WITH (fillfactor='80');

--
-- Name: schema_migrations; Type: TABLE; Schema: public
--

CREATE TABLE public.schema_migrations (
    version integer NOT NULL,
    name text NOT NULL,
    applied_at timestamp with time zone DEFAULT now() NOT NULL
);

--
-- Name: tenant_limits; Type: TABLE; Schema: public
--

CREATE TABLE public.tenant_limits (
    tenant_id text NOT NULL,
    kind text NOT NULL,
    max_count integer NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT tenant_limits_kind_check CHECK ((kind = ANY (ARRAY['jobs'::text, 'workflows'::text, 'keys'::text]))),
    CONSTRAINT tenant_limits_max_count_check CHECK ((max_count >= 0))
);

--
-- Name: tenant_quotas; Type: TABLE; Schema: public
--

CREATE TABLE public.tenant_quotas (
    tenant_id text NOT NULL,
    kind text NOT NULL,
    rate_per_s double precision NOT NULL,
    burst double precision NOT NULL,
    tokens double precision NOT NULL,
    refilled_at timestamp with time zone NOT NULL,
    held_total bigint DEFAULT 0 NOT NULL,
    held_at timestamp with time zone,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT tenant_quotas_burst_check CHECK ((burst >= (1)::double precision)),
    CONSTRAINT tenant_quotas_kind_check CHECK ((kind = ANY (ARRAY['fire'::text, 'dispatch'::text]))),
    CONSTRAINT tenant_quotas_rate_per_s_check CHECK ((rate_per_s > (0)::double precision))
);

--
-- Name: tenants; Type: TABLE; Schema: public
--

CREATE TABLE public.tenants (
    tenant_id text NOT NULL,
    name text NOT NULL,
    cell text DEFAULT 'local'::text NOT NULL,
    priority_classes text[] DEFAULT '{high,normal,low}'::text[] NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    state text DEFAULT 'active'::text NOT NULL,
    kafka_scram_mechanism text,
    kafka_scram_iterations integer,
    kafka_scram_salt bytea,
    kafka_scram_salted_password bytea,
    run_retention_days integer,
    kafka_scram_key_id text
);

--
-- Name: timers; Type: TABLE; Schema: public
--

CREATE TABLE public.timers (
    partition_id smallint NOT NULL,
    timer_id text NOT NULL,
    kind text NOT NULL,
    owner_id text NOT NULL,
    due_at timestamp with time zone NOT NULL,
    priority smallint DEFAULT 2 NOT NULL,
    attempt integer,
    tenant_id text DEFAULT ''::text NOT NULL,
    CONSTRAINT timers_kind_check CHECK ((kind = ANY (ARRAY['job'::text, 'retry'::text, 'lease'::text, 'timeout'::text, 'workflow'::text, 'pending'::text]))),
    CONSTRAINT timers_partition_id_check CHECK (((partition_id >= 0) AND (partition_id <= 1023))),
    CONSTRAINT timers_priority_check CHECK (((priority >= 0) AND (priority <= 3)))
)
WITH (autovacuum_vacuum_scale_factor='0', autovacuum_vacuum_threshold='2000', autovacuum_vacuum_insert_scale_factor='0', autovacuum_vacuum_insert_threshold='2000', autovacuum_vacuum_cost_delay='0', autovacuum_analyze_threshold='50000');

--
-- Name: timers_parked; Type: TABLE; Schema: public
--

CREATE TABLE public.timers_parked (
    partition_id smallint NOT NULL,
    timer_id text NOT NULL,
    kind text NOT NULL,
    owner_id text NOT NULL,
    due_at timestamp with time zone NOT NULL,
    priority smallint NOT NULL,
    attempt integer,
    tenant_id text NOT NULL
);

--
-- Name: webhook_secrets; Type: TABLE; Schema: public
--

CREATE TABLE public.webhook_secrets (
    partition_id smallint NOT NULL,
    owner_id text NOT NULL,
    secret_id text NOT NULL,
    tenant_id text NOT NULL,
    secret text,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    expires_at timestamp with time zone,
    sealed bytea,
    key_id text,
    CONSTRAINT webhook_secrets_held CHECK (((secret IS NOT NULL) OR ((sealed IS NOT NULL) AND (key_id IS NOT NULL)))),
    CONSTRAINT webhook_secrets_partition_id_check CHECK (((partition_id >= 0) AND (partition_id <= 1023))),
    CONSTRAINT webhook_secrets_secret_check CHECK (((secret ~~ 'whsec\_%'::text) AND (length(secret) >= 38)))
);

--
-- Name: workflow_nodes; Type: TABLE; Schema: public
--

CREATE TABLE public.workflow_nodes (
    partition_id smallint NOT NULL,
    workflow_id text NOT NULL,
    node text NOT NULL,
    idx integer NOT NULL,
    spec jsonb NOT NULL,
    depends_on text[] DEFAULT '{}'::text[] NOT NULL,
    children text[] DEFAULT '{}'::text[] NOT NULL
);

--
-- Name: workflow_run_nodes; Type: TABLE; Schema: public
--

CREATE TABLE public.workflow_run_nodes (
    partition_id smallint NOT NULL,
    workflow_run_id text NOT NULL,
    node text NOT NULL,
    idx integer NOT NULL,
    state text DEFAULT 'WAITING'::text NOT NULL,
    pending_deps integer NOT NULL,
    run_id text,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT node_run_after_all_parents CHECK (((run_id IS NULL) OR (pending_deps = 0))),
    CONSTRAINT node_run_iff_started CHECK ((((state = ANY (ARRAY['WAITING'::text, 'SKIPPED'::text])) AND (run_id IS NULL)) OR ((state = ANY (ARRAY['CREATED'::text, 'SUCCEEDED'::text, 'FAILED'::text, 'TIMED_OUT'::text])) AND (run_id IS NOT NULL)) OR (state = 'CANCELLED'::text))),
    CONSTRAINT workflow_run_nodes_pending_deps_check CHECK ((pending_deps >= 0)),
    CONSTRAINT workflow_run_nodes_state_check CHECK ((state = ANY (ARRAY['WAITING'::text, 'CREATED'::text, 'SUCCEEDED'::text, 'FAILED'::text, 'TIMED_OUT'::text, 'CANCELLED'::text, 'SKIPPED'::text])))
);

--
-- Name: workflow_runs; Type: TABLE; Schema: public
--

CREATE TABLE public.workflow_runs (
    partition_id smallint NOT NULL,
    workflow_run_id text NOT NULL,
    workflow_id text NOT NULL,
    tenant_id text NOT NULL,
    trigger text NOT NULL,
    scheduled_at timestamp with time zone NOT NULL,
    covers jsonb,
    priority text NOT NULL,
    state text DEFAULT 'RUNNING'::text NOT NULL,
    nodes_left integer NOT NULL,
    error text,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    finished_at timestamp with time zone,
    CONSTRAINT workflow_finished_iff_terminal CHECK (((state <> 'RUNNING'::text) = (finished_at IS NOT NULL))),
    CONSTRAINT workflow_runs_nodes_left_check CHECK ((nodes_left >= 0)),
    CONSTRAINT workflow_runs_partition_id_check CHECK (((partition_id >= 0) AND (partition_id <= 1023))),
    CONSTRAINT workflow_runs_state_check CHECK ((state = ANY (ARRAY['RUNNING'::text, 'SUCCEEDED'::text, 'FAILED'::text, 'CANCELLED'::text]))),
    CONSTRAINT workflow_runs_trigger_check CHECK ((trigger = ANY (ARRAY['schedule'::text, 'manual'::text]))),
    CONSTRAINT workflow_succeeded_all_nodes CHECK (((state <> 'SUCCEEDED'::text) OR (nodes_left = 0)))
);

--
-- Name: workflows; Type: TABLE; Schema: public
--

CREATE TABLE public.workflows (
    partition_id smallint NOT NULL,
    workflow_id text NOT NULL,
    tenant_id text NOT NULL,
    name text NOT NULL,
    priority text DEFAULT 'normal'::text NOT NULL,
    node_count integer NOT NULL,
    schedule jsonb,
    overlap text DEFAULT 'allow'::text NOT NULL,
    catchup jsonb NOT NULL,
    jitter_ms integer DEFAULT 0 NOT NULL,
    paused boolean DEFAULT false NOT NULL,
    version integer DEFAULT 1 NOT NULL,
    anchor_at timestamp with time zone NOT NULL,
    last_instant timestamp with time zone NOT NULL,
    missed_count bigint DEFAULT 0 NOT NULL,
    fired_count bigint DEFAULT 0 NOT NULL,
    overlap_skipped bigint DEFAULT 0 NOT NULL,
    buffered_at timestamp with time zone,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    deleted_at timestamp with time zone,
    CONSTRAINT workflows_jitter_ms_check CHECK ((jitter_ms >= 0)),
    CONSTRAINT workflows_node_count_check CHECK ((node_count >= 1)),
    CONSTRAINT workflows_overlap_check CHECK ((overlap = ANY (ARRAY['allow'::text, 'skip'::text, 'buffer_one'::text]))),
    CONSTRAINT workflows_partition_id_check CHECK (((partition_id >= 0) AND (partition_id <= 1023))),
    CONSTRAINT workflows_priority_check CHECK ((priority = ANY (ARRAY['critical'::text, 'high'::text, 'normal'::text, 'low'::text])))
);

--
-- Name: run_attempts_daily_default; Type: TABLE ATTACH; Schema: public
--

ALTER TABLE ONLY public.run_attempts_daily ATTACH PARTITION public.run_attempts_daily_default DEFAULT;

--
-- Name: runs_daily_default; Type: TABLE ATTACH; Schema: public
--

ALTER TABLE ONLY public.runs_daily ATTACH PARTITION public.runs_daily_default DEFAULT;

--
-- Name: api_keys api_keys_key_hash_key; Type: CONSTRAINT; Schema: public
--

ALTER TABLE ONLY public.api_keys
    ADD CONSTRAINT api_keys_key_hash_key UNIQUE (key_hash);

--
-- Name: api_keys api_keys_pkey; Type: CONSTRAINT; Schema: public
--

ALTER TABLE ONLY public.api_keys
    ADD CONSTRAINT api_keys_pkey PRIMARY KEY (key_id);

--
-- Name: backfills backfills_pkey; Type: CONSTRAINT; Schema: public
--

ALTER TABLE ONLY public.backfills
    ADD CONSTRAINT backfills_pkey PRIMARY KEY (name);

--
-- Name: idempotency_keys idempotency_keys_pkey; Type: CONSTRAINT; Schema: public
--

ALTER TABLE ONLY public.idempotency_keys
    ADD CONSTRAINT idempotency_keys_pkey PRIMARY KEY (scope, key);

--
-- Name: jobs jobs_pkey; Type: CONSTRAINT; Schema: public
--

ALTER TABLE ONLY public.jobs
    ADD CONSTRAINT jobs_pkey PRIMARY KEY (partition_id, job_id);

--
-- Name: lease_members lease_members_pkey; Type: CONSTRAINT; Schema: public
--

ALTER TABLE ONLY public.lease_members
    ADD CONSTRAINT lease_members_pkey PRIMARY KEY (service, instance);

--
-- Name: outbox outbox_pkey; Type: CONSTRAINT; Schema: public
--

ALTER TABLE ONLY public.outbox
    ADD CONSTRAINT outbox_pkey PRIMARY KEY (id);

--
-- Name: partition_leases partition_leases_pkey; Type: CONSTRAINT; Schema: public
--

ALTER TABLE ONLY public.partition_leases
    ADD CONSTRAINT partition_leases_pkey PRIMARY KEY (service, partition_id);

--
-- Name: processed processed_pkey; Type: CONSTRAINT; Schema: public
--

ALTER TABLE ONLY public.processed
    ADD CONSTRAINT processed_pkey PRIMARY KEY (consumer, message_key);

--
-- Name: run_attempts_daily run_attempts_daily_pkey; Type: CONSTRAINT; Schema: public
--

ALTER TABLE ONLY public.run_attempts_daily
    ADD CONSTRAINT run_attempts_daily_pkey PRIMARY KEY (partition_id, run_id, attempt, scheduled_at);

--
-- Name: run_attempts_daily_default run_attempts_daily_default_pkey; Type: CONSTRAINT; Schema: public
--

ALTER TABLE ONLY public.run_attempts_daily_default
    ADD CONSTRAINT run_attempts_daily_default_pkey PRIMARY KEY (partition_id, run_id, attempt, scheduled_at);

--
-- Name: runs_daily runs_daily_pkey; Type: CONSTRAINT; Schema: public
--

ALTER TABLE ONLY public.runs_daily
    ADD CONSTRAINT runs_daily_pkey PRIMARY KEY (partition_id, run_id, scheduled_at);

--
-- Name: runs_daily_default runs_daily_default_pkey; Type: CONSTRAINT; Schema: public
--

ALTER TABLE ONLY public.runs_daily_default
    ADD CONSTRAINT runs_daily_default_pkey PRIMARY KEY (partition_id, run_id, scheduled_at);

--
-- Name: schema_migrations schema_migrations_pkey; Type: CONSTRAINT; Schema: public
--

ALTER TABLE ONLY public.schema_migrations
    ADD CONSTRAINT schema_migrations_pkey PRIMARY KEY (version);

--
-- Name: tenant_limits tenant_limits_pkey; Type: CONSTRAINT; Schema: public
--

ALTER TABLE ONLY public.tenant_limits
    ADD CONSTRAINT tenant_limits_pkey PRIMARY KEY (tenant_id, kind);

--
-- Name: tenant_quotas tenant_quotas_pkey; Type: CONSTRAINT; Schema: public
--

ALTER TABLE ONLY public.tenant_quotas
    ADD CONSTRAINT tenant_quotas_pkey PRIMARY KEY (tenant_id, kind);

--
-- Name: tenants tenants_name_key; Type: CONSTRAINT; Schema: public
--

ALTER TABLE ONLY public.tenants
    ADD CONSTRAINT tenants_name_key UNIQUE (name);

--
-- Name: tenants tenants_pkey; Type: CONSTRAINT; Schema: public
--

ALTER TABLE ONLY public.tenants
    ADD CONSTRAINT tenants_pkey PRIMARY KEY (tenant_id);

--
-- Name: tenants tenants_run_retention_days_check; Type: CHECK CONSTRAINT; Schema: public
--

ALTER TABLE public.tenants
    ADD CONSTRAINT tenants_run_retention_days_check CHECK (((run_retention_days >= 1) AND (run_retention_days <= 3650))) NOT VALID;

--
-- Name: tenants tenants_state_check; Type: CHECK CONSTRAINT; Schema: public
--

ALTER TABLE public.tenants
    ADD CONSTRAINT tenants_state_check CHECK ((state = ANY (ARRAY['active'::text, 'standby'::text, 'frozen'::text, 'moved'::text]))) NOT VALID;

--
-- Name: timers_parked timers_parked_pkey; Type: CONSTRAINT; Schema: public
--

ALTER TABLE ONLY public.timers_parked
    ADD CONSTRAINT timers_parked_pkey PRIMARY KEY (partition_id, timer_id);

--
-- Name: timers timers_pkey; Type: CONSTRAINT; Schema: public
--

ALTER TABLE ONLY public.timers
    ADD CONSTRAINT timers_pkey PRIMARY KEY (partition_id, timer_id);

--
-- Name: webhook_secrets webhook_secrets_pkey; Type: CONSTRAINT; Schema: public
--

ALTER TABLE ONLY public.webhook_secrets
    ADD CONSTRAINT webhook_secrets_pkey PRIMARY KEY (partition_id, owner_id, secret_id);

--
-- Name: workflow_nodes workflow_nodes_pkey; Type: CONSTRAINT; Schema: public
--

ALTER TABLE ONLY public.workflow_nodes
    ADD CONSTRAINT workflow_nodes_pkey PRIMARY KEY (partition_id, workflow_id, node);

--
-- Name: workflow_run_nodes workflow_run_nodes_pkey; Type: CONSTRAINT; Schema: public
--

ALTER TABLE ONLY public.workflow_run_nodes
    ADD CONSTRAINT workflow_run_nodes_pkey PRIMARY KEY (partition_id, workflow_run_id, node);

--
-- Name: workflow_runs workflow_runs_pkey; Type: CONSTRAINT; Schema: public
--

ALTER TABLE ONLY public.workflow_runs
    ADD CONSTRAINT workflow_runs_pkey PRIMARY KEY (partition_id, workflow_run_id);

--
-- Name: workflows workflows_pkey; Type: CONSTRAINT; Schema: public
--

ALTER TABLE ONLY public.workflows
    ADD CONSTRAINT workflows_pkey PRIMARY KEY (partition_id, workflow_id);

--
-- Name: api_keys_tenant; Type: INDEX; Schema: public
--

CREATE INDEX api_keys_tenant ON public.api_keys USING btree (tenant_id, created_at, key_id);

--
-- Name: idempotency_keys_created; Type: INDEX; Schema: public
--

CREATE INDEX idempotency_keys_created ON public.idempotency_keys USING btree (created_at);

--
-- Name: jobs_tenant; Type: INDEX; Schema: public
--

CREATE INDEX jobs_tenant ON public.jobs USING btree (tenant_id, created_at, job_id) WHERE (deleted_at IS NULL);

--
-- Name: outbox_lane; Type: INDEX; Schema: public
--

CREATE INDEX outbox_lane ON public.outbox USING btree (priority, topic, id);

--
-- Name: outbox_partition; Type: INDEX; Schema: public
--

CREATE INDEX outbox_partition ON public.outbox USING btree (partition_id, id);

--
-- Name: processed_age; Type: INDEX; Schema: public
--

CREATE INDEX processed_age ON public.processed USING btree (consumer, processed_at);

--
-- Name: runs_daily_job; Type: INDEX; Schema: public
--

CREATE INDEX runs_daily_job ON ONLY public.runs_daily USING btree (job_id, scheduled_at DESC) WHERE (job_id IS NOT NULL);

--
-- Name: runs_daily_default_job_id_scheduled_at_idx; Type: INDEX; Schema: public
--

CREATE INDEX runs_daily_default_job_id_scheduled_at_idx ON public.runs_daily_default USING btree (job_id, scheduled_at DESC) WHERE (job_id IS NOT NULL);

--
-- Name: runs_daily_open_job; Type: INDEX; Schema: public
--

CREATE INDEX runs_daily_open_job ON ONLY public.runs_daily USING btree (job_id) WHERE ((finished_at IS NULL) AND (job_id IS NOT NULL));

--
-- Name: runs_daily_default_open_job; Type: INDEX; Schema: public
--

CREATE INDEX runs_daily_default_open_job ON public.runs_daily_default USING btree (job_id) WHERE ((finished_at IS NULL) AND (job_id IS NOT NULL));

--
-- Name: runs_daily_unfinished; Type: INDEX; Schema: public
--

CREATE INDEX runs_daily_unfinished ON ONLY public.runs_daily USING btree (partition_id, scheduled_at) WHERE (finished_at IS NULL);

--
-- Name: runs_daily_default_partition_id_scheduled_at_idx; Type: INDEX; Schema: public
--

CREATE INDEX runs_daily_default_partition_id_scheduled_at_idx ON public.runs_daily_default USING btree (partition_id, scheduled_at) WHERE (finished_at IS NULL);

--
-- Name: runs_daily_tenant_created; Type: INDEX; Schema: public
--

CREATE INDEX runs_daily_tenant_created ON ONLY public.runs_daily USING btree (tenant_id, created_at DESC, run_id DESC);

--
-- Name: runs_daily_default_tenant_id_created_at_run_id_idx; Type: INDEX; Schema: public
--

CREATE INDEX runs_daily_default_tenant_id_created_at_run_id_idx ON public.runs_daily_default USING btree (tenant_id, created_at DESC, run_id DESC);

--
-- Name: tenants_not_active; Type: INDEX; Schema: public
--

CREATE INDEX tenants_not_active ON public.tenants USING btree (tenant_id) WHERE (state <> 'active'::text);

--
-- Name: timers_due; Type: INDEX; Schema: public
--

CREATE INDEX timers_due ON public.timers USING btree (priority, due_at);

--
-- Name: timers_lane; Type: INDEX; Schema: public
--

CREATE INDEX timers_lane ON public.timers USING btree (priority, tenant_id, due_at);

--
-- Name: timers_parked_tenant; Type: INDEX; Schema: public
--

CREATE INDEX timers_parked_tenant ON public.timers_parked USING btree (tenant_id);

--
-- Name: webhook_secrets_current; Type: INDEX; Schema: public
--

CREATE UNIQUE INDEX webhook_secrets_current ON public.webhook_secrets USING btree (partition_id, owner_id) WHERE (expires_at IS NULL);

--
-- Name: webhook_secrets_id; Type: INDEX; Schema: public
--

CREATE UNIQUE INDEX webhook_secrets_id ON public.webhook_secrets USING btree (secret_id);

--
-- Name: workflow_runs_active; Type: INDEX; Schema: public
--

CREATE INDEX workflow_runs_active ON public.workflow_runs USING btree (workflow_id) WHERE (state = 'RUNNING'::text);

--
-- Name: workflow_runs_workflow; Type: INDEX; Schema: public
--

CREATE INDEX workflow_runs_workflow ON public.workflow_runs USING btree (workflow_id, created_at DESC, workflow_run_id DESC);

--
-- Name: workflows_tenant; Type: INDEX; Schema: public
--

CREATE INDEX workflows_tenant ON public.workflows USING btree (tenant_id, created_at, workflow_id) WHERE (deleted_at IS NULL);

--
-- Name: run_attempts_daily_default_pkey; Type: INDEX ATTACH; Schema: public
--

ALTER INDEX public.run_attempts_daily_pkey ATTACH PARTITION public.run_attempts_daily_default_pkey;

--
-- Name: runs_daily_default_job_id_scheduled_at_idx; Type: INDEX ATTACH; Schema: public
--

ALTER INDEX public.runs_daily_job ATTACH PARTITION public.runs_daily_default_job_id_scheduled_at_idx;

--
-- Name: runs_daily_default_open_job; Type: INDEX ATTACH; Schema: public
--

ALTER INDEX public.runs_daily_open_job ATTACH PARTITION public.runs_daily_default_open_job;

--
-- Name: runs_daily_default_partition_id_scheduled_at_idx; Type: INDEX ATTACH; Schema: public
--

ALTER INDEX public.runs_daily_unfinished ATTACH PARTITION public.runs_daily_default_partition_id_scheduled_at_idx;

--
-- Name: runs_daily_default_pkey; Type: INDEX ATTACH; Schema: public
--

ALTER INDEX public.runs_daily_pkey ATTACH PARTITION public.runs_daily_default_pkey;

--
-- Name: runs_daily_default_tenant_id_created_at_run_id_idx; Type: INDEX ATTACH; Schema: public
--

ALTER INDEX public.runs_daily_tenant_created ATTACH PARTITION public.runs_daily_default_tenant_id_created_at_run_id_idx;

--
-- Name: jobs jobs_notify_destination; Type: TRIGGER; Schema: public
--

CREATE TRIGGER jobs_notify_destination AFTER INSERT OR UPDATE OF target ON public.jobs FOR EACH ROW EXECUTE FUNCTION public.cronwheel_notify_destination();

--
-- Name: tenants tenants_notify; Type: TRIGGER; Schema: public
--

CREATE TRIGGER tenants_notify AFTER INSERT ON public.tenants FOR EACH ROW EXECUTE FUNCTION public.cronwheel_notify_tenant();

--
-- Name: api_keys api_keys_tenant_id_fkey; Type: FK CONSTRAINT; Schema: public
--

ALTER TABLE ONLY public.api_keys
    ADD CONSTRAINT api_keys_tenant_id_fkey FOREIGN KEY (tenant_id) REFERENCES public.tenants(tenant_id) ON DELETE CASCADE;

--
-- Name: jobs jobs_tenant_id_fkey; Type: FK CONSTRAINT; Schema: public
--

ALTER TABLE ONLY public.jobs
    ADD CONSTRAINT jobs_tenant_id_fkey FOREIGN KEY (tenant_id) REFERENCES public.tenants(tenant_id);

--
-- Name: tenant_limits tenant_limits_tenant_id_fkey; Type: FK CONSTRAINT; Schema: public
--

ALTER TABLE ONLY public.tenant_limits
    ADD CONSTRAINT tenant_limits_tenant_id_fkey FOREIGN KEY (tenant_id) REFERENCES public.tenants(tenant_id) ON DELETE CASCADE;

--
-- Name: tenant_quotas tenant_quotas_tenant_id_fkey; Type: FK CONSTRAINT; Schema: public
--

ALTER TABLE ONLY public.tenant_quotas
    ADD CONSTRAINT tenant_quotas_tenant_id_fkey FOREIGN KEY (tenant_id) REFERENCES public.tenants(tenant_id) ON DELETE CASCADE;

--
-- Name: webhook_secrets webhook_secrets_tenant_id_fkey; Type: FK CONSTRAINT; Schema: public
--

ALTER TABLE ONLY public.webhook_secrets
    ADD CONSTRAINT webhook_secrets_tenant_id_fkey FOREIGN KEY (tenant_id) REFERENCES public.tenants(tenant_id);

--
-- Name: workflow_nodes workflow_nodes_partition_id_workflow_id_fkey; Type: FK CONSTRAINT; Schema: public
--

ALTER TABLE ONLY public.workflow_nodes
    ADD CONSTRAINT workflow_nodes_partition_id_workflow_id_fkey FOREIGN KEY (partition_id, workflow_id) REFERENCES public.workflows(partition_id, workflow_id);

--
-- Name: workflow_run_nodes workflow_run_nodes_partition_id_workflow_run_id_fkey; Type: FK CONSTRAINT; Schema: public
--

ALTER TABLE ONLY public.workflow_run_nodes
    ADD CONSTRAINT workflow_run_nodes_partition_id_workflow_run_id_fkey FOREIGN KEY (partition_id, workflow_run_id) REFERENCES public.workflow_runs(partition_id, workflow_run_id);

--
-- Name: workflow_runs workflow_runs_partition_id_workflow_id_fkey; Type: FK CONSTRAINT; Schema: public
--

ALTER TABLE ONLY public.workflow_runs
    ADD CONSTRAINT workflow_runs_partition_id_workflow_id_fkey FOREIGN KEY (partition_id, workflow_id) REFERENCES public.workflows(partition_id, workflow_id) DEFERRABLE;

--
-- Name: workflows workflows_tenant_id_fkey; Type: FK CONSTRAINT; Schema: public
--

ALTER TABLE ONLY public.workflows
    ADD CONSTRAINT workflows_tenant_id_fkey FOREIGN KEY (tenant_id) REFERENCES public.tenants(tenant_id);

--
-- Name: api_keys; Type: ROW SECURITY; Schema: public
--

ALTER TABLE public.api_keys ENABLE ROW LEVEL SECURITY;

--
-- Name: idempotency_keys; Type: ROW SECURITY; Schema: public
--

ALTER TABLE public.idempotency_keys ENABLE ROW LEVEL SECURITY;

--
-- Name: jobs; Type: ROW SECURITY; Schema: public
--

ALTER TABLE public.jobs ENABLE ROW LEVEL SECURITY;

--
-- Name: api_keys operator; Type: POLICY; Schema: public
--

CREATE POLICY operator ON public.api_keys TO cronwheel_operator USING (true);

--
-- Name: idempotency_keys operator; Type: POLICY; Schema: public
--

CREATE POLICY operator ON public.idempotency_keys TO cronwheel_operator USING (true);

--
-- Name: jobs operator; Type: POLICY; Schema: public
--

CREATE POLICY operator ON public.jobs TO cronwheel_operator USING (true);

--
-- Name: run_attempts_daily operator; Type: POLICY; Schema: public
--

CREATE POLICY operator ON public.run_attempts_daily TO cronwheel_operator USING (true);

--
-- Name: runs_daily operator; Type: POLICY; Schema: public
--

CREATE POLICY operator ON public.runs_daily TO cronwheel_operator USING (true);

--
-- Name: tenant_limits operator; Type: POLICY; Schema: public
--

CREATE POLICY operator ON public.tenant_limits TO cronwheel_operator USING (true);

--
-- Name: tenant_quotas operator; Type: POLICY; Schema: public
--

CREATE POLICY operator ON public.tenant_quotas TO cronwheel_operator USING (true);

--
-- Name: tenants operator; Type: POLICY; Schema: public
--

CREATE POLICY operator ON public.tenants TO cronwheel_operator USING (true);

--
-- Name: timers operator; Type: POLICY; Schema: public
--

CREATE POLICY operator ON public.timers TO cronwheel_operator USING (true);

--
-- Name: timers_parked operator; Type: POLICY; Schema: public
--

CREATE POLICY operator ON public.timers_parked TO cronwheel_operator USING (true);

--
-- Name: webhook_secrets operator; Type: POLICY; Schema: public
--

CREATE POLICY operator ON public.webhook_secrets TO cronwheel_operator USING (true);

--
-- Name: workflow_nodes operator; Type: POLICY; Schema: public
--

CREATE POLICY operator ON public.workflow_nodes TO cronwheel_operator USING (true);

--
-- Name: workflow_run_nodes operator; Type: POLICY; Schema: public
--

CREATE POLICY operator ON public.workflow_run_nodes TO cronwheel_operator USING (true);

--
-- Name: workflow_runs operator; Type: POLICY; Schema: public
--

CREATE POLICY operator ON public.workflow_runs TO cronwheel_operator USING (true);

--
-- Name: workflows operator; Type: POLICY; Schema: public
--

CREATE POLICY operator ON public.workflows TO cronwheel_operator USING (true);

--
-- Name: api_keys platform; Type: POLICY; Schema: public
--

CREATE POLICY platform ON public.api_keys TO cronwheel_platform USING (true);

--
-- Name: idempotency_keys platform; Type: POLICY; Schema: public
--

CREATE POLICY platform ON public.idempotency_keys TO cronwheel_platform USING (true);

--
-- Name: jobs platform; Type: POLICY; Schema: public
--

CREATE POLICY platform ON public.jobs TO cronwheel_platform USING (true);

--
-- Name: run_attempts_daily platform; Type: POLICY; Schema: public
--

CREATE POLICY platform ON public.run_attempts_daily TO cronwheel_platform USING (true);

--
-- Name: runs_daily platform; Type: POLICY; Schema: public
--

CREATE POLICY platform ON public.runs_daily TO cronwheel_platform USING (true);

--
-- Name: tenant_limits platform; Type: POLICY; Schema: public
--

CREATE POLICY platform ON public.tenant_limits TO cronwheel_platform USING (true);

--
-- Name: tenant_quotas platform; Type: POLICY; Schema: public
--

CREATE POLICY platform ON public.tenant_quotas TO cronwheel_platform USING (true);

--
-- Name: tenants platform; Type: POLICY; Schema: public
--

CREATE POLICY platform ON public.tenants TO cronwheel_platform USING (true);

--
-- Name: timers platform; Type: POLICY; Schema: public
--

CREATE POLICY platform ON public.timers TO cronwheel_platform USING (true);

--
-- Name: timers_parked platform; Type: POLICY; Schema: public
--

CREATE POLICY platform ON public.timers_parked TO cronwheel_platform USING (true);

--
-- Name: webhook_secrets platform; Type: POLICY; Schema: public
--

CREATE POLICY platform ON public.webhook_secrets TO cronwheel_platform USING (true);

--
-- Name: workflow_nodes platform; Type: POLICY; Schema: public
--

CREATE POLICY platform ON public.workflow_nodes TO cronwheel_platform USING (true);

--
-- Name: workflow_run_nodes platform; Type: POLICY; Schema: public
--

CREATE POLICY platform ON public.workflow_run_nodes TO cronwheel_platform USING (true);

--
-- Name: workflow_runs platform; Type: POLICY; Schema: public
--

CREATE POLICY platform ON public.workflow_runs TO cronwheel_platform USING (true);

--
-- Name: workflows platform; Type: POLICY; Schema: public
--

CREATE POLICY platform ON public.workflows TO cronwheel_platform USING (true);

--
-- Name: run_attempts_daily; Type: ROW SECURITY; Schema: public
--

ALTER TABLE public.run_attempts_daily ENABLE ROW LEVEL SECURITY;

--
-- Name: runs_daily; Type: ROW SECURITY; Schema: public
--

ALTER TABLE public.runs_daily ENABLE ROW LEVEL SECURITY;

--
-- Name: tenant_limits; Type: ROW SECURITY; Schema: public
--

ALTER TABLE public.tenant_limits ENABLE ROW LEVEL SECURITY;

--
-- Name: tenant_quotas; Type: ROW SECURITY; Schema: public
--

ALTER TABLE public.tenant_quotas ENABLE ROW LEVEL SECURITY;

--
-- Name: api_keys tenant_scope; Type: POLICY; Schema: public
--

CREATE POLICY tenant_scope ON public.api_keys TO cronwheel_gateway USING ((tenant_id = public.cronwheel_tenant_scope()));

--
-- Name: idempotency_keys tenant_scope; Type: POLICY; Schema: public
--

CREATE POLICY tenant_scope ON public.idempotency_keys TO cronwheel_gateway USING ((scope = public.cronwheel_tenant_scope()));

--
-- Name: jobs tenant_scope; Type: POLICY; Schema: public
--

CREATE POLICY tenant_scope ON public.jobs TO cronwheel_gateway USING ((tenant_id = public.cronwheel_tenant_scope()));

--
-- Name: run_attempts_daily tenant_scope; Type: POLICY; Schema: public
--

CREATE POLICY tenant_scope ON public.run_attempts_daily TO cronwheel_gateway USING ((tenant_id = public.cronwheel_tenant_scope()));

--
-- Name: runs_daily tenant_scope; Type: POLICY; Schema: public
--

CREATE POLICY tenant_scope ON public.runs_daily TO cronwheel_gateway USING ((tenant_id = public.cronwheel_tenant_scope()));

--
-- Name: tenant_limits tenant_scope; Type: POLICY; Schema: public
--

CREATE POLICY tenant_scope ON public.tenant_limits TO cronwheel_gateway USING ((tenant_id = public.cronwheel_tenant_scope()));

--
-- Name: tenant_quotas tenant_scope; Type: POLICY; Schema: public
--

CREATE POLICY tenant_scope ON public.tenant_quotas TO cronwheel_gateway USING ((tenant_id = public.cronwheel_tenant_scope()));

--
-- Name: tenants tenant_scope; Type: POLICY; Schema: public
--

CREATE POLICY tenant_scope ON public.tenants TO cronwheel_gateway USING ((tenant_id = public.cronwheel_tenant_scope()));

--
-- Name: timers tenant_scope; Type: POLICY; Schema: public
--

CREATE POLICY tenant_scope ON public.timers TO cronwheel_gateway USING ((tenant_id = public.cronwheel_tenant_scope()));

--
-- Name: timers_parked tenant_scope; Type: POLICY; Schema: public
--

CREATE POLICY tenant_scope ON public.timers_parked TO cronwheel_gateway USING ((tenant_id = public.cronwheel_tenant_scope()));

--
-- Name: webhook_secrets tenant_scope; Type: POLICY; Schema: public
--

CREATE POLICY tenant_scope ON public.webhook_secrets TO cronwheel_gateway USING ((tenant_id = public.cronwheel_tenant_scope()));

--
-- Name: workflow_nodes tenant_scope; Type: POLICY; Schema: public
--

CREATE POLICY tenant_scope ON public.workflow_nodes TO cronwheel_gateway USING ((EXISTS ( SELECT 1
   FROM public.workflows w
  WHERE ((w.partition_id = workflow_nodes.partition_id) AND (w.workflow_id = workflow_nodes.workflow_id) AND (w.tenant_id = public.cronwheel_tenant_scope())))));

--
-- Name: workflow_run_nodes tenant_scope; Type: POLICY; Schema: public
--

CREATE POLICY tenant_scope ON public.workflow_run_nodes TO cronwheel_gateway USING ((EXISTS ( SELECT 1
   FROM public.workflow_runs r
  WHERE ((r.partition_id = workflow_run_nodes.partition_id) AND (r.workflow_run_id = workflow_run_nodes.workflow_run_id) AND (r.tenant_id = public.cronwheel_tenant_scope())))));

--
-- Name: workflow_runs tenant_scope; Type: POLICY; Schema: public
--

CREATE POLICY tenant_scope ON public.workflow_runs TO cronwheel_gateway USING ((tenant_id = public.cronwheel_tenant_scope()));

--
-- Name: workflows tenant_scope; Type: POLICY; Schema: public
--

CREATE POLICY tenant_scope ON public.workflows TO cronwheel_gateway USING ((tenant_id = public.cronwheel_tenant_scope()));

--
-- Name: tenants; Type: ROW SECURITY; Schema: public
--

ALTER TABLE public.tenants ENABLE ROW LEVEL SECURITY;

--
-- Name: timers; Type: ROW SECURITY; Schema: public
--

ALTER TABLE public.timers ENABLE ROW LEVEL SECURITY;

--
-- Name: timers_parked; Type: ROW SECURITY; Schema: public
--

ALTER TABLE public.timers_parked ENABLE ROW LEVEL SECURITY;

--
-- Name: webhook_secrets; Type: ROW SECURITY; Schema: public
--

ALTER TABLE public.webhook_secrets ENABLE ROW LEVEL SECURITY;

--
-- Name: workflow_nodes; Type: ROW SECURITY; Schema: public
--

ALTER TABLE public.workflow_nodes ENABLE ROW LEVEL SECURITY;

--
-- Name: workflow_run_nodes; Type: ROW SECURITY; Schema: public
--

ALTER TABLE public.workflow_run_nodes ENABLE ROW LEVEL SECURITY;

--
-- Name: workflow_runs; Type: ROW SECURITY; Schema: public
--

ALTER TABLE public.workflow_runs ENABLE ROW LEVEL SECURITY;

--
-- Name: workflows; Type: ROW SECURITY; Schema: public
--

ALTER TABLE public.workflows ENABLE ROW LEVEL SECURITY;

--
-- Name: FUNCTION cronwheel_authenticate(key_hash bytea); Type: ACL; Schema: public
--

REVOKE ALL ON FUNCTION public.cronwheel_authenticate(key_hash bytea) FROM PUBLIC;
GRANT ALL ON FUNCTION public.cronwheel_authenticate(key_hash bytea) TO cronwheel_gateway;
GRANT ALL ON FUNCTION public.cronwheel_authenticate(key_hash bytea) TO cronwheel_platform;

--
-- Name: TABLE api_keys; Type: ACL; Schema: public
--

GRANT SELECT,INSERT,DELETE,UPDATE ON TABLE public.api_keys TO cronwheel_platform;
GRANT SELECT,INSERT,DELETE,UPDATE ON TABLE public.api_keys TO cronwheel_gateway;
GRANT SELECT,INSERT,DELETE,UPDATE ON TABLE public.api_keys TO cronwheel_operator;

--
-- Name: TABLE backfills; Type: ACL; Schema: public
--

GRANT SELECT,INSERT,DELETE,UPDATE ON TABLE public.backfills TO cronwheel_platform;

--
-- Name: TABLE idempotency_keys; Type: ACL; Schema: public
--

GRANT SELECT,INSERT,DELETE,UPDATE ON TABLE public.idempotency_keys TO cronwheel_platform;
GRANT SELECT,INSERT,DELETE,UPDATE ON TABLE public.idempotency_keys TO cronwheel_gateway;
GRANT SELECT,INSERT,DELETE,UPDATE ON TABLE public.idempotency_keys TO cronwheel_operator;

--
-- Name: TABLE jobs; Type: ACL; Schema: public
--

GRANT SELECT,INSERT,DELETE,UPDATE ON TABLE public.jobs TO cronwheel_platform;
GRANT SELECT,INSERT,DELETE,UPDATE ON TABLE public.jobs TO cronwheel_gateway;
GRANT SELECT,INSERT,DELETE,UPDATE ON TABLE public.jobs TO cronwheel_operator;

--
-- Name: TABLE lease_members; Type: ACL; Schema: public
--

GRANT SELECT,INSERT,DELETE,UPDATE ON TABLE public.lease_members TO cronwheel_platform;
GRANT SELECT ON TABLE public.lease_members TO cronwheel_operator;

--
-- Name: TABLE outbox; Type: ACL; Schema: public
--

GRANT SELECT,INSERT,DELETE,UPDATE ON TABLE public.outbox TO cronwheel_platform;
GRANT INSERT ON TABLE public.outbox TO cronwheel_gateway;
GRANT INSERT ON TABLE public.outbox TO cronwheel_operator;

--
-- Name: COLUMN outbox.id; Type: ACL; Schema: public
--

GRANT SELECT(id) ON TABLE public.outbox TO cronwheel_operator;

--
-- Name: COLUMN outbox.created_at; Type: ACL; Schema: public
--

GRANT SELECT(created_at) ON TABLE public.outbox TO cronwheel_operator;

--
-- Name: COLUMN outbox.not_before; Type: ACL; Schema: public
--

GRANT SELECT(not_before) ON TABLE public.outbox TO cronwheel_operator;

--
-- Name: SEQUENCE outbox_id_seq; Type: ACL; Schema: public
--

GRANT SELECT,USAGE ON SEQUENCE public.outbox_id_seq TO cronwheel_platform;

--
-- Name: TABLE partition_leases; Type: ACL; Schema: public
--

GRANT SELECT,INSERT,DELETE,UPDATE ON TABLE public.partition_leases TO cronwheel_platform;
GRANT SELECT ON TABLE public.partition_leases TO cronwheel_operator;

--
-- Name: TABLE processed; Type: ACL; Schema: public
--

GRANT SELECT,INSERT,DELETE,UPDATE ON TABLE public.processed TO cronwheel_platform;

--
-- Name: TABLE run_attempts_daily; Type: ACL; Schema: public
--

GRANT SELECT,INSERT,DELETE,UPDATE ON TABLE public.run_attempts_daily TO cronwheel_platform;
GRANT SELECT,INSERT,DELETE,UPDATE ON TABLE public.run_attempts_daily TO cronwheel_gateway;
GRANT SELECT,INSERT,DELETE,UPDATE ON TABLE public.run_attempts_daily TO cronwheel_operator;

--
-- Name: TABLE run_attempts_daily_default; Type: ACL; Schema: public
--

GRANT SELECT,INSERT,DELETE,UPDATE ON TABLE public.run_attempts_daily_default TO cronwheel_platform;

--
-- Name: TABLE runs_daily; Type: ACL; Schema: public
--

GRANT SELECT,INSERT,DELETE,UPDATE ON TABLE public.runs_daily TO cronwheel_platform;
GRANT SELECT,INSERT,DELETE,UPDATE ON TABLE public.runs_daily TO cronwheel_gateway;
GRANT SELECT,INSERT,DELETE,UPDATE ON TABLE public.runs_daily TO cronwheel_operator;

--
-- Name: TABLE runs_daily_default; Type: ACL; Schema: public
--

GRANT SELECT,INSERT,DELETE,UPDATE ON TABLE public.runs_daily_default TO cronwheel_platform;

--
-- Name: TABLE schema_migrations; Type: ACL; Schema: public
--

GRANT SELECT,INSERT,DELETE,UPDATE ON TABLE public.schema_migrations TO cronwheel_platform;

--
-- Name: TABLE tenant_limits; Type: ACL; Schema: public
--

GRANT SELECT,INSERT,DELETE,UPDATE ON TABLE public.tenant_limits TO cronwheel_platform;
GRANT SELECT,INSERT,DELETE,UPDATE ON TABLE public.tenant_limits TO cronwheel_gateway;
GRANT SELECT,INSERT,DELETE,UPDATE ON TABLE public.tenant_limits TO cronwheel_operator;

--
-- Name: TABLE tenant_quotas; Type: ACL; Schema: public
--

GRANT SELECT,INSERT,DELETE,UPDATE ON TABLE public.tenant_quotas TO cronwheel_platform;
GRANT SELECT,INSERT,DELETE,UPDATE ON TABLE public.tenant_quotas TO cronwheel_gateway;
GRANT SELECT,INSERT,DELETE,UPDATE ON TABLE public.tenant_quotas TO cronwheel_operator;

--
-- Name: TABLE tenants; Type: ACL; Schema: public
--

GRANT SELECT,INSERT,DELETE,UPDATE ON TABLE public.tenants TO cronwheel_platform;
GRANT SELECT,INSERT,DELETE,UPDATE ON TABLE public.tenants TO cronwheel_gateway;
GRANT SELECT,INSERT,DELETE,UPDATE ON TABLE public.tenants TO cronwheel_operator;

--
-- Name: TABLE timers; Type: ACL; Schema: public
--

GRANT SELECT,INSERT,DELETE,UPDATE ON TABLE public.timers TO cronwheel_platform;
GRANT SELECT,INSERT,DELETE,UPDATE ON TABLE public.timers TO cronwheel_gateway;
GRANT SELECT,INSERT,DELETE,UPDATE ON TABLE public.timers TO cronwheel_operator;

--
-- Name: TABLE timers_parked; Type: ACL; Schema: public
--

GRANT SELECT,INSERT,DELETE,UPDATE ON TABLE public.timers_parked TO cronwheel_platform;

--
-- Name: TABLE webhook_secrets; Type: ACL; Schema: public
--

GRANT SELECT,INSERT,DELETE,UPDATE ON TABLE public.webhook_secrets TO cronwheel_platform;
GRANT SELECT,INSERT,DELETE,UPDATE ON TABLE public.webhook_secrets TO cronwheel_gateway;
GRANT SELECT,INSERT,DELETE,UPDATE ON TABLE public.webhook_secrets TO cronwheel_operator;

--
-- Name: TABLE workflow_nodes; Type: ACL; Schema: public
--

GRANT SELECT,INSERT,DELETE,UPDATE ON TABLE public.workflow_nodes TO cronwheel_platform;
GRANT SELECT,INSERT,DELETE,UPDATE ON TABLE public.workflow_nodes TO cronwheel_gateway;
GRANT SELECT,INSERT,DELETE,UPDATE ON TABLE public.workflow_nodes TO cronwheel_operator;

--
-- Name: TABLE workflow_run_nodes; Type: ACL; Schema: public
--

GRANT SELECT,INSERT,DELETE,UPDATE ON TABLE public.workflow_run_nodes TO cronwheel_platform;
GRANT SELECT,INSERT,DELETE,UPDATE ON TABLE public.workflow_run_nodes TO cronwheel_gateway;
GRANT SELECT,INSERT,DELETE,UPDATE ON TABLE public.workflow_run_nodes TO cronwheel_operator;

--
-- Name: TABLE workflow_runs; Type: ACL; Schema: public
--

GRANT SELECT,INSERT,DELETE,UPDATE ON TABLE public.workflow_runs TO cronwheel_platform;
GRANT SELECT,INSERT,DELETE,UPDATE ON TABLE public.workflow_runs TO cronwheel_gateway;
GRANT SELECT,INSERT,DELETE,UPDATE ON TABLE public.workflow_runs TO cronwheel_operator;

--
-- Name: TABLE workflows; Type: ACL; Schema: public
--

GRANT SELECT,INSERT,DELETE,UPDATE ON TABLE public.workflows TO cronwheel_platform;
GRANT SELECT,INSERT,DELETE,UPDATE ON TABLE public.workflows TO cronwheel_gateway;
GRANT SELECT,INSERT,DELETE,UPDATE ON TABLE public.workflows TO cronwheel_operator;
