// A workflow's DAG drawn as SVG, laid out automatically in layers: a node's
// layer is the length of the longest path to it from a root (so every edge
// points rightwards), nodes within a layer are ordered by the barycentre of
// their neighbours (a few sweeps down and up, which removes most crossings),
// and edges are curves from a node's right side to its child's left side.

import { enc } from "./api.js";
import { el, svg } from "./dom.js";

const W = 168, H = 48, GAP_X = 64, GAP_Y = 20, PAD = 12;

export function layout(nodes) {
  const byName = new Map(nodes.map((n, i) => [n.name, { ...n, i, deps: (n.depends_on || []).filter((d) => d !== n.name) }]));
  const layerOf = new Map();
  const visit = (name, seen = new Set()) => {
    if (layerOf.has(name)) return layerOf.get(name);
    if (seen.has(name)) return 0; // the API refuses cycles; never loop on one anyway
    seen.add(name);
    const n = byName.get(name);
    const deps = n ? n.deps.filter((d) => byName.has(d)) : [];
    const layer = deps.length ? 1 + Math.max(...deps.map((d) => visit(d, seen))) : 0;
    layerOf.set(name, layer);
    return layer;
  };
  for (const n of byName.values()) visit(n.name);

  const layers = [];
  for (const n of byName.values()) (layers[layerOf.get(n.name)] ||= []).push(n.name);
  const children = new Map([...byName.keys()].map((k) => [k, []]));
  for (const n of byName.values()) for (const d of n.deps) if (children.has(d)) children.get(d).push(n.name);

  const pos = new Map();
  const index = () => layers.forEach((l) => l.forEach((name, i) => pos.set(name, i)));
  index();
  const sweep = (range, neighbours) => {
    for (const li of range) {
      const bary = (name) => {
        const ns = neighbours(name);
        return ns.length ? ns.reduce((s, m) => s + pos.get(m), 0) / ns.length : pos.get(name);
      };
      layers[li] = layers[li].map((name) => [bary(name), pos.get(name), name])
        .sort((a, b) => a[0] - b[0] || a[1] - b[1]).map((x) => x[2]);
      layers[li].forEach((name, i) => pos.set(name, i));
    }
  };
  const down = [...layers.keys()].slice(1);
  const up = [...layers.keys()].reverse().slice(1);
  for (let k = 0; k < 4; k++) {
    sweep(down, (name) => byName.get(name).deps.filter((d) => byName.has(d)));
    sweep(up, (name) => children.get(name));
  }

  const tallest = Math.max(1, ...layers.map((l) => l.length));
  const height = PAD * 2 + tallest * H + (tallest - 1) * GAP_Y;
  const width = PAD * 2 + layers.length * W + Math.max(0, layers.length - 1) * GAP_X;
  const xy = new Map();
  layers.forEach((l, li) => {
    const top = (height - (l.length * H + (l.length - 1) * GAP_Y)) / 2;
    l.forEach((name, i) => xy.set(name, { x: PAD + li * (W + GAP_X), y: top + i * (H + GAP_Y) }));
  });
  const edges = [];
  for (const n of byName.values()) for (const d of n.deps) if (xy.has(d)) edges.push([d, n.name]);
  return { width, height, xy, edges, nodes: [...byName.values()] };
}

const short = (s, n) => (s.length > n ? `${s.slice(0, n - 1)}…` : s);

// `nodes`: [{name, depends_on, state?, run_id?}]; without states (a workflow's
// definition) every node is drawn plain.
export function dagSvg(nodes, { label = "Workflow graph" } = {}) {
  const { width, height, xy, edges, nodes: laid } = layout(nodes);
  const edgePaths = edges.map(([a, b]) => {
    const p = xy.get(a), q = xy.get(b);
    const x1 = p.x + W, y1 = p.y + H / 2, x2 = q.x - 4, y2 = q.y + H / 2, mx = (x1 + x2) / 2;
    return svg("path", { class: "dag-edge", d: `M${x1},${y1} C${mx},${y1} ${mx},${y2} ${x2},${y2}`, "marker-end": "url(#arrow)", "data-from": a, "data-to": b });
  });
  const nodeGroups = laid.map((n) => {
    const { x, y } = xy.get(n.name);
    const state = n.state || null;
    const open = n.run_id ? () => { location.hash = `#/runs/${enc(n.run_id)}`; } : null;
    const g = svg("g", {
      class: `dag-node${state ? ` state-${state.toLowerCase()}` : ""}${open ? " linked" : ""}`,
      transform: `translate(${x},${y})`, "data-node": n.name, "data-state": state,
      tabindex: "0", role: open ? "link" : "img", "data-key": `node:${n.name}`,
      "aria-label": `${n.name}${state ? `: ${state}` : ""}${n.depends_on && n.depends_on.length ? `, after ${n.depends_on.join(", ")}` : ""}`,
      onclick: open, onkeydown: open ? (ev) => { if (ev.key === "Enter" || ev.key === " ") { ev.preventDefault(); open(); } } : null,
    },
    svg("title", {}, `${n.name}${state ? ` (${state})` : ""}`),
    svg("rect", { width: W, height: H, rx: 8, ry: 8 }),
    svg("text", { x: 12, y: state ? 20 : 29, class: "dag-name" }, short(n.name, 20)),
    state ? svg("text", { x: 12, y: 38, class: "dag-state" }, state.replace("_", " ")) : null);
    return g;
  });
  return el("div", { class: "dag-wrap", tabindex: "-1" },
    svg("svg", { class: "dag", id: "dag", width, height, viewBox: `0 0 ${width} ${height}`, role: "group", "aria-label": label },
      svg("defs", {}, svg("marker", { id: "arrow", viewBox: "0 0 10 10", refX: 9, refY: 5, markerWidth: 7, markerHeight: 7, orient: "auto-start-reverse" },
        svg("path", { d: "M0,0 L10,5 L0,10 z", class: "dag-arrow" }))),
      svg("g", { class: "edges" }, edgePaths),
      svg("g", { class: "nodes" }, nodeGroups)));
}
