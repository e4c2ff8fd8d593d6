// The /v1 API as the console calls it: the same routes and JSON a script uses,
// with the key the person signed in with. The key lives in this tab's
// sessionStorage only (gone when the tab closes; never in a URL or a cookie).

const KEY = "cronwheel.key";
const ROLE = "cronwheel.role";

export function session() {
  const key = sessionStorage.getItem(KEY);
  return key ? { key, role: sessionStorage.getItem(ROLE) || "tenant" } : null;
}

export function signOut() {
  sessionStorage.removeItem(KEY);
  sessionStorage.removeItem(ROLE);
}

// An answer other than 2xx, in words: the problem document's detail, its
// code and the field at fault when the API named one.
export class ApiError extends Error {
  constructor(status, problem, path) {
    const detail = (problem && (problem.detail || problem.title)) || `HTTP ${status}`;
    const field = problem && problem.field ? ` (field ${problem.field})` : "";
    super(`${detail}${field}`);
    this.status = status;
    this.code = (problem && problem.code) || null;
    this.path = path;
  }

  get words() {
    if (this.status === 0) return `The gateway did not answer: ${this.message}.`;
    if (this.status === 401) return `The key was not accepted: ${this.message}. Sign in again.`;
    if (this.status === 403) return `This key may not do that: ${this.message}.`;
    if (this.status === 404) return `Not found: ${this.message}.`;
    if (this.status === 429) return `Too many requests: ${this.message}. Wait a moment.`;
    if (this.status >= 500) return `The server failed (${this.status}): ${this.message}.`;
    return `Refused (${this.status}${this.code ? " " + this.code : ""}): ${this.message}.`;
  }
}

export async function call(method, path, { body, key, accept = "json" } = {}) {
  const k = key || (session() || {}).key;
  const headers = { Accept: accept === "json" ? "application/json" : "text/plain" };
  if (k) headers.Authorization = `Bearer ${k}`;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  let r;
  try {
    r = await fetch(path, {
      method, headers, body: body === undefined ? undefined : JSON.stringify(body),
      cache: "no-store", credentials: "omit",
    });
  } catch (e) {
    throw new ApiError(0, { detail: String(e.message || e) }, path);
  }
  if (r.status === 204) return null;
  const text = await r.text();
  if (!r.ok) {
    let problem = null;
    try { problem = JSON.parse(text); } catch { problem = { detail: text.slice(0, 200) }; }
    throw new ApiError(r.status, problem, path);
  }
  return accept === "json" ? JSON.parse(text) : text;
}

export const get = (path, opts) => call("GET", path, opts);
export const post = (path, body, opts) => call("POST", path, { ...opts, body });
export const del = (path, opts) => call("DELETE", path, opts);

// Which kind of key this is, asked of the API itself: a tenant key reads
// /v1/jobs; the operator key gets 403 there and reads /v1/tenants. Anything
// else (401, 429, a dead gateway) is thrown for the sign-in form to show.
export async function signIn(key) {
  try {
    await get("/v1/jobs?limit=1", { key });
    return remember(key, "tenant");
  } catch (e) {
    if (!(e instanceof ApiError) || e.status !== 403) throw e;
  }
  await get("/v1/tenants?limit=1", { key });
  return remember(key, "operator");
}

function remember(key, role) {
  sessionStorage.setItem(KEY, key);
  sessionStorage.setItem(ROLE, role);
  return role;
}

export const q = (params) => {
  const s = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== null && v !== undefined && v !== "") s.set(k, v);
  const t = s.toString();
  return t ? `?${t}` : "";
};
export const enc = encodeURIComponent;
