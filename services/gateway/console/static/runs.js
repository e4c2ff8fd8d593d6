// One run: its state, its attempts, payload, result or error.

import { enc, get, post } from "./api.js";
import { code, duration, el, empty, lateness, latenessChip, ms, pre, stateChip, when } from "./dom.js";
import { act, confirmThen } from "./ui.js";
import { targetText } from "./words.js";

const TERMINAL = new Set(["SUCCEEDED", "FAILED", "TIMED_OUT", "CANCELLED", "SKIPPED"]);

export const runPage = {
  title: "Run",
  async data({ id }) {
    return get(`/v1/runs/${enc(id)}`);
  },
  render(run) {
    const dl = (pairs) => el("dl", { class: "facts" }, pairs.filter(Boolean).map(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));
    const owner = run.job_id
      ? el("a", { href: `#/jobs/${enc(run.job_id)}` }, "its job")
      : run.workflow_run_id ? el("a", { href: `#/workflow-runs/${enc(run.workflow_run_id)}` }, "its workflow run") : null;
    const output = run.result && typeof run.result === "object" && "output" in run.result ? run.result.output : null;
    const cancel = TERMINAL.has(run.state) ? null : el("button", {
      type: "button", class: "danger", "data-key": `cancel:${run.run_id}`,
      onclick: () => confirmThen("Cancel this run? A worker holding it will get STALE_ATTEMPT.",
        () => act("Cancelled the run.", () => post(`/v1/runs/${enc(run.run_id)}/cancel`, {}))),
    }, "Cancel run");
    return el("div", {},
      el("p", { class: "crumbs" }, owner ? ["Back to ", owner] : null),
      el("div", { class: "page-head" }, el("h1", {}, "Run ", code(run.run_id)), el("div", { class: "actions" }, cancel)),
      el("p", { class: "run-state", id: "run-state" }, stateChip(run.state),
        ` attempt ${run.attempt}`, run.node ? ` · node ${run.node}` : ""),
      run.error ? el("p", { class: "error", id: "run-error" }, "Error: ", run.error) : null,
      dl([
        ["Scheduled", when(run.scheduled_at)],
        ["Created", [when(run.created_at), " ", latenessChip(lateness(run))]],
        ["Started", when(run.started_at, { empty: "not yet" })],
        ["Finished", [when(run.finished_at, { empty: "not yet" }),
          run.finished_at && run.started_at ? ` (ran ${duration(ms(run.finished_at) - ms(run.started_at))})` : ""]],
        ["Worker", run.worker_id || el("span", { class: "muted" }, "none yet")],
        run.lease_expires_at && !TERMINAL.has(run.state) ? ["Lease until", when(run.lease_expires_at)] : null,
        ["Priority", run.priority],
        ["Target", targetText(run.target)],
        run.covers ? ["Covers", run.covers.map((c) => [when(c), " "])] : null,
        run.reannounced ? ["Announced again", [`${run.reannounced} time(s), last `, when(run.last_reannounced_at)]] : null,
      ]),
      el("h2", {}, "Attempts"),
      run.attempts.length === 0
        ? empty(el("p", {}, "No attempt yet: no worker has started this run. A queue target's worker must consume its topic (docs/workers.md)."))
        : el("table", { id: "attempts" },
          el("thead", {}, el("tr", {}, ["Attempt", "Worker", "Started", "Finished", "Outcome", "Error"].map((c) => el("th", { scope: "col" }, c)))),
          el("tbody", {}, run.attempts.map((a) => el("tr", {},
            el("td", {}, String(a.attempt)), el("td", {}, a.worker_id || "—"), el("td", {}, when(a.started_at)),
            el("td", {}, when(a.finished_at, { empty: "running" })),
            el("td", {}, a.outcome ? stateChip(a.outcome) : el("span", { class: "muted" }, "—")),
            el("td", {}, a.error || "—"))))),
      el("h2", {}, "Payload"), pre(run.payload ?? null),
      el("h2", {}, "Result"),
      run.result === null || run.result === undefined ? el("p", { class: "muted" }, "No result yet.") : pre(run.result),
      output !== null ? [el("h2", {}, "Output tail"), el("pre", { class: "output", tabindex: "0" }, String(output))] : null);
  },
};
