// A schedule in words, beside the schedule as written. Covers the common
// shapes of cron (single values, lists, ranges, steps, names, @-shortcuts);
// anything else reads as its fields one by one, never as a guess.

const MACROS = {
  "@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *",
  "@weekly": "0 0 * * 0", "@daily": "0 0 * * *", "@midnight": "0 0 * * *", "@hourly": "0 * * * *",
};
const DAYS = ["Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"];
const MONTHS = ["", "January", "February", "March", "April", "May", "June", "July",
  "August", "September", "October", "November", "December"];
const DAY_NAMES = { sun: 0, mon: 1, tue: 2, wed: 3, thu: 4, fri: 5, sat: 6 };
const MONTH_NAMES = { jan: 1, feb: 2, mar: 3, apr: 4, may: 5, jun: 6, jul: 7, aug: 8, sep: 9, oct: 10, nov: 11, dec: 12 };

const pad = (n) => String(n).padStart(2, "0");
const isNum = (f) => /^\d+$/.test(f);

function named(f, names) {
  return f.toLowerCase().replace(/[a-z]{3}/g, (m) => (m in names ? String(names[m]) : m));
}

function list(items) {
  return items.length <= 1 ? items.join("") : `${items.slice(0, -1).join(", ")} and ${items.at(-1)}`;
}

// One field (not `*`) in words, each value through `show`.
function part(f, show) {
  return list(f.split(",").map((p) => {
    const [range, step] = p.split("/");
    const base = range === "*" ? "" : range.includes("-")
      ? `${show(range.split("-")[0])} through ${show(range.split("-")[1])}` : show(range);
    if (!step) return base;
    return `every ${step}${base ? ` from ${base}` : ""}`;
  }));
}

export function cronWords(expr) {
  const text = String(expr || "").trim();
  const f = (MACROS[text.toLowerCase()] || text).split(/\s+/);
  if (f.length !== 5 && f.length !== 6) return text;
  const [sec, min, hour, dom, monRaw, dowRaw] = f.length === 6 ? f : ["0", ...f];
  const mon = named(monRaw, MONTH_NAMES);
  const dow = named(dowRaw, DAY_NAMES);
  const out = [];

  // The time of day.
  if (isNum(sec) && isNum(min) && isNum(hour)) {
    out.push(`at ${pad(hour)}:${pad(min)}${sec !== "0" ? `:${pad(sec)}` : ""}`);
  } else {
    if (sec === "*") out.push("every second");
    else if (/^\*\/\d+$/.test(sec)) out.push(`every ${sec.slice(2)} seconds`);
    else if (sec !== "0") out.push(`at second ${part(sec, String)}`);
    if (min === "*") { if (sec === "0") out.push("every minute"); }
    else if (/^\*\/\d+$/.test(min)) out.push(`every ${min.slice(2)} minutes`);
    else out.push(`at minute ${part(min, String)}`);
    if (hour !== "*") {
      if (/^\*\/\d+$/.test(hour)) out.push(`of every ${hour.slice(2)} hours`);
      else out.push(`past hour ${part(hour, String)}`);
    } else if (isNum(min)) out.push("of every hour");
  }

  // The days: cronie's rule, either day field matching when both are restricted.
  const days = [];
  if (dom !== "*") days.push(`on day ${part(dom, String)} of the month`);
  if (dow !== "*") days.push(`on ${part(dow, (d) => DAYS[Number(d)] || d)}`);
  if (days.length === 2) out.push(`${days[0]} or ${days[1]}`);
  else if (days.length === 1) out.push(days[0]);
  else if (isNum(hour)) out.push("every day");
  if (mon !== "*") out.push(`in ${part(mon, (m) => MONTHS[Number(m)] || m)}`);
  return out.join(" ");
}

export function everyWords(everyMs) {
  const v = Number(everyMs);
  if (v % 3_600_000 === 0) return `every ${v / 3_600_000} h`;
  if (v % 60_000 === 0) return `every ${v / 60_000} min`;
  if (v % 1000 === 0) return `every ${v / 1000} s`;
  return `every ${v} ms`;
}

// [as written, in words] for a job's or workflow's schedule object.
export function scheduleText(schedule) {
  if (!schedule) return ["(no schedule)", "runs only when triggered"];
  if (schedule.cron !== undefined) return [schedule.cron, cronWords(schedule.cron)];
  if (schedule.every_ms !== undefined) return [`every_ms ${schedule.every_ms}`, everyWords(schedule.every_ms)];
  if (schedule.at !== undefined) return [`at ${schedule.at}`, "once"];
  return [JSON.stringify(schedule), ""];
}

export function targetText(target) {
  if (!target) return "—";
  if (target.type === "queue") return `queue ${target.queue}`;
  if (target.type === "webhook") return `webhook ${target.method || "POST"} ${target.url}`;
  if (target.type === "managed") return `managed: ${(target.command || []).join(" ")}`;
  return target.type || JSON.stringify(target);
}
