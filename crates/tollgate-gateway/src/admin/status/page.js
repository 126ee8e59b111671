// tollgate status page: polls status.json once a second and draws it. No framework, no
// external assets; every number is written with textContent, never as HTML.
"use strict";

const REFRESH_MS = 1000;
// The charts show at most the server's five minutes of readings, and less while it is younger.
const MAX_SPAN_S = 300;
const LABELS = {
  allowed: "Allowed", limited: "Limited", shadow_limited: "Shadow limited",
  failed_open: "Failed open", failed_closed: "Failed closed",
  fallback_allowed: "Fallback allowed", fallback_limited: "Fallback limited",
};
// Line styles: a colour and a dash pattern each, so the lines differ without colour too.
const DASH = {
  allowed: "", limited: "7 4", shadow_limited: "2 4", failed_open: "10 3 2 3",
  failed_closed: "1 3", fallback_allowed: "12 4", fallback_limited: "4 2 1 2",
  p50: "", p99: "7 4",
};
const SVG = "http://www.w3.org/2000/svg";

let paused = false;
let timer = null;

const $ = (id) => document.getElementById(id);
const nf = new Intl.NumberFormat("en-US");

function fmtInt(n) { return n == null ? "–" : nf.format(n); }
function fmtRate(r) {
  if (r == null) return "–";
  if (r === 0) return "0";
  if (r < 10) return r.toFixed(1);
  return nf.format(Math.round(r));
}
function fmtMs(ms) {
  if (ms == null) return "–";
  if (ms < 1) return ms.toFixed(3);
  if (ms < 10) return ms.toFixed(2);
  if (ms < 100) return ms.toFixed(1);
  return nf.format(Math.round(ms));
}
function fmtDuration(s) {
  if (s < 60) return s + " s";
  if (s < 3600) return Math.floor(s / 60) + " min " + (s % 60) + " s";
  const h = Math.floor(s / 3600);
  return h + " h " + Math.floor((s % 3600) / 60) + " min";
}
function text(id, value) {
  const el = $(id);
  if (el && el.textContent !== value) el.textContent = value;
}
function el(tag, attrs, content) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (content != null) e.textContent = content;
  return e;
}
function svg(tag, attrs) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  return e;
}
function sum(xs) { return xs.reduce((a, b) => a + (b || 0), 0); }

// Round axis ticks: 0 and steps of 1, 2, 2.5 or 5 times a power of ten reaching max.
function ticks(max, count) {
  if (!(max > 0)) max = 1;
  const raw = max / count;
  const pow = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = [1, 2, 2.5, 5, 10].map((m) => m * pow).find((s) => s >= raw);
  const decimals = Math.max(0, -Math.floor(Math.log10(step) + 1e-9) + (step / pow === 2.5 ? 1 : 0));
  const out = [];
  for (let i = 0; i < 100; i++) {
    const v = Number((i * step).toFixed(decimals));
    out.push({ value: v, label: v.toLocaleString("en-US", { minimumFractionDigits: decimals, maximumFractionDigits: decimals }) });
    if (v >= max && i >= 1) break;
  }
  return out;
}

// The time the charts span: the readings' age rounded up to a whole minute, 1 to 5 minutes.
function spanOf(now, t) {
  const age = t.length ? (now - t[0]) / 1000 : 0;
  return Math.min(MAX_SPAN_S, Math.max(60, Math.ceil(age / 60 - 1e-9) * 60));
}
function spanText(span) {
  return span === 60 ? "minute" : span / 60 + " minutes";
}

// A line chart of per-second series over the last minutes.
function lineChart(container, opts) {
  const width = Math.max(320, Math.round(container.clientWidth || 900));
  const height = opts.height;
  const m = { l: 64, r: 16, t: 12, b: 28 };
  const pw = width - m.l - m.r, ph = height - m.t - m.b;
  const span = spanOf(opts.now, opts.t);
  const start = opts.now - span * 1000;
  const x = (t) => m.l + ((t - start) / (span * 1000)) * pw;
  const visible = opts.series.filter((s) => s.always || s.values.some((v) => v > 0));
  const max = Math.max(0, ...visible.flatMap((s) => s.values.filter((v) => v != null)));
  const yt = ticks(max, 4);
  const top = yt[yt.length - 1].value;
  const y = (v) => m.t + ph - (v / top) * ph;
  const root = svg("svg", { viewBox: `0 0 ${width} ${height}`, width, height, role: "img", "aria-label": opts.label });
  const title = svg("title"); title.textContent = opts.label; root.appendChild(title);
  if (opts.band) {
    opts.band.forEach((open, i) => {
      if (!open || i === 0) return;
      const x0 = Math.max(m.l, x(opts.t[i - 1])), x1 = x(opts.t[i]);
      if (x1 > x0) root.appendChild(svg("rect", { class: "band", x: x0, y: m.t, width: x1 - x0, height: ph }));
    });
  }
  for (const t of yt) {
    root.appendChild(svg("line", { class: "grid", x1: m.l, x2: m.l + pw, y1: y(t.value), y2: y(t.value) }));
    const label = svg("text", { x: m.l - 8, y: y(t.value) + 4, "text-anchor": "end" });
    label.textContent = t.label;
    root.appendChild(label);
  }
  const step = span > 120 ? 60 : 30;
  for (let ago = span; ago >= 0; ago -= step) {
    const tx = x(opts.now - ago * 1000);
    root.appendChild(svg("line", { class: "axis", x1: tx, x2: tx, y1: m.t + ph, y2: m.t + ph + 5 }));
    const label = svg("text", { x: tx, y: height - 6, "text-anchor": ago === 0 ? "end" : "middle" });
    label.textContent = ago === 0 ? "now" : "−" + (step === 60 ? ago / 60 + " min" : ago + " s");
    root.appendChild(label);
  }
  root.appendChild(svg("line", { class: "axis", x1: m.l, x2: m.l + pw, y1: m.t + ph, y2: m.t + ph }));
  const yUnit = svg("text", { x: 12, y: m.t + ph / 2, transform: `rotate(-90 12 ${m.t + ph / 2})`, "text-anchor": "middle" });
  yUnit.textContent = opts.unit;
  root.appendChild(yUnit);
  for (const s of visible) {
    // Gaps (null) break the line; a point alone between gaps is drawn as a dot.
    let d = "";
    let run = 0;
    const end = () => { if (run === 1) d += "h0.1"; run = 0; };
    s.values.forEach((v, i) => {
      const t = opts.t[i];
      if (v == null || t < start) { end(); return; }
      d += (run ? "L" : "M") + x(t).toFixed(1) + " " + y(v).toFixed(1);
      run++;
    });
    end();
    if (d) root.appendChild(svg("path", { class: "series s-" + s.key, d, "stroke-dasharray": DASH[s.key] || "" }));
  }
  const empty = !opts.t.length ? "Collecting the first seconds…"
    : (opts.empty && !visible.some((s) => s.values.some((v) => v != null)) ? opts.empty : null);
  if (empty) {
    const e = svg("text", { class: "empty", x: m.l + pw / 2, y: m.t + ph / 2, "text-anchor": "middle" });
    e.textContent = empty;
    root.appendChild(e);
  }
  container.replaceChildren(root);
  const legend = opts.legend;
  legend.replaceChildren(...visible.map((s) => {
    const li = el("li");
    const sample = svg("svg", { viewBox: "0 0 28 10", "aria-hidden": "true" });
    sample.appendChild(svg("line", { class: "s-" + s.key, x1: 1, x2: 27, y1: 5, y2: 5, "stroke-dasharray": DASH[s.key] || "" }));
    li.appendChild(sample);
    li.appendChild(document.createTextNode(s.label));
    return li;
  }));
  if (opts.band && opts.band.some((b) => b)) {
    const li = el("li");
    const sample = svg("svg", { viewBox: "0 0 28 10", "aria-hidden": "true" });
    sample.appendChild(svg("rect", { class: "band", x: 0, y: 0, width: 28, height: 10 }));
    li.appendChild(sample);
    li.appendChild(document.createTextNode("breaker open"));
    legend.appendChild(li);
  }
}

function counterCell(c, attrs) {
  const td = el("td", Object.assign({ class: "num", "data-total": String(c.total), "data-rate": String(c.rate ?? "") }, attrs));
  if (!c.total) td.classList.add("zero");
  td.appendChild(el("span", { class: "rate" }, fmtRate(c.rate) + " /s"));
  td.appendChild(el("span", { class: "total" }, fmtInt(c.total) + " total"));
  return td;
}

function renderCards(s) {
  const rate = (i) => sum(s.policies.map((p) => p.decisions[i].rate));
  const idx = (name) => s.outcomes.indexOf(name);
  const allowed = rate(idx("allowed"));
  const limited = rate(idx("limited")) + rate(idx("fallback_limited"));
  const all = sum(s.outcomes.map((_, i) => rate(i)));
  text("allowed-rate", fmtRate(allowed));
  text("limited-rate", fmtRate(limited));
  text("rejected-share", all > 0 ? (100 * limited / all).toFixed(1) : "–");
  text("p50", fmtMs(s.store.p50_ms));
  text("p99", fmtMs(s.store.p99_ms));
  text("rate-window", "average of the last " + s.rate_window_s + " s");
  text("latency-window", s.store.latency_window_s + " s");
  const state = s.breaker_open ? "open" : "closed";
  const b = $("breaker");
  b.dataset.state = state;
  $("breaker-card").dataset.state = state;
  text("breaker", s.breaker_open ? "Open" : "Closed");
  text("breaker-note", s.breaker_open ? "store skipped" : "store called");
}

function renderDecisions(s) {
  const head = $("decisions-head");
  if (head.children.length !== s.outcomes.length + 1) {
    head.replaceChildren(el("th", { scope: "col" }, "Policy"),
      ...s.outcomes.map((o) => el("th", { scope: "col", class: "num" }, LABELS[o] || o)));
  }
  const rows = s.policies.map((p) => {
    const tr = el("tr", { "data-policy": p.name });
    tr.appendChild(el("th", { scope: "row" }, p.name));
    p.decisions.forEach((c, i) => {
      const td = counterCell(c, { "data-policy": p.name, "data-outcome": s.outcomes[i], id: "total-" + p.name + "-" + s.outcomes[i] });
      if (s.outcomes[i].endsWith("limited") && c.rate > 0) td.classList.add("hot-limited");
      tr.appendChild(td);
    });
    return tr;
  });
  $("decisions-body").replaceChildren(...(s.policies.length ? rows : [emptyRow(s.outcomes.length + 1, "No policy is configured.")]));
}

function emptyRow(span, message) {
  const tr = el("tr");
  tr.appendChild(el("td", { colspan: String(span) }, message));
  return tr;
}

function renderStore(s) {
  text("calls-rate", fmtRate(s.store.calls.rate));
  text("calls-total", fmtInt(s.store.calls.total));
  text("memory-keys", fmtInt(s.store.memory_keys));
  text("answers-503", fmtInt(s.responses.unavailable_503));
  const rows = s.store.errors.filter((e) => e.total > 0).map((e) => {
    const tr = el("tr", { "data-kind": e.kind });
    tr.appendChild(el("th", { scope: "row" }, e.kind.replace("_", " ")));
    tr.appendChild(el("td", { class: "num" }, fmtRate(e.rate)));
    tr.appendChild(el("td", { class: "num" }, fmtInt(e.total)));
    return tr;
  });
  $("errors-body").replaceChildren(...(rows.length ? rows : [emptyRow(3, "No store error since start.")]));
  const local = s.policies.map((p) => {
    const tr = el("tr", { "data-policy": p.name });
    tr.appendChild(el("th", { scope: "row" }, p.name));
    for (const c of [p.deny_cache_hits, p.lease_granted, p.lease_used, p.lease_returned]) tr.appendChild(counterCell(c, {}));
    return tr;
  });
  $("local-body").replaceChildren(...(local.length ? local : [emptyRow(5, "No policy is configured.")]));
  const later = s.policies.map((p) => {
    const tr = el("tr", { "data-policy": p.name });
    tr.appendChild(el("th", { scope: "row" }, p.name));
    for (const c of [p.settled_refunded, p.settled_charged]) tr.appendChild(counterCell(c, {}));
    tr.appendChild(el("td", { class: "num" }, fmtInt(p.in_flight)));
    tr.appendChild(counterCell(p.holds_expired, {}));
    return tr;
  });
  $("later-body").replaceChildren(...(later.length ? later : [emptyRow(5, "No policy is configured.")]));
}

function renderTop(s) {
  const top = s.top_limited;
  text("top-window", "last " + Math.round(top.window_s / 60) + " minutes");
  text("top-summary", fmtInt(top.limited) + " limited requests in this window.");
  const rows = top.clients.map((c, i) => {
    const tr = el("tr", { "data-client": c.client, "data-count": String(c.count) });
    tr.appendChild(el("td", { class: "num" }, String(i + 1)));
    const who = el("td");
    who.appendChild(el("code", { title: "keyed hash of the client's identity" }, c.client));
    tr.appendChild(who);
    tr.appendChild(el("td", {}, c.policy));
    const n = el("td", { class: "num" }, fmtInt(c.count));
    if (c.at_least < c.count) n.appendChild(el("span", { class: "total" }, "at least " + fmtInt(c.at_least)));
    tr.appendChild(n);
    const share = top.limited > 0 ? Math.min(1, c.count / top.limited) : 0;
    const td = el("td");
    const bar = svg("svg", { class: "bar", viewBox: "0 0 160 12", "aria-hidden": "true" });
    bar.appendChild(svg("rect", { class: "track", x: 0, y: 0, width: 160, height: 12, rx: 2 }));
    bar.appendChild(svg("rect", { class: "fill", x: 0, y: 0, width: (160 * share).toFixed(1), height: 12, rx: 2 }));
    td.appendChild(bar);
    td.appendChild(document.createTextNode((100 * share).toFixed(1) + " %"));
    tr.appendChild(td);
    return tr;
  });
  $("top-body").replaceChildren(...(rows.length ? rows : [emptyRow(5, "No client limited in this window.")]));
}

function renderCharts(s) {
  const sr = s.series;
  const last = "the last " + spanText(spanOf(s.now_ms, sr.t_ms));
  text("decisions-caption", "Decisions per second over " + last + ", all policies, by outcome");
  text("latency-caption", "Store call latency (p50 and p99 of each second) over " + last);
  lineChart($("decisions-chart"), {
    height: 240, now: s.now_ms, t: sr.t_ms, unit: "decisions/s", band: sr.breaker_open,
    legend: $("decisions-legend"),
    label: "Decisions per second over " + last + ": " + s.outcomes.map((o, i) =>
      (LABELS[o] || o) + " " + fmtRate(sr.decisions[i][sr.decisions[i].length - 1] ?? 0)).join(", ") + " now",
    series: s.outcomes.map((o, i) => ({ key: o, label: LABELS[o] || o, values: sr.decisions[i], always: o === "allowed" || o === "limited" })),
  });
  lineChart($("latency-chart"), {
    height: 170, now: s.now_ms, t: sr.t_ms, unit: "ms", legend: $("latency-legend"),
    empty: "No timed store call in this window",
    label: "Store latency over " + last + ": p50 " + fmtMs(s.store.p50_ms) + " ms, p99 " + fmtMs(s.store.p99_ms) + " ms",
    series: [
      { key: "p50", label: "p50", values: sr.p50_ms, always: true },
      { key: "p99", label: "p99", values: sr.p99_ms, always: true },
    ],
  });
}

function renderConfig(c) {
  if (!c) return;
  const n = c.reloads_ok + c.reloads_error;
  text("config", c.origin + (n ? " · reloaded " + fmtInt(c.reloads_ok) + "×" : ""));
  const r = $("reload");
  const last = c.last_reload;
  const notes = [];
  if (last && !last.ok) {
    notes.push("Last reload (" + last.trigger + ", " + new Date(last.at_ms).toLocaleTimeString("en-GB") +
      ") refused; the previous config keeps serving: " + (last.error || ""));
  }
  if (c.pending_restart && c.pending_restart.length) {
    notes.push("Changed, applied after a restart: " + c.pending_restart.join(", "));
  }
  r.hidden = notes.length === 0;
  r.classList.toggle("error", !!(last && !last.ok));
  r.textContent = notes.join(" · ");
}

function render(s) {
  text("version", s.version);
  renderConfig(s.config);
  text("uptime", fmtDuration(s.uptime_s));
  const updated = $("updated");
  updated.dateTime = new Date(s.now_ms).toISOString();
  updated.textContent = new Date(s.now_ms).toLocaleTimeString("en-GB");
  renderCards(s);
  renderDecisions(s);
  renderStore(s);
  renderTop(s);
  renderCharts(s);
}

async function refresh() {
  timer = null;
  const conn = $("conn");
  try {
    const ctl = new AbortController();
    const cut = setTimeout(() => ctl.abort(), 5000);
    const resp = await fetch("status.json", { cache: "no-store", signal: ctl.signal });
    clearTimeout(cut);
    if (!resp.ok) throw new Error("HTTP " + resp.status);
    render(await resp.json());
    conn.classList.remove("error");
    if (!paused) conn.textContent = "Live: refreshed every second";
  } catch (e) {
    conn.classList.add("error");
    conn.textContent = "Cannot reach the admin server (" + e.message + "); retrying";
  }
  if (!paused) timer = setTimeout(refresh, REFRESH_MS);
}

document.addEventListener("DOMContentLoaded", () => {
  const pause = $("pause");
  pause.addEventListener("click", () => {
    paused = !paused;
    pause.setAttribute("aria-pressed", String(paused));
    pause.textContent = paused ? "Resume updates" : "Pause updates";
    $("conn").textContent = paused ? "Paused" : "Live: refreshed every second";
    if (!paused && timer == null) refresh();
    if (paused && timer != null) { clearTimeout(timer); timer = null; }
  });
  window.addEventListener("resize", () => { if (!paused && timer != null) { clearTimeout(timer); refresh(); } });
  refresh();
});
