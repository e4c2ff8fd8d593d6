-- Partition leases: which instance of a service owns which of the 1024 partitions.

-- name: seed_partitions
INSERT INTO partition_leases (service, partition_id)
SELECT %(service)s, p FROM generate_series(0, 1023) AS p
ON CONFLICT DO NOTHING;

-- name: renew_owned
UPDATE partition_leases
   SET expires_at = %(now)s + make_interval(secs => %(ttl_s)s)
 WHERE service = %(service)s AND owner = %(owner)s
RETURNING partition_id, epoch;

-- name: count_live_owners
-- Instances that hold or recently held a lease, plus the caller: the share each
-- instance aims for is ceil(1024 / live).
SELECT count(DISTINCT owner) FROM (
    SELECT owner FROM partition_leases
     WHERE service = %(service)s AND owner IS NOT NULL AND owner <> %(owner)s
       AND expires_at > %(now)s
    UNION ALL
    SELECT instance FROM lease_members
     WHERE service = %(service)s AND instance <> %(owner)s AND expires_at > %(now)s
) live;

-- name: announce_member
INSERT INTO lease_members (service, instance, expires_at)
VALUES (%(service)s, %(owner)s, %(now)s + make_interval(secs => %(ttl_s)s))
ON CONFLICT (service, instance) DO UPDATE SET expires_at = EXCLUDED.expires_at;

-- name: leave_members
DELETE FROM lease_members WHERE service = %(service)s AND instance = %(owner)s;

-- name: acquire_free
-- Take expired or released partitions; the epoch rises so the former owner's
-- writes are refused from now on.
UPDATE partition_leases l
   SET owner = %(owner)s, epoch = l.epoch + 1,
       expires_at = %(now)s + make_interval(secs => %(ttl_s)s)
  FROM (SELECT service, partition_id FROM partition_leases
         WHERE service = %(service)s AND expires_at <= %(now)s
         ORDER BY partition_id
         LIMIT %(want)s
         FOR UPDATE SKIP LOCKED) free
 WHERE l.service = free.service AND l.partition_id = free.partition_id
RETURNING l.partition_id, l.epoch;

-- name: release
UPDATE partition_leases
   SET owner = NULL, expires_at = '-infinity'
 WHERE service = %(service)s AND owner = %(owner)s AND partition_id = ANY(%(partitions)s);

-- name: verify_and_lock
-- In a writer's transaction: the caller's leases on these partitions, share-locked
-- so a takeover (which raises the epoch) waits until this transaction ends. The
-- caller compares epochs: a plain primary-key lookup keeps the plan trivial even
-- before partition_leases has statistics.
SELECT partition_id, epoch
  FROM partition_leases
 WHERE service = %(service)s AND owner = %(owner)s AND partition_id = ANY(%(partitions)s)
   FOR SHARE;
