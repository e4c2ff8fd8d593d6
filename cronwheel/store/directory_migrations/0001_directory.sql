-- The directory of cells (docs/cells.md): which cell each tenant is homed in,
-- with an epoch that only grows, in a database of its own (no cell's). It
-- holds no tenant data: ids, cells, epochs and states; a tenant's name, keys
-- and everything else stay in its cell.
--
-- Written by the operator API (a tenant's placement) and, later, the move
-- protocol (compare-and-set on the epoch); read by routers and gateways
-- through a cache (cronwheel/directory.py).
SET LOCAL lock_timeout = '5s';
SET LOCAL statement_timeout = '60s';

-- The roles are the cluster's (migration 0018 of the cells' schema makes
-- them); a directory on a cluster of its own makes them here.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'cronwheel_platform') THEN
        CREATE ROLE cronwheel_platform NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'cronwheel_gateway') THEN
        CREATE ROLE cronwheel_gateway NOLOGIN NOINHERIT;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'cronwheel_operator') THEN
        CREATE ROLE cronwheel_operator NOLOGIN;
    END IF;
    IF NOT pg_has_role('cronwheel_gateway', 'cronwheel_operator', 'MEMBER') THEN
        GRANT cronwheel_operator TO cronwheel_gateway;
    END IF;
    IF NOT pg_has_role('cronwheel_platform', 'cronwheel_gateway', 'MEMBER') THEN
        GRANT cronwheel_gateway TO cronwheel_platform;
    END IF;
END $$;

-- The cells, registered by whoever runs them (`cronwheel migrate` on the
-- local stack). `position` orders them (then `name`); the first is the
-- default cell, where a tenant created without a `cell` is homed.
CREATE TABLE directory_cells (
    name            text PRIMARY KEY CHECK (name ~ '^[a-z0-9-]{1,50}$'),
    position        int NOT NULL CHECK (position >= 0),
    api_url         text NOT NULL,
    kafka_bootstrap text NOT NULL,
    registered_at   timestamptz NOT NULL DEFAULT now()
);

-- A tenant's home. `epoch` starts at 1 and grows by one with every change of
-- `cell`, so a writer that read epoch E changes the row only while it is
-- still E (compare-and-set): two movers cannot both win. `state`: `active`
-- (served by `cell`), `moving` (a move is copying it out of `cell`, which
-- still serves it), `frozen` (its writes are refused while the move drains
-- and switches).
CREATE TABLE directory_tenants (
    tenant_id  text PRIMARY KEY CHECK (tenant_id ~ '^[A-Za-z0-9_-]{1,100}$'),
    cell       text NOT NULL REFERENCES directory_cells (name),
    epoch      bigint NOT NULL DEFAULT 1 CHECK (epoch >= 1),
    state      text NOT NULL DEFAULT 'active' CHECK (state IN ('active', 'moving', 'frozen')),
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX directory_tenants_cell ON directory_tenants (cell);

-- Every service reads; only the operator (what the gateway becomes for an
-- operator request) places tenants. The cells' registration is the owner's.
GRANT SELECT ON directory_cells, directory_tenants
    TO cronwheel_platform, cronwheel_gateway, cronwheel_operator;
GRANT INSERT, UPDATE ON directory_tenants TO cronwheel_operator;
