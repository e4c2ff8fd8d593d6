// Workflows: the list, one workflow (its graph and its runs), and one workflow
// run (the graph with each node coloured by its state in that run).

import { enc, get, post, q } from "./api.js";
import { dagSvg } from "./dag.js";
import { code, el, empty, pre, stateChip, when } from "./dom.js";
import { act, confirmThen } from "./ui.js";
import { scheduleText } from "./words.js";

const RUNS_PAGE = 20;

export const workflowsPage = {
  title: "Workflows",
  async data({ query }) {
    return get(`/v1/workflows${q({ limit: 200, cursor: query.get("cursor") })}`);
  },
  render(data, { query }) {
    const head = el("div", { class: "page-head" }, el("h1", {}, "Workflows"));
    if (data.items.length === 0) {
      return el("div", {}, head, empty(
        el("p", {}, "No workflows yet."),
        el("p", {}, "A workflow is a DAG of nodes, each a job template: create one with ",
          code("POST /v1/workflows"), " (docs/workflows.md) and it appears here.")));
    }
    return el("div", {}, head,
      el("div", { class: "table-wrap" }, el("table", { class: "cards", id: "workflows" },
        el("thead", {}, el("tr", {}, ["Name", "Schedule", "Nodes", "State", "Next fire", "Fired"].map((c) => el("th", { scope: "col" }, c)))),
        el("tbody", {}, data.items.map((w) => {
          const [written, words] = scheduleText(w.schedule);
          return el("tr", { "data-workflow-id": w.workflow_id },
            el("th", { scope: "row", "data-label": "Name" }, el("a", { href: `#/workflows/${enc(w.workflow_id)}` }, w.name)),
            el("td", { "data-label": "Schedule" }, code(written), el("div", { class: "words" }, words)),
            el("td", { "data-label": "Nodes" }, String(w.node_count)),
            el("td", { "data-label": "State" }, w.paused ? el("span", { class: "paused" }, "paused") : el("span", { class: "active" }, "active")),
            el("td", { "data-label": "Next fire" }, when(w.next_fire_at, { empty: w.schedule ? "none" : "on trigger" })),
            el("td", { "data-label": "Fired" }, String(w.fired_count)));
        })))),
      el("p", { class: "pager" }, data.next_cursor ? el("a", { href: `#/workflows?cursor=${enc(data.next_cursor)}` }, "Next page") : null));
  },
};

function runsTable(items) {
  return el("table", { id: "workflow-runs" },
    el("thead", {}, el("tr", {}, ["State", "Trigger", "Scheduled", "Finished", "Run"].map((c) => el("th", { scope: "col" }, c)))),
    el("tbody", {}, items.map((r) => el("tr", { "data-workflow-run-id": r.workflow_run_id, "data-state": r.state },
      el("td", {}, stateChip(r.state)), el("td", {}, r.trigger), el("td", {}, when(r.scheduled_at)),
      el("td", {}, when(r.finished_at, { empty: "not yet" })),
      el("td", {}, el("a", { href: `#/workflow-runs/${enc(r.workflow_run_id)}`, "data-key": `wfr:${r.workflow_run_id}` }, "Open graph"))))));
}

export const workflowPage = {
  title: "Workflow",
  async data({ id, query }) {
    const [workflow, runs] = await Promise.all([
      get(`/v1/workflows/${enc(id)}`),
      get(`/v1/workflows/${enc(id)}/runs${q({ limit: RUNS_PAGE, cursor: query.get("before") })}`),
    ]);
    return { workflow, runs };
  },
  render({ workflow: w, runs }, { id, query }) {
    const [written, words] = scheduleText(w.schedule);
    const before = query.get("before");
    const trigger = el("button", {
      type: "button", "data-key": `trigger-wf:${w.workflow_id}`,
      onclick: () => confirmThen(`Start a run of "${w.name}" now?`, () => act(`Started a run of "${w.name}".`, async () => {
        const out = await post(`/v1/workflows/${enc(w.workflow_id)}/trigger`);
        location.hash = `#/workflow-runs/${enc(out.workflow_run_id)}`;
      })),
    }, "Trigger");
    return el("div", {},
      el("p", { class: "crumbs" }, el("a", { href: "#/workflows" }, "Workflows"), " / "),
      el("div", { class: "page-head" }, el("h1", {}, w.name), el("div", { class: "actions" }, trigger)),
      el("p", {}, code(written), " ", el("span", { class: "words" }, words), w.paused ? el("span", { class: "paused" }, " (paused)") : null),
      el("h2", {}, "Graph"),
      dagSvg(w.nodes || [], { label: `The nodes of ${w.name} and their dependencies` }),
      el("h2", {}, before ? "Older runs" : "Runs"),
      runs.items.length === 0
        ? empty(el("p", {}, before ? "No older runs." : "No runs yet: press Trigger, or wait for its schedule."))
        : runsTable(runs.items),
      el("p", { class: "pager" },
        before ? el("a", { href: `#/workflows/${enc(id)}` }, "Newest runs") : null, " ",
        runs.next_cursor ? el("a", { href: `#/workflows/${enc(id)}?before=${enc(runs.next_cursor)}` }, "Older runs") : null),
      el("details", {}, el("summary", {}, "The workflow as the API answers it"), pre(w)));
  },
};

const LEGEND = ["WAITING", "CREATED", "PENDING", "RUNNING", "RETRY_WAIT", "SUCCEEDED", "FAILED", "TIMED_OUT", "CANCELLED", "SKIPPED"];

export const workflowRunPage = {
  title: "Workflow run",
  async data({ id }) {
    return get(`/v1/workflow-runs/${enc(id)}`);
  },
  render(r) {
    const cancel = ["RUNNING", "PENDING"].includes(r.state) ? el("button", {
      type: "button", class: "danger", "data-key": `cancel-wfr:${r.workflow_run_id}`,
      onclick: () => confirmThen("Cancel this workflow run? Its pending and running nodes are cancelled.",
        () => act("Cancelled the workflow run.", () => post(`/v1/workflow-runs/${enc(r.workflow_run_id)}/cancel`))),
    }, "Cancel run") : null;
    return el("div", {},
      el("p", { class: "crumbs" }, el("a", { href: "#/workflows" }, "Workflows"), " / ",
        el("a", { href: `#/workflows/${enc(r.workflow_id)}` }, r.workflow_name), " / "),
      el("div", { class: "page-head" }, el("h1", {}, `Run of ${r.workflow_name}`), el("div", { class: "actions" }, cancel)),
      el("p", { id: "wfr-state" }, stateChip(r.state), " ", r.trigger, " · scheduled ", when(r.scheduled_at),
        r.finished_at ? [" · finished ", when(r.finished_at)] : null),
      r.error ? el("p", { class: "error" }, r.error) : null,
      el("h2", {}, "Graph"),
      el("ul", { class: "legend", "aria-label": "Colours" }, LEGEND.map((s) => el("li", {}, stateChip(s)))),
      dagSvg(r.nodes, { label: `The nodes of this run, each with its state` }),
      el("h2", {}, "Nodes"),
      el("table", { id: "nodes" },
        el("thead", {}, el("tr", {}, ["Node", "State", "Attempt", "Waiting on", "Run"].map((c) => el("th", { scope: "col" }, c)))),
        el("tbody", {}, r.nodes.map((n) => el("tr", { "data-node": n.name, "data-state": n.state },
          el("th", { scope: "row" }, n.name), el("td", {}, stateChip(n.state)), el("td", {}, n.attempt ?? "—"),
          el("td", {}, n.pending_deps ? `${n.pending_deps} of ${n.depends_on.length}` : "—"),
          el("td", {}, n.run_id ? el("a", { href: `#/runs/${enc(n.run_id)}` }, "Open run") : el("span", { class: "muted" }, "not created")))))));
  },
};
