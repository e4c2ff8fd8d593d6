// The console's shell: sign-in, the pages' router (the part of the URL after
// `#`, which never holds the key), and the live refresh: every POLL_MS the
// current page asks the API again and is redrawn only if the answer changed,
// without reloading the document; focus stays on the control it was on.

import { ApiError, session, signIn, signOut } from "./api.js";
import { el, errorBox } from "./dom.js";
import { onRedraw } from "./ui.js";
import { jobPage, jobsPage } from "./jobs.js";
import { runPage } from "./runs.js";
import { systemPage, tenantPage, tenantsPage } from "./operator.js";
import { workflowPage, workflowRunPage, workflowsPage } from "./workflows.js";

export const POLL_MS = 3000;

const ROUTES = {
  tenant: [
    ["jobs", jobsPage], ["jobs/:id", jobPage], ["runs/:id", runPage],
    ["workflows", workflowsPage], ["workflows/:id", workflowPage], ["workflow-runs/:id", workflowRunPage],
    ["system", systemPage],
  ],
  operator: [["tenants", tenantsPage], ["tenants/:id", tenantPage], ["system", systemPage]],
};
const NAV = {
  tenant: [["jobs", "Jobs"], ["workflows", "Workflows"]],
  operator: [["tenants", "Tenants"], ["system", "System"]],
};

const main = document.getElementById("main");
let current = { key: null, page: null, params: null, data: undefined };
let loading = false;
let again = false; // a forced refresh asked for while one was loading

function parseHash() {
  const raw = decodeURIComponent(location.hash.replace(/^#\/?/, ""));
  const [path, query] = raw.split("?");
  return { parts: path.split("/").filter(Boolean), query: new URLSearchParams(query || "") };
}

function route(role) {
  const { parts, query } = parseHash();
  const routes = ROUTES[role];
  if (parts.length === 0) return { page: routes[0][1], params: { query }, key: routes[0][0] };
  for (const [pattern, page] of routes) {
    const ps = pattern.split("/");
    if (ps.length !== parts.length) continue;
    const params = { query };
    if (ps.every((p, i) => (p.startsWith(":") ? ((params[p.slice(1)] = parts[i]), true) : p === parts[i]))) {
      return { page, params, key: parts.join("/") + "?" + query.toString() };
    }
  }
  return { page: null, params: { query }, key: parts.join("/") };
}

function frame(title, content) {
  const stamp = new Date().toLocaleTimeString();
  return el("div", { class: "page" },
    el("div", { id: "flash", class: "flash", role: "status", "aria-live": "polite" }),
    content,
    el("p", { class: "live muted", id: "live" }, `Live: refreshed every ${POLL_MS / 1000} s, last at ${stamp}`));
}

async function refresh(force = false) {
  const s = session();
  if (!s) return showSignIn();
  if (loading) { again = again || force; return; }
  const r = route(s.role);
  const changedPage = r.key !== current.key;
  if (!r.page) {
    current = { key: r.key, page: null, data: undefined };
    main.replaceChildren(frame("Not found", el("div", {},
      el("h1", {}, "No such page"), el("p", {}, "Choose a page above, or go back."))));
    return;
  }
  loading = true;
  let data;
  let error = null;
  try {
    data = await r.page.data(r.params);
  } catch (e) {
    error = e;
  } finally {
    loading = false;
  }
  if (again || route(s.role).key !== r.key) { again = false; return refresh(true); }
  if (error && error instanceof ApiError && error.status === 401) {
    signOut();
    return showSignIn(error);
  }
  const serial = error ? `error:${error.message}` : JSON.stringify(data);
  if (!force && !changedPage && serial === current.serial) {
    const live = document.getElementById("live");
    if (live) live.textContent = `Live: refreshed every ${POLL_MS / 1000} s, last at ${new Date().toLocaleTimeString()}`;
    return;
  }
  const focusKey = document.activeElement && document.activeElement.dataset ? document.activeElement.dataset.key : null;
  const flashBox = document.getElementById("flash");
  const kept = !changedPage && flashBox ? [flashBox.className, flashBox.textContent] : null;
  const body = error
    ? el("div", {}, el("h1", {}, r.page.title || "Error"), errorBox(error))
    : r.page.render(data, r.params);
  main.replaceChildren(frame(r.page.title, body));
  if (kept) { const f = document.getElementById("flash"); f.className = kept[0]; f.textContent = kept[1]; }
  document.title = `${(body.querySelector && body.querySelector("h1") || {}).textContent || "cronwheel"} · cronwheel`;
  current = { key: r.key, page: r.page, serial };
  markNav(r.key);
  if (focusKey) {
    const same = main.querySelector(`[data-key="${CSS.escape(focusKey)}"]`);
    if (same) same.focus();
  } else if (changedPage) {
    main.focus({ preventScroll: true });
  }
}

function markNav(key) {
  for (const a of document.querySelectorAll("#nav a")) {
    const here = key.split("?")[0].split("/")[0] === a.dataset.page;
    if (here) a.setAttribute("aria-current", "page"); else a.removeAttribute("aria-current");
  }
}

function showChrome(s) {
  const nav = document.getElementById("nav");
  const who = document.getElementById("who");
  if (!s) { nav.hidden = true; who.hidden = true; nav.replaceChildren(); return; }
  nav.replaceChildren(...NAV[s.role].map(([page, label]) => el("a", { href: `#/${page}`, "data-page": page }, label)));
  nav.hidden = false;
  who.hidden = false;
  document.getElementById("who-label").textContent = s.role === "operator" ? "Operator" : "Tenant key";
}

function showSignIn(error) {
  current = { key: null, page: null, serial: null };
  showChrome(null);
  const status = el("div", { id: "sign-in-status", role: "alert", "aria-live": "assertive" }, error ? errorBox(error) : null);
  const input = el("input", {
    id: "key", name: "key", type: "password", autocomplete: "off", required: true,
    spellcheck: "false", "aria-describedby": "key-help",
  });
  const form = el("form", { class: "sign-in", id: "sign-in" },
    el("h1", {}, "Sign in"),
    el("label", { for: "key" }, "API key"),
    input,
    el("p", { id: "key-help", class: "muted" },
      "A tenant key (cw_...) shows that tenant's jobs, runs and workflows; the operator key shows tenants and the system. ",
      "`make run` prints both. The key stays in this tab until you sign out or close it."),
    el("button", { type: "submit" }, "Sign in"),
    status);
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    status.replaceChildren(el("p", { class: "muted" }, "Checking the key…"));
    try {
      const role = await signIn(input.value.trim());
      input.value = "";
      showChrome(session());
      if (!location.hash || location.hash === "#/") location.hash = `#/${ROUTES[role][0][0]}`;
      await refresh(true);
    } catch (e) {
      status.replaceChildren(errorBox(e));
      input.focus();
    }
  });
  document.title = "Sign in · cronwheel";
  main.replaceChildren(form);
  input.focus();
}

document.getElementById("sign-out").addEventListener("click", () => {
  signOut();
  location.hash = "#/";
  showSignIn();
});
window.addEventListener("hashchange", () => refresh(true));

// One poll at a time; none while the tab is hidden or a confirmation is open.
setInterval(() => {
  if (document.hidden || document.getElementById("confirm").open || !session()) return;
  refresh(false);
}, POLL_MS);

onRedraw(() => refresh(true));
showChrome(session());
refresh(true);
