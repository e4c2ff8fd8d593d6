// Building the page from API data: every text goes in as a text node, never
// as markup, so nothing the API returns is parsed as HTML.

export function el(tag, attrs = {}, ...children) {
  const svg = attrs && attrs.svg;
  const node = svg ? document.createElementNS("http://www.w3.org/2000/svg", tag) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "svg" || v === null || v === undefined || v === false) continue;
    if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else if (k === "text") node.textContent = v;
    else node.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

export const svg = (tag, attrs = {}, ...children) => el(tag, { ...attrs, svg: true }, ...children);

// A UTC instant shown in the viewer's zone, UTC on hover (title).
const local = new Intl.DateTimeFormat(undefined, {
  year: "numeric", month: "short", day: "2-digit",
  hour: "2-digit", minute: "2-digit", second: "2-digit", timeZoneName: "short",
});

export function when(iso, { empty = "—" } = {}) {
  if (!iso) return el("span", { class: "muted" }, empty);
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return el("span", {}, iso);
  return el("time", { datetime: iso, title: `${d.toISOString()} (UTC)` }, local.format(d));
}

export function ms(iso) {
  return iso ? new Date(iso).getTime() : null;
}

// A duration in the largest units that read well: 850 ms, 4.2 s, 3 min 5 s, 2 h 10 min.
export function duration(msValue) {
  if (msValue === null || msValue === undefined || Number.isNaN(msValue)) return "—";
  const sign = msValue < 0 ? "-" : "";
  let v = Math.abs(msValue);
  if (v < 1000) return `${sign}${Math.round(v)} ms`;
  if (v < 60_000) return `${sign}${(v / 1000).toFixed(v < 10_000 ? 1 : 0)} s`;
  v = Math.round(v / 1000);
  if (v < 3600) return `${sign}${Math.floor(v / 60)} min ${v % 60} s`;
  if (v < 86400) return `${sign}${Math.floor(v / 3600)} h ${Math.floor((v % 3600) / 60)} min`;
  return `${sign}${Math.floor(v / 86400)} d ${Math.floor((v % 86400) / 3600)} h`;
}

export const STATES = [
  "PENDING", "RUNNING", "RETRY_WAIT", "SUCCEEDED", "FAILED", "TIMED_OUT", "CANCELLED", "SKIPPED",
];

export function stateChip(state) {
  const s = String(state || "UNKNOWN");
  return el("span", { class: `state state-${s.toLowerCase()}`, "data-state": s }, s.replace("_", " "));
}

// Lateness of a firing: from the scheduled instant to the run's creation.
export function lateness(run) {
  const s = ms(run.scheduled_at), c = ms(run.created_at);
  return s === null || c === null ? null : c - s;
}

export function latenessChip(late) {
  if (late === null) return el("span", { class: "muted" }, "—");
  const cls = late <= 1000 ? "late-ok" : late <= 60_000 ? "late-warn" : "late-bad";
  const words = late <= 0 ? "on time" : `${duration(late)} late`;
  return el("span", { class: `late ${cls}`, title: "from the scheduled instant to the run's creation" }, words);
}

export function empty(...what) {
  return el("div", { class: "empty", role: "status" }, ...what);
}

export function errorBox(e) {
  return el("p", { class: "error", role: "alert" }, e && e.words ? e.words : String(e && e.message ? e.message : e));
}

export function code(text) {
  return el("code", {}, text);
}

export function pre(value) {
  const text = typeof value === "string" ? value : JSON.stringify(value, null, 2);
  return el("pre", { class: "json", tabindex: "0" }, text);
}
