-- Moving a tenant between cells (docs/cells.md, "Moving a tenant"): a
-- tenant's state in this cell's database, and the timers a freeze set aside.
--
-- tenants.state: `active` (served and fired here), `standby` (a move is
-- copying the tenant in: its rows are here, its timers are never claimed),
-- `frozen` (a move is taking the tenant out: its timers are parked, nothing
-- of it fires here), `moved` (another cell serves it; its rows wait for the
-- cleanup). Only the mover (cronwheel/moves.py, as the database's owner)
-- writes a state other than `active`.
-- tenants is small (one row per tenant) and a constant default rewrites
-- nothing; the lock is short, but give up rather than queue behind a long
-- transaction.
SET LOCAL lock_timeout = '2s';
SET LOCAL statement_timeout = '30s';
-- squawk-ignore adding-field-with-default -- a constant default is catalog-only since PostgreSQL 11
ALTER TABLE tenants
    ADD COLUMN state text NOT NULL DEFAULT 'active';
-- NOT VALID: every existing row has the default, and every row written from
-- now on is checked.
ALTER TABLE tenants ADD CONSTRAINT tenants_state_check
    CHECK (state IN ('active', 'standby', 'frozen', 'moved')) NOT VALID;

-- The firing loop's claims skip the timers of a tenant that is not active
-- here (sql/timers.sql): a probe of this index per due timer, which holds
-- only the tenants being moved in or out (almost always none).
-- squawk-ignore require-concurrent-index-creation -- tenants is one row per tenant; the build takes milliseconds
CREATE INDEX tenants_not_active ON tenants (tenant_id) WHERE state <> 'active';

-- A frozen tenant's timers, taken out of `timers` in the freeze's
-- transaction (so no firing transaction can claim them once it commits) and
-- copied to the target from here; put back if the move is rolled back.
-- Only the mover (the owner) writes it; the platform may read and write it
-- and the roles' policies are timers' (0018: every table is the platform's,
-- with the three policies), though no service uses it.
CREATE TABLE timers_parked (
    partition_id smallint NOT NULL,
    timer_id     text NOT NULL,
    kind         text NOT NULL,
    owner_id     text NOT NULL,
    due_at       timestamptz NOT NULL,
    priority     smallint NOT NULL,
    attempt      integer,
    tenant_id    text NOT NULL,
    PRIMARY KEY (partition_id, timer_id)
);
CREATE INDEX timers_parked_tenant ON timers_parked (tenant_id);
GRANT SELECT, INSERT, UPDATE, DELETE ON timers_parked TO cronwheel_platform;
ALTER TABLE timers_parked ENABLE ROW LEVEL SECURITY;
CREATE POLICY platform ON timers_parked TO cronwheel_platform USING (true);
CREATE POLICY operator ON timers_parked TO cronwheel_operator USING (true);
CREATE POLICY tenant_scope ON timers_parked TO cronwheel_gateway
    USING (tenant_id = cronwheel_tenant_scope());
