-- The per-tenant topics consumers subscribe to by name (cronwheel/topic_watch.py).
-- Channels: cw_tenants (a tenant_id, from the tenants trigger, migration 0015)
-- cw_topics (a topic name, from whoever created the topic) and cw_destinations
-- ("<tenant>:<type>:<queue>", from the jobs trigger), all in migration 0015.

-- A watch listens only on the channels it acts on (TopicWatch._thread_channels):
-- cw_destinations comes with every job created, and a watch that creates
-- no destination topics would be sent each one for nothing.

-- name: listen_tenants
LISTEN cw_tenants;

-- name: listen_destinations
LISTEN cw_destinations;

-- name: tenant_ids
SELECT tenant_id FROM tenants ORDER BY tenant_id;

-- name: destinations
-- Every job's destination, as cw_destinations names it: read when the watch
-- starts listening, for the jobs created while it did not.
SELECT DISTINCT tenant_id || ':' || (target->>'type') || ':' || coalesce(target->>'queue', '')
  FROM jobs;

-- name: announce_topics
SELECT pg_notify('cw_topics', t) FROM unnest(%(topics)s::text[]) AS t;

-- name: listen_topics
-- Every watch's poll() connection, and its thread's where it wakes the loop
-- (wake_on_announce).
LISTEN cw_topics;
