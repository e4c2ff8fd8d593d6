-- One mover per move (docs/cells.md, "One mover per move"): a router advances
-- a move only while it holds the move's lease here, so two routers resuming
-- the same open move (both started after a mover died, or one resuming what
-- another still runs) do not run its steps side by side. The lease is taken
-- and renewed by compare-and-set on (owner, epoch), as partition_leases are
-- in a cell, on the directory's clock (now()) so the routers' clocks do not
-- matter; `epoch` grows with every change of owner, so a router that lost
-- the lease cannot renew it. services/router/move_lease.py, SQL in
-- sql/directory_leases.sql.
SET LOCAL lock_timeout = '5s';
SET LOCAL statement_timeout = '60s';

CREATE TABLE directory_move_leases (
    move_id    text PRIMARY KEY REFERENCES directory_moves (move_id) ON DELETE CASCADE,
    owner      text,
    epoch      bigint NOT NULL DEFAULT 1 CHECK (epoch >= 1),
    -- A released lease: owner NULL and expired at its release.
    expires_at timestamptz NOT NULL
);

-- The routers write as the operator (the mover's role in the directory).
GRANT SELECT ON directory_move_leases TO cronwheel_platform, cronwheel_gateway, cronwheel_operator;
GRANT INSERT, UPDATE ON directory_move_leases TO cronwheel_operator;
