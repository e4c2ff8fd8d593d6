// Jobs: the tenant's table of jobs, and one job (its next fires and its runs).

import { del, enc, get, post, q } from "./api.js";
import { act, confirmThen } from "./ui.js";
import { code, duration, el, empty, lateness, latenessChip, ms, pre, stateChip, when } from "./dom.js";
import { scheduleText, targetText } from "./words.js";

const PAGE = 200;
const RUNS_PAGE = 20;

// The first fire's DST mark per cron job, asked of the preview once per
// (schedule, next fire): a poll that changes nothing asks nothing again.
const dstCache = new Map();

async function nextDst(job) {
  const s = job.schedule || {};
  if (s.cron === undefined || !job.next_fire_at) return null;
  const dst = s.dst || {};
  const key = JSON.stringify([s.cron, s.timezone, dst.gap, dst.repeat, job.next_fire_at]);
  if (!dstCache.has(key)) {
    const from = new Date(ms(job.next_fire_at) - 1).toISOString();
    const p = get(`/v1/schedules/preview${q({ cron: s.cron, timezone: s.timezone, count: 1, from, gap: dst.gap, repeat: dst.repeat })}`)
      .then((r) => (r.fires[0] && r.fires[0].dst) || null, () => null);
    dstCache.set(key, p);
  }
  return dstCache.get(key);
}

function dstMark(dst) {
  if (!dst) return null;
  const words = dst === "gap"
    ? "DST gap: this local time does not exist that day; the fire moves to the first instant after it"
    : "DST repeat: this local time happens twice that day";
  return el("span", { class: `dst dst-${dst}`, title: words }, dst === "gap" ? "DST gap" : "DST repeat");
}

function actions(job, { compact = false } = {}) {
  const id = job.job_id;
  const name = job.name;
  const b = (label, key, cls, text, fn) => el("button", {
    type: "button", class: cls, "data-key": `${key}:${id}`, "aria-label": compact ? `${label} ${name}` : null,
    onclick: () => confirmThen(text, fn),
  }, label);
  return el("div", { class: "actions" },
    job.paused
      ? b("Resume", "toggle", "", `Resume "${name}"? Instants missed while paused go through its catch-up window.`,
        () => act(`Resumed "${name}".`, () => post(`/v1/jobs/${enc(id)}/resume`)))
      : b("Pause", "toggle", "", `Pause "${name}"? It fires nothing until resumed.`,
        () => act(`Paused "${name}".`, () => post(`/v1/jobs/${enc(id)}/pause`))),
    b("Trigger", "trigger", "", `Trigger "${name}" now, outside its schedule?`,
      () => act(`Triggered "${name}": a run was created.`, () => post(`/v1/jobs/${enc(id)}/trigger`))),
    b("Delete", "delete", "danger", `Delete "${name}"? Its pending runs are cancelled. This cannot be undone.`,
      () => act(`Deleted "${name}".`, async () => {
        await del(`/v1/jobs/${enc(id)}`);
        if (!compact) location.hash = "#/jobs";
      })),
  );
}

export const jobsPage = {
  title: "Jobs",
  async data({ query }) {
    const page = await get(`/v1/jobs${q({ limit: PAGE, cursor: query.get("cursor") })}`);
    const dst = await Promise.all(page.items.map(nextDst));
    return { ...page, dst };
  },
  render(data, { query }) {
    const head = el("div", { class: "page-head" }, el("h1", {}, "Jobs"),
      el("p", { class: "muted" }, `${data.items.length} job${data.items.length === 1 ? "" : "s"}${data.next_cursor || query.get("cursor") ? " on this page" : ""}`));
    if (data.items.length === 0) {
      return el("div", {}, head, empty(
        el("p", {}, "No jobs yet."),
        el("p", {}, "Create one with ", code("cronwheel jobs create -f job.json"), " or ",
          code("POST /v1/jobs"), " (docs/api.md); it appears here within a few seconds.")));
    }
    const cols = ["Name", "Schedule", "Time zone", "Target", "Priority", "State", "Next fire", "Fired", "Missed", "Skipped", "Actions"];
    const rows = data.items.map((job, i) => {
      const [written, words] = scheduleText(job.schedule);
      const cell = (label, ...c) => el("td", { "data-label": label }, ...c);
      return el("tr", { "data-job-id": job.job_id, "data-paused": job.paused ? "true" : "false" },
        el("th", { scope: "row", "data-label": "Name" }, el("a", { href: `#/jobs/${enc(job.job_id)}`, "data-key": `open:${job.job_id}` }, job.name)),
        cell("Schedule", code(written), el("div", { class: "words" }, words)),
        cell("Time zone", job.schedule.timezone || (job.schedule.cron !== undefined ? "UTC" : "—")),
        cell("Target", targetText(job.target)),
        cell("Priority", job.priority),
        cell("State", job.paused ? el("span", { class: "paused" }, "paused") : el("span", { class: "active" }, "active")),
        cell("Next fire", when(job.next_fire_at, { empty: job.paused ? "paused" : "none" }), " ", dstMark(data.dst[i])),
        cell("Fired", String(job.fired_count)),
        cell("Missed", String(job.missed_count)),
        cell("Skipped", String(job.overlap_skipped)),
        cell("Actions", actions(job, { compact: true })));
    });
    const more = el("p", { class: "pager" },
      query.get("cursor") ? el("a", { href: "#/jobs" }, "First page") : null, " ",
      data.next_cursor ? el("a", { href: `#/jobs?cursor=${enc(data.next_cursor)}` }, "Next page") : null);
    return el("div", {}, head,
      el("div", { class: "table-wrap" },
        el("table", { class: "jobs cards", id: "jobs" },
          el("caption", { class: "sr-only" }, "Jobs: schedule, target, state, next fire and counters"),
          el("thead", {}, el("tr", {}, cols.map((c) => el("th", { scope: "col" }, c)))),
          el("tbody", {}, rows))),
      more,
      el("p", { class: "muted" }, "Missed: instants older than the catch-up window. Skipped: instants not run because a run was still active (overlap policy)."));
  },
};

function fireTable(fires) {
  return el("table", { class: "fires", id: "fires" },
    el("thead", {}, el("tr", {}, el("th", { scope: "col" }, "#"), el("th", { scope: "col" }, "In your zone"),
      el("th", { scope: "col" }, "In the job's zone"), el("th", { scope: "col" }, "DST"))),
    el("tbody", {}, fires.map((f, i) => el("tr", { "data-dst": f.dst || "" },
      el("td", {}, String(i + 1)), el("td", {}, when(f.at)), el("td", {}, code(f.local)),
      el("td", {}, dstMark(f.dst) || el("span", { class: "muted" }, "—"))))));
}

// One run as a timeline row: waiting (scheduled to started) then running
// (started to finished, or to now), on a scale shared by the page's runs.
function timeline(runs, now) {
  const spans = runs.map((r) => {
    const s = ms(r.scheduled_at);
    const st = ms(r.started_at);
    const end = ms(r.finished_at) ?? now;
    return { wait: Math.max(0, (st ?? end) - s), run: st === null ? 0 : Math.max(0, end - st) };
  });
  const scale = Math.max(1, ...spans.map((x) => x.wait + x.run));
  return el("ol", { class: "timeline", id: "runs" }, runs.map((r, i) => {
    const { wait, run } = spans[i];
    const late = lateness(r);
    return el("li", { class: `tl-row state-row-${r.state.toLowerCase()}`, "data-run-id": r.run_id, "data-state": r.state },
      el("a", { href: `#/runs/${enc(r.run_id)}`, class: "tl-link", "data-key": `run:${r.run_id}` },
        stateChip(r.state), " ", when(r.scheduled_at)),
      el("span", { class: "tl-late" }, latenessChip(late)),
      el("span", { class: "tl-bar", role: "img",
        "aria-label": `waited ${duration(wait)}, ran ${r.started_at ? duration(run) : "not yet"}` },
      el("span", { class: "tl-wait", style: null, "data-w": (100 * wait) / scale }),
      el("span", { class: `tl-run state-bg-${r.state.toLowerCase()}`, "data-w": (100 * run) / scale })),
      el("span", { class: "tl-meta muted" }, `attempt ${r.attempt}`, r.finished_at ? ` · ${duration(ms(r.finished_at) - ms(r.scheduled_at))} in all` : ""));
  }));
}

// Widths set after building: the page's CSP allows no inline style attribute.
export function applyWidths(root) {
  for (const n of root.querySelectorAll("[data-w]")) n.style.width = `${Math.max(0.5, Number(n.dataset.w)).toFixed(2)}%`;
  return root;
}

export const jobPage = {
  title: "Job",
  async data({ id, query }) {
    const job = await get(`/v1/jobs/${enc(id)}`);
    const s = job.schedule || {};
    const dst = s.dst || {};
    const preview = s.cron !== undefined
      ? await get(`/v1/schedules/preview${q({ cron: s.cron, timezone: s.timezone, count: 10, gap: dst.gap, repeat: dst.repeat })}`)
      : null;
    const runs = await get(`/v1/runs${q({ job_id: id, limit: RUNS_PAGE, cursor: query.get("before") })}`);
    return { job, preview, runs };
  },
  render({ job, preview, runs }, { id, query }) {
    const [written, words] = scheduleText(job.schedule);
    const dl = (pairs) => el("dl", { class: "facts" }, pairs.map(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));
    const now = Date.now();
    const before = query.get("before");
    return applyWidths(el("div", {},
      el("p", { class: "crumbs" }, el("a", { href: "#/jobs" }, "Jobs"), " / "),
      el("div", { class: "page-head" }, el("h1", {}, job.name), actions(job)),
      dl([
        ["Schedule", [code(written), " ", el("span", { class: "words" }, words)]],
        ["Time zone", job.schedule.timezone || "UTC"],
        ["Target", targetText(job.target)],
        ["Priority", job.priority],
        ["State", job.paused ? el("span", { class: "paused", id: "job-state" }, "paused") : el("span", { class: "active", id: "job-state" }, "active")],
        ["Next fire", when(job.next_fire_at, { empty: job.paused ? "paused" : "none" })],
        ["Fired / missed / skipped", `${job.fired_count} / ${job.missed_count} / ${job.overlap_skipped}`],
        ["Job id", code(job.job_id)],
      ]),
      el("h2", {}, before ? "Older runs" : "Recent runs"),
      runs.items.length === 0
        ? empty(el("p", {}, before ? "No older runs." : "No runs yet. Its first run appears here when it fires, or press Trigger above."))
        : timeline(runs.items, now),
      el("p", { class: "pager" },
        before ? el("a", { href: `#/jobs/${enc(id)}` }, "Newest runs") : null, " ",
        runs.next_cursor ? el("a", { href: `#/jobs/${enc(id)}?before=${enc(runs.next_cursor)}`, id: "older" }, "Older runs") : null),
      el("h2", {}, "Next ten fires"),
      preview ? fireTable(preview.fires)
        : el("p", { class: "muted" }, "Previews are for cron schedules; this one fires at its next fire above."),
      el("details", {}, el("summary", {}, "The job as the API answers it"), pre(job))));
  },
};
