// What pages share besides building nodes: a line saying how an action went,
// the confirmation dialog, and running an action then redrawing the page.

import { ApiError } from "./api.js";

let redraw = async () => {};
export function onRedraw(fn) { redraw = fn; }

export function flash(message, kind = "ok") {
  const box = document.getElementById("flash");
  if (!box) return;
  box.className = `flash flash-${kind}`;
  box.textContent = message;
}

// Run an action the page offers (pause, trigger, ...), say how it went, redraw.
export async function act(label, fn) {
  try {
    const out = await fn();
    flash(label);
    await redraw();
    return out;
  } catch (e) {
    flash(e instanceof ApiError ? e.words : String(e), "error");
    return null;
  }
}

export function confirmThen(text, fn) {
  const dialog = document.getElementById("confirm");
  document.getElementById("confirm-text").textContent = text;
  dialog.returnValue = "";
  dialog.addEventListener("close", () => { if (dialog.returnValue === "ok") fn(); }, { once: true });
  dialog.showModal();
  document.getElementById("confirm-cancel").focus();
}
