-- A new tenant is announced on the channel cw_tenants (payload: its tenant_id)
-- when its row commits, so the dispatcher creates and subscribes to its run
-- topic before the tenant's first job can fire (cronwheel/topic_watch.py).
-- A trigger, not a NOTIFY in one code path: every way a tenant is created
-- (the API, the demo, a move into this cell) announces it.
CREATE FUNCTION cronwheel_notify_tenant() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('cw_tenants', NEW.tenant_id);
    RETURN NULL;
END
$$;

CREATE TRIGGER tenants_notify
    AFTER INSERT ON tenants
    FOR EACH ROW EXECUTE FUNCTION cronwheel_notify_tenant();

-- A job's destination (tenant, target type, queue) is announced on
-- cw_destinations when the job is created or its target changes, so the
-- dispatcher creates the destination topic before the job's first run rather
-- than in its path (and a worker that subscribes to its queue finds it).
-- Payload: "<tenant_id>:<type>:<queue>", the queue empty for other types.
CREATE FUNCTION cronwheel_notify_destination() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify(
        'cw_destinations',
        NEW.tenant_id || ':' || (NEW.target->>'type') || ':' || coalesce(NEW.target->>'queue', ''));
    RETURN NULL;
END
$$;

CREATE TRIGGER jobs_notify_destination
    AFTER INSERT OR UPDATE OF target ON jobs
    FOR EACH ROW EXECUTE FUNCTION cronwheel_notify_destination();
