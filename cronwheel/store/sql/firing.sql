-- The firing transaction (Firing.fire_due); its claims are in timers.sql.

-- name: firing_settings
-- For the firing transaction only (set_config(..., true) is SET LOCAL): no WAL
-- flush wait at commit (see Firing.fire_due), and no JIT: a storm's batch
-- statements can look costly enough to compile, 0.7 s for one. (Turning off
-- seq scans, sorts and hash joins here as well was tried: it made the storm no
-- faster and the steady loop's p99 lateness 1.8 s instead of 0.1 s.)
SELECT set_config('synchronous_commit', 'off', true),
       set_config('jit', 'off', true);
