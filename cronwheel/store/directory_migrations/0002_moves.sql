-- Moves of tenants between cells (docs/cells.md, "Moving a tenant"): one row
-- per move, written by the mover (cronwheel/moves.py) as it advances through
-- its steps, each write a compare-and-set on the row's `state` so two movers
-- cannot both take a step. The tenant's placement (directory_tenants) changes
-- only by its own compare-and-set on the epoch; `epoch` here is the one the
-- move read when it was recorded.
SET LOCAL lock_timeout = '5s';
SET LOCAL statement_timeout = '60s';

CREATE TABLE directory_moves (
    move_id     text PRIMARY KEY,
    tenant_id   text NOT NULL REFERENCES directory_tenants (tenant_id),
    source      text NOT NULL REFERENCES directory_cells (name),
    target      text NOT NULL REFERENCES directory_cells (name),
    epoch       bigint NOT NULL CHECK (epoch >= 1),
    state       text NOT NULL DEFAULT 'copying'
                CHECK (state IN ('copying', 'freezing', 'switching', 'done', 'failed',
                                 'rolled_back')),
    error       text,
    started_at  timestamptz NOT NULL DEFAULT now(),
    frozen_at   timestamptz,
    unfrozen_at timestamptz,
    finished_at timestamptz,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    CHECK (source <> target),
    CHECK ((state IN ('done', 'failed', 'rolled_back')) = (finished_at IS NOT NULL))
);
-- At most one open move per tenant.
CREATE UNIQUE INDEX directory_moves_open ON directory_moves (tenant_id)
 WHERE state IN ('copying', 'freezing', 'switching');
CREATE INDEX directory_moves_tenant ON directory_moves (tenant_id, started_at DESC);

GRANT SELECT ON directory_moves TO cronwheel_platform, cronwheel_gateway, cronwheel_operator;
GRANT INSERT, UPDATE ON directory_moves TO cronwheel_operator;
