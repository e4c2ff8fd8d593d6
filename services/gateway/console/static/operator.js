// The operator's pages: tenants (their keys and quotas) and the system
// (readiness, and what the gateway's /metrics says).

import { enc, get, q } from "./api.js";
import { code, el, empty, when } from "./dom.js";

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
    return el("div", {}, head,
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
        el("dt", {}, "Cell"), el("dd", {}, tenant.cell),
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

// Prometheus text format: {name: [{labels, value}]}.
export function parseMetrics(text) {
  const out = {};
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const m = line.match(/^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)/);
    if (!m) continue;
    const labels = {};
    for (const kv of (m[3] || "").matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g)) labels[kv[1]] = kv[2];
    (out[m[1]] ||= []).push({ labels, value: Number(m[4]) });
  }
  return out;
}

const sum = (samples) => (samples || []).reduce((s, x) => s + x.value, 0);

// The smallest bucket bound holding 99% of the observations (cumulative buckets).
export function p99(buckets) {
  if (!buckets || buckets.length === 0) return null;
  const byLe = new Map();
  for (const b of buckets) byLe.set(b.labels.le, (byLe.get(b.labels.le) || 0) + b.value);
  const rows = [...byLe.entries()].map(([le, n]) => [le === "+Inf" ? Infinity : Number(le), n]).sort((a, b) => a[0] - b[0]);
  const total = rows.at(-1)[1];
  if (!total) return null;
  return { bound: rows.find(([, n]) => n >= 0.99 * total)[0], total };
}

export const systemPage = {
  title: "System",
  async data() {
    let ready;
    try {
      ready = await get("/readyz");
    } catch (e) {
      ready = { status: "not ready", checks: {}, error: e.words || String(e) };
    }
    const m = parseMetrics(await get("/metrics", { accept: "text" }));
    const late = p99(m.cronwheel_firing_lateness_seconds_bucket);
    return {
      ready,
      dead: m.cronwheel_dead_letters_total ? sum(m.cronwheel_dead_letters_total) : null,
      late,
      lag: (m.cronwheel_consumer_lag || []).map((s) => [s.labels.consumer, s.value]),
      fired: m.cronwheel_runs_fired_total ? sum(m.cronwheel_runs_fired_total) : null,
      requests: sum(m.cronwheel_http_requests_total),
      errors5xx: sum((m.cronwheel_http_requests_total || []).filter((s) => String(s.labels.status).startsWith("5"))),
    };
  },
  render(d) {
    const notHere = "not reported by the gateway's /metrics (the service that counts it serves its own, docs/observability.md)";
    return el("div", {},
      el("h1", {}, "System"),
      el("h2", {}, "Readiness"),
      el("p", { id: "readiness", class: d.ready.status === "ready" ? "ok" : "error", "data-status": d.ready.status },
        d.ready.status === "ready" ? "Ready: " : "Not ready: ",
        Object.entries(d.ready.checks || {}).map(([k, v]) => `${k} ${v}`).join(", ") || d.ready.error || ""),
      el("h2", {}, "From /metrics"),
      el("dl", { class: "facts", id: "metrics" },
        el("dt", {}, "Dead letters"), el("dd", {}, d.dead === null ? el("span", { class: "muted" }, notHere) : String(d.dead)),
        el("dt", {}, "Firing lateness p99"), el("dd", {}, d.late ? `≤ ${d.late.bound === Infinity ? "more than the largest bucket" : `${d.late.bound} s`} (${d.late.total} firings)` : el("span", { class: "muted" }, notHere)),
        el("dt", {}, "Runs fired"), el("dd", {}, d.fired === null ? el("span", { class: "muted" }, notHere) : String(d.fired)),
        el("dt", {}, "Consumer lag"), el("dd", {}, d.lag.length ? d.lag.map(([c, v]) => `${c}: ${v}`).join(", ") : el("span", { class: "muted" }, notHere)),
        el("dt", {}, "HTTP requests answered"), el("dd", {}, `${d.requests} (${d.errors5xx} with a 5xx)`)),
      el("p", { class: "muted" }, "Counts since the gateway's processes started. For history and alerts use the Grafana dashboard and the alerting rules in deploy/."));
  },
};
