// The operator's pages: tenants (their cells, keys and quotas) and the
// system (GET /v1/system: services, consumer lag, dead letters, lateness,
// backlogs; this gateway's /readyz).

import { enc, get, q, session } from "./api.js";
import { code, duration, el, empty, when } from "./dom.js";

const TENANTS_PAGE = 50;

export const tenantsPage = {
  title: "Tenants",
  async data({ query }) {
    const page = await get(`/v1/tenants${q({ limit: TENANTS_PAGE, cursor: query.get("cursor") })}`);
    const objects = await Promise.all(page.items.map((t) => get(`/v1/tenants/${enc(t.tenant_id)}/quotas/objects`).catch(() => null)));
    return { ...page, objects };
  },
  render(data) {
    const head = el("div", { class: "page-head" }, el("h1", {}, "Tenants"));
    if (data.items.length === 0) {
      return el("div", {}, head, empty(el("p", {}, "No tenants yet. Create one with ",
        code("cronwheel tenants create NAME"), " or ", code("POST /v1/tenants"), "; its first key is shown once, there.")));
    }
    const use = (o, kind) => (o && o[kind] ? `${o[kind].count} / ${o[kind].limit}` : "—");
    // With cells (a router in front lists every cell's tenants), how many of this page live in each.
    const perCell = new Map();
    for (const t of data.items) perCell.set(t.cell, (perCell.get(t.cell) || 0) + 1);
    const cells = perCell.size > 1
      ? el("p", { id: "cells", class: "muted" }, "On this page, by cell: ",
        [...perCell.entries()].sort().map(([c, n]) => `${c} ${n}`).join(", "), ". A tenant's data lives only in its cell (docs/cells.md).")
      : null;
    return el("div", {}, head, cells,
      el("div", { class: "table-wrap" }, el("table", { class: "cards", id: "tenants" },
        el("thead", {}, el("tr", {}, ["Name", "Tenant id", "Cell", "Priority classes", "Keys", "Jobs", "Workflows", "Created"].map((c) => el("th", { scope: "col" }, c)))),
        el("tbody", {}, data.items.map((t, i) => el("tr", { "data-tenant-id": t.tenant_id },
          el("th", { scope: "row", "data-label": "Name" }, el("a", { href: `#/tenants/${enc(t.tenant_id)}` }, t.name)),
          el("td", { "data-label": "Tenant id" }, code(t.tenant_id)),
          el("td", { "data-label": "Cell" }, t.cell),
          el("td", { "data-label": "Priority classes" }, t.priority_classes.join(", ")),
          el("td", { "data-label": "Keys" }, use(data.objects[i], "keys")),
          el("td", { "data-label": "Jobs" }, use(data.objects[i], "jobs")),
          el("td", { "data-label": "Workflows" }, use(data.objects[i], "workflows")),
          el("td", { "data-label": "Created" }, when(t.created_at))))))),
      el("p", { class: "muted" }, "Keys, jobs, workflows: held / the tenant's limit."),
      el("p", { class: "pager" }, data.next_cursor ? el("a", { href: `#/tenants?cursor=${enc(data.next_cursor)}` }, "Next page") : null));
  },
};

export const tenantPage = {
  title: "Tenant",
  async data({ id }) {
    const t = enc(id);
    const [tenant, keys, objects, rates] = await Promise.all([
      get(`/v1/tenants/${t}`), get(`/v1/tenants/${t}/keys?limit=200`),
      get(`/v1/tenants/${t}/quotas/objects`), get(`/v1/tenants/${t}/quotas`),
    ]);
    return { tenant, keys, objects, rates };
  },
  render({ tenant, keys, objects, rates }) {
    const bucket = (b) => (b ? `${b.rate_per_s}/s, burst ${b.burst}, ${b.tokens} tokens now, held back ${b.held_total} so far` : "no limit");
    return el("div", {},
      el("p", { class: "crumbs" }, el("a", { href: "#/tenants" }, "Tenants"), " / "),
      el("h1", {}, tenant.name),
      el("dl", { class: "facts" },
        el("dt", {}, "Tenant id"), el("dd", {}, code(tenant.tenant_id)),
        el("dt", {}, "Cell"), el("dd", { id: "tenant-cell" }, tenant.cell,
          tenant.state && tenant.state !== "active" ? el("span", { class: "paused" }, ` (${tenant.state}: being moved between cells)`) : null),
        el("dt", {}, "Priority classes"), el("dd", {}, tenant.priority_classes.join(", ")),
        el("dt", {}, "Created"), el("dd", {}, when(tenant.created_at))),
      el("h2", {}, "Quotas"),
      el("table", { id: "quotas" },
        el("thead", {}, el("tr", {}, ["Kind", "Held", "Limit", "Default"].map((c) => el("th", { scope: "col" }, c)))),
        el("tbody", {}, Object.entries(objects).map(([kind, v]) => el("tr", {},
          el("th", { scope: "row" }, kind), el("td", {}, String(v.count)), el("td", {}, String(v.limit)), el("td", {}, String(v.default)))))),
      el("dl", { class: "facts" },
        el("dt", {}, "Firing rate"), el("dd", {}, bucket(rates.fire)),
        el("dt", {}, "Dispatch rate"), el("dd", {}, bucket(rates.dispatch))),
      el("h2", {}, "Keys"),
      keys.items.length === 0 ? empty(el("p", {}, "No keys. Issue one with ", code(`POST /v1/tenants/${tenant.tenant_id}/keys`), "."))
        : el("table", { id: "keys" },
          el("thead", {}, el("tr", {}, ["Key id", "Label", "Created", "Revoked"].map((c) => el("th", { scope: "col" }, c)))),
          el("tbody", {}, keys.items.map((k) => el("tr", { class: k.revoked_at ? "revoked" : "" },
            el("td", {}, code(k.key_id)), el("td", {}, k.label || "—"), el("td", {}, when(k.created_at)),
            el("td", {}, when(k.revoked_at, { empty: "in use" })))))),
      el("p", { class: "muted" }, "Secrets are never shown again: a key's secret was in the answer that issued it only."));
  },
};

// A section of GET /v1/system that could not be read says why in its place.
function failed(section, what) {
  return section && section.error ? el("p", { class: "error", role: "alert" }, `${what} could not be read: ${section.error}.`) : null;
}

const count = (n, capped) => (capped ? `at least ${n.toLocaleString("en")}` : Number(n).toLocaleString("en"));
const msOrDash = (v) => (v === null || v === undefined ? "—" : duration(v));

function readinessTable(services, consumers) {
  const rows = [];
  for (const s of (services && services.items) || []) {
    const why = s.ready ? "Ready"
      : s.instances === 0 ? "Not ready: no instance holds a lease"
      : `Not ready: ${s.partitions - s.partitions_leased} of ${s.partitions} partitions unleased`;
    rows.push(el("tr", { "data-kind": s.kind, "data-ready": String(s.ready) },
      el("th", { scope: "row", "data-label": "Service" }, s.kind),
      el("td", { "data-label": "Instances" }, String(s.instances)),
      el("td", { "data-label": "Partitions leased" }, `${s.partitions_leased} / ${s.partitions}`),
      el("td", { "data-label": "Lease until" }, when(s.lease_until)),
      el("td", { "data-label": "Status", class: s.ready ? "ok" : "late-bad" }, why)));
  }
  // The workflow service reads by subscription, not leases: its group's members say it runs.
  for (const c of (consumers && consumers.items) || []) {
    if (c.consumer !== "workflow" || c.error) continue;
    const up = c.members > 0;
    rows.push(el("tr", { "data-kind": "workflow", "data-ready": String(up) },
      el("th", { scope: "row", "data-label": "Service" }, "workflow"),
      el("td", { "data-label": "Instances" }, String(c.members)),
      el("td", { "data-label": "Partitions leased" }, el("span", { class: "muted" }, "by its consumer group")),
      el("td", { "data-label": "Lease until" }, el("span", { class: "muted" }, "—")),
      el("td", { "data-label": "Status", class: up ? "ok" : "late-bad" }, up ? "Ready" : `Not ready: no member in group ${c.group} (${groupState(c)})`)));
  }
  if (rows.length === 0) {
    return empty(el("p", {}, "No service has taken a partition lease on this cell's database yet. Start them with ",
      code("cronwheel dev"), " or ", code("cronwheel serve timer relay dispatcher ..."), "."));
  }
  return el("div", { class: "table-wrap" }, el("table", { class: "cards", id: "services" },
    el("thead", {}, el("tr", {}, ["Service", "Instances", "Partitions leased", "Lease until", "Status"].map((c) => el("th", { scope: "col" }, c)))),
    el("tbody", {}, rows)));
}

// A consumer group's state in words: the broker says "dead" of a group it
// holds nothing for (its consumer never committed), "empty" of one without members.
const GROUP_STATES = { dead: "no group yet", empty: "no members", stable: "stable" };
const groupState = (c) => GROUP_STATES[c.state] || c.state;

function consumersTable(consumers) {
  const items = (consumers && consumers.items) || [];
  return el("div", { class: "table-wrap" }, el("table", { class: "cards", id: "consumers" },
    el("thead", {}, el("tr", {}, ["Consumer", "Lag (records)", "Partitions committed", "Members", "Group"].map((c) => el("th", { scope: "col" }, c)))),
    el("tbody", {}, items.map((c) => el("tr", { "data-consumer": c.consumer, "data-lag": c.error ? "" : String(c.lag) },
      el("th", { scope: "row", "data-label": "Consumer" }, c.consumer),
      c.error
        ? el("td", { colspan: 4, class: "error", "data-label": "Lag" }, c.error)
        : [el("td", { "data-label": "Lag (records)", class: c.lag > 5000 ? "late-bad" : c.lag > 0 ? "late-warn" : "ok" }, c.lag.toLocaleString("en")),
          el("td", { "data-label": "Partitions committed" }, `${c.committed_partitions} / ${c.partitions}`),
          el("td", { "data-label": "Members" }, c.members === null ? c.state : `${c.members} (${groupState(c)})`),
          el("td", { "data-label": "Group" }, code(c.group))])))));
}

function deadLetters(d) {
  if (d.error) return failed(d, "The dead letters");
  const head = el("p", { id: "dead-letter-count", "data-count": String(d.count) },
    d.count === 0 ? "None: every record the consumers read was processed." : `${d.count.toLocaleString("en")} retained on `, d.count ? code(d.topic) : null);
  if (d.count === 0) return el("div", { id: "dead-letters" }, head);
  return el("div", { id: "dead-letters" }, head,
    el("div", { class: "table-wrap" }, el("table", { class: "cards" },
      el("thead", {}, el("tr", {}, ["Set aside", "Consumer", "Reason", "From", "Key"].map((c) => el("th", { scope: "col" }, c)))),
      el("tbody", {}, d.recent.map((x) => el("tr", {},
        el("td", { "data-label": "Set aside" }, when(x.at)),
        el("td", { "data-label": "Consumer" }, x.consumer || "—"),
        el("td", { "data-label": "Reason", class: "dead-reason" }, x.reason || x.error),
        el("td", { "data-label": "From" }, x.source_topic ? code(`${x.source_topic}[${x.source_partition}]@${x.source_offset}`) : "—"),
        el("td", { "data-label": "Key" }, x.key ? code(x.key) : "—")))))),
    el("p", { class: "muted" }, "The newest first. Fix the cause, then replay a record's ", code("value"), " onto its source topic (docs/dispatcher.md, \"Dead letters\")."));
}

function latenessFacts(l, minutes) {
  if (l.error) return failed(l, "Lateness");
  if (l.fired.runs === 0) {
    return el("div", { id: "lateness", "data-runs": "0" }, empty(el("p", {}, `No job had an instant in the last ${minutes} min, so there is no lateness to show. `,
      "Jobs that fire often show it here within a few seconds.")));
  }
  return el("dl", { class: "facts", id: "lateness", "data-runs": String(l.fired.runs), "data-fired-p99-ms": String(l.fired.p99_ms) },
    el("dt", {}, "Fired (instant → run created)"),
    el("dd", {}, `p50 ${msOrDash(l.fired.p50_ms)}, p99 ${msOrDash(l.fired.p99_ms)}, max ${msOrDash(l.fired.max_ms)} over ${l.fired.runs.toLocaleString("en")} runs`),
    el("dt", {}, "Started (instant → first attempt's start)"),
    el("dd", {}, l.started.runs ? `p50 ${msOrDash(l.started.p50_ms)}, p99 ${msOrDash(l.started.p99_ms)} over ${l.started.runs.toLocaleString("en")} runs` : el("span", { class: "muted" }, "none started yet")));
}

function backlogFacts(d) {
  const o = d.outbox, t = d.timers, r = d.runs;
  return el("dl", { class: "facts", id: "backlogs" },
    el("dt", {}, "Outbox (relay)"),
    el("dd", { id: "outbox" }, o.error ? failed(o, "The outbox")
      : o.ready === 0 ? `empty${o.held ? `; ${o.held} fired ahead, held until their instant` : ""}`
      : [`${count(o.ready, o.capped)} to publish, the oldest written ${msOrDash(o.oldest_ready_age_ms)} ago`, o.held ? `; ${o.held} held until their instant` : ""]),
    el("dt", {}, "Timers overdue (timer)"),
    el("dd", { id: "timers-overdue" }, t.error ? failed(t, "The timers")
      : t.overdue === 0 ? "none" : [`${count(t.overdue, t.capped)} more than ${duration(t.overdue_after_ms)} past due, the oldest due `, when(t.oldest_due_at)]),
    el("dt", {}, "Open runs"),
    el("dd", {}, r.error ? failed(r, "The runs") : `${count(r.pending, r.capped)} pending, ${r.running} running, ${r.retry_wait} waiting to retry`),
    el("dt", {}, "Announced again (pending deadline)"),
    el("dd", { id: "reannounced" }, r.error ? "—"
      : r.reannounced_waiting === 0 && r.reannounced_recently === 0 ? "none: every pending run was started within its deadline"
      : [`${r.reannounced_waiting} still pending after being announced again; ${r.reannounced_recently} announced again recently`, r.last_reannounced_at ? ", the last " : "", r.last_reannounced_at ? when(r.last_reannounced_at) : ""]));
}

// The page's first lines: each figure in a word and a colour, the details below.
function tile(id, label, value, level) {
  return el("li", { class: `tile tile-${level}`, id: `tile-${id}`, "data-level": level },
    el("span", { class: "tile-label" }, label), el("strong", {}, value));
}

function summary(s) {
  const tiles = [];
  const services = (s.services && s.services.items) || [];
  const workflow = ((s.consumers && s.consumers.items) || []).filter((c) => c.consumer === "workflow" && !c.error);
  const all = services.length + workflow.length;
  const ready = services.filter((x) => x.ready).length + workflow.filter((c) => c.members > 0).length;
  tiles.push(s.services.error ? tile("services", "Services ready", "unknown", "bad")
    : tile("services", "Services ready", all ? `${ready} of ${all}` : "none seen", all && ready === all ? "ok" : "bad"));
  if (s.consumers.error) tiles.push(tile("lag", "Consumer lag", "unknown", "bad"));
  else {
    const lag = s.consumers.items.reduce((n, c) => n + (c.lag || 0), 0);
    tiles.push(tile("lag", "Consumer lag", `${lag.toLocaleString("en")} records`, lag > 5000 ? "bad" : lag > 0 ? "warn" : "ok"));
  }
  const d = s.dead_letters;
  tiles.push(d.error ? tile("dead", "Dead letters", "unknown", "bad")
    : tile("dead", "Dead letters", d.count.toLocaleString("en"), d.count ? "bad" : "ok"));
  const l = s.lateness;
  const p99 = l.error ? null : l.fired.p99_ms;
  tiles.push(tile("lateness", "Firing lateness p99", l.error ? "unknown" : msOrDash(p99),
    l.error ? "bad" : p99 === null ? "none" : p99 <= 1000 ? "ok" : p99 <= 60_000 ? "warn" : "bad"));
  const o = s.outbox;
  tiles.push(o.error ? tile("outbox", "Outbox", "unknown", "bad")
    : tile("outbox", "Outbox", o.ready ? `${count(o.ready, o.capped)}, oldest ${msOrDash(o.oldest_ready_age_ms)}` : "empty",
      !o.ready ? "ok" : o.oldest_ready_age_ms > 5000 ? "bad" : "warn"));
  const t = s.timers;
  tiles.push(t.error ? tile("timers", "Timers overdue", "unknown", "bad")
    : tile("timers", "Timers overdue", count(t.overdue, t.capped), t.overdue ? "bad" : "ok"));
  return el("ul", { class: "tiles", id: "summary", "aria-label": "Summary" }, tiles);
}

const WINDOWS = [1, 5, 15, 60];

export const systemPage = {
  title: "System",
  async data({ query }) {
    let ready;
    try {
      ready = await get("/readyz");
    } catch (e) {
      ready = { status: "not ready", checks: {}, error: e.words || String(e) };
    }
    if ((session() || {}).role !== "operator") {
      return { ready, system: null };
    }
    const minutes = WINDOWS.includes(Number(query.get("minutes"))) ? Number(query.get("minutes")) : 5;
    // Through the router, /readyz names every cell, and ?cell= asks for one's health.
    const cells = Array.isArray(ready.cells) ? ready.cells : [];
    const cell = cells.includes(query.get("cell")) ? query.get("cell") : null;
    const system = await get(`/v1/system${q({ minutes, cell })}`);
    return { ready, system, minutes, cells };
  },
  render(d) {
    const readiness = el("p", { id: "readiness", class: d.ready.status === "ready" ? "ok" : "error", "data-status": d.ready.status },
      d.ready.status === "ready" ? "This gateway is ready: " : "This gateway is not ready: ",
      Object.entries(d.ready.checks || {}).map(([k, v]) => `${k} ${v}`).join(", ") || d.ready.error || "");
    if (!d.system) return el("div", {}, el("h1", {}, "System"), readiness);
    const s = d.system;
    const link = (params) => `#/system${q({ minutes: d.minutes, cell: s.cell, ...params })}`;
    return el("div", {},
      el("div", { class: "page-head" },
        el("h1", {}, "System"),
        el("p", { class: "muted" }, `Cell ${s.cell}. Figures as of `, when(s.as_of), `, at most ${s.cache_ms / 1000} s old.`)),
      readiness,
      d.cells.length > 1 ? el("p", { class: "pager", id: "cell-switch" }, "Cell: ", d.cells.map((c) => (c === s.cell
        ? el("strong", { "aria-current": "true" }, c)
        : el("a", { href: link({ cell: c }) }, c)))) : null,
      summary(s),
      el("h2", {}, "Services"),
      failed(s.services, "The partition leases") || readinessTable(s.services, s.consumers),
      el("h2", {}, "Consumer lag"),
      failed(s.consumers, "Consumer lag") || consumersTable(s.consumers),
      el("p", { class: "muted" }, "Records on the topics each consumer reads that its group has not committed yet (it commits every few seconds)."),
      el("h2", {}, "Dead letters"),
      deadLetters(s.dead_letters),
      el("h2", {}, `Lateness, last ${d.minutes} min`),
      el("p", { class: "pager", id: "windows" }, "Window: ", WINDOWS.map((m) => (m === d.minutes
        ? el("strong", { "aria-current": "true" }, `${m} min`)
        : el("a", { href: link({ minutes: m }) }, `${m} min`)))),
      latenessFacts(s.lateness, d.minutes),
      el("p", { class: "muted" }, "Runs of jobs whose scheduled instant is in the window, from the runs table; the timer's own histogram (cronwheel_firing_lateness_seconds) is on the Grafana dashboard in deploy/."),
      el("h2", {}, "Backlogs"),
      backlogFacts(s));
  },
};
