-- A move's lease (directory migration 0003, services/router/move_lease.py):
-- which router advances the move now. Every statement is a compare-and-set
-- that returns the lease as it left it; no row back: another router holds it.
-- Times are the directory's clock, so routers on other machines agree.

-- name: acquire
-- Take the lease when nobody holds it, it has expired, or the caller holds it
-- already (then it is renewed). A change of owner takes the next epoch.
INSERT INTO directory_move_leases AS l (move_id, owner, epoch, expires_at)
VALUES (%(move_id)s, %(owner)s, 1, now() + make_interval(secs => %(ttl_s)s))
ON CONFLICT (move_id) DO UPDATE
   SET owner = EXCLUDED.owner,
       epoch = l.epoch + (CASE WHEN l.owner IS NOT DISTINCT FROM EXCLUDED.owner THEN 0 ELSE 1 END),
       expires_at = EXCLUDED.expires_at
 WHERE l.owner IS NOT DISTINCT FROM EXCLUDED.owner OR l.expires_at <= now()
RETURNING move_id, owner, epoch, expires_at;

-- name: renew
-- Only at the epoch the caller took: once another router has taken the lease
-- (after it expired), the former owner's renewal changes nothing.
UPDATE directory_move_leases
   SET expires_at = now() + make_interval(secs => %(ttl_s)s)
 WHERE move_id = %(move_id)s AND owner = %(owner)s AND epoch = %(epoch)s
RETURNING move_id, owner, epoch, expires_at;

-- name: release
-- The move is final or this router stops: expired now, so the next router
-- takes it at once.
UPDATE directory_move_leases
   SET owner = NULL, expires_at = now()
 WHERE move_id = %(move_id)s AND owner = %(owner)s AND epoch = %(epoch)s
RETURNING move_id, owner, epoch, expires_at;

-- name: holder
SELECT move_id, owner, epoch, expires_at FROM directory_move_leases WHERE move_id = %(move_id)s;
