// radixgate status page: reads /dashboard/data once a second and draws it.
// Hand-written SVG charts, no library, nothing fetched from elsewhere.
// Every value from the data goes into the page as text (textContent or an
// attribute), never as markup.
"use strict";

const SVG = "http://www.w3.org/2000/svg";
const W = 480, H = 180;
const PAD = { left: 44, right: 8, top: 8, bottom: 20 };
const REFRESH_MS = 1000;
// A read of the data that takes longer has failed: a connection that went
// silent (a dead tunnel, a host gone) would otherwise leave the page
// showing "live" with frozen numbers, never asking again.
const FETCH_TIMEOUT_MS = 5000;
// Reads that may bring back the reading already shown before the page
// says the figures are not current: the router takes one a second, so
// the same one again and again means it has stopped taking them (its
// sampler stuck), though it still answers.
const SAME_READINGS = 5;
let shownAt = null, sameReadings = 0;
// The data endpoint, next to this page (its URL may carry user:password@,
// which fetch refuses: build it from the origin and path only).
const DATA_URL = new URL("dashboard/data", location.origin + location.pathname).href;

const $ = (id) => document.getElementById(id);

function el(tag, attrs, text) {
  const node = tag.startsWith("svg:") ? document.createElementNS(SVG, tag.slice(4)) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  if (text !== undefined && text !== null) node.textContent = String(text);
  return node;
}

// ---- number formats ---------------------------------------------------
function fmtNum(x) {
  if (x === null || x === undefined) return "–";
  if (x >= 100) return Math.round(x).toLocaleString("en-US");
  if (x >= 10) return x.toFixed(1);
  return x.toFixed(x === 0 ? 0 : 2);
}
function fmtMs(x) {
  if (x === null || x === undefined) return "–";
  if (x >= 10000) return (x / 1000).toFixed(1) + " s";
  if (x >= 100) return Math.round(x) + " ms";
  return x.toFixed(1) + " ms";
}
function fmtCount(x) {
  if (x === null || x === undefined) return "–";
  if (x >= 1e9) return (x / 1e9).toFixed(1) + "G";
  if (x >= 1e6) return (x / 1e6).toFixed(1) + "M";
  if (x >= 1e4) return (x / 1e3).toFixed(1) + "k";
  return String(x);
}
function fmtPct(x) {
  return x === null || x === undefined ? "–" : (x * 100).toFixed(x < 0.1 ? 1 : 0) + "%";
}
function fmtTime(ms) {
  const d = new Date(ms);
  return d.toTimeString().slice(0, 8);
}

// A round upper bound for an axis: 1, 2 or 5 times a power of ten.
function niceMax(v) {
  if (!(v > 0)) return 1;
  const p = Math.pow(10, Math.floor(Math.log10(v)));
  for (const m of [1, 2, 5, 10]) if (v <= m * p) return m * p;
  return 10 * p;
}

// ---- charts -----------------------------------------------------------
// The frame of a chart over [t0, t1] and [0, ymax]: grid, y labels, time
// labels; returns the coordinate functions.
function frame(svg, t0, t1, ymax, unit) {
  svg.replaceChildren();
  const pw = W - PAD.left - PAD.right, ph = H - PAD.top - PAD.bottom;
  const x = (t) => PAD.left + ((t - t0) / Math.max(1, t1 - t0)) * pw;
  const y = (v) => PAD.top + ph - (Math.min(v, ymax) / ymax) * ph;
  for (let i = 0; i <= 4; i++) {
    const v = (ymax * i) / 4;
    svg.appendChild(el("svg:line", { class: "grid", x1: PAD.left, x2: W - PAD.right, y1: y(v), y2: y(v) }));
    const label = unit === "ms" ? fmtMs(v).replace(" ms", "") : fmtNum(v);
    svg.appendChild(el("svg:text", { class: "axis", x: PAD.left - 4, y: y(v) + 4, "text-anchor": "end" }, label));
  }
  const span = (t1 - t0) / 1000;
  const stepSecs = span > 150 ? 60 : span > 60 ? 30 : 10;
  for (let s = 0; s <= span; s += stepSecs) {
    const t = t1 - s * 1000;
    const text = s === 0 ? "now" : s % 60 === 0 ? `-${s / 60}m` : `-${s}s`;
    svg.appendChild(el("svg:text", { class: "axis", x: x(t), y: H - 5, "text-anchor": s === 0 ? "end" : "middle" }, text));
  }
  return { x, y, pw };
}

function empty(svg, text) {
  svg.appendChild(el("svg:text", { class: "empty", x: W / 2, y: H / 2, "text-anchor": "middle" }, text));
}

// Lines of `series` (points) picked by `pick(point) -> value|null`; a
// null breaks the line.
function lineChart(svg, points, t0, t1, lines, unit) {
  let ymax = 0;
  for (const p of points) for (const l of lines) {
    const v = l.pick(p);
    if (v !== null && v !== undefined) ymax = Math.max(ymax, v);
  }
  const { x, y } = frame(svg, t0, t1, niceMax(ymax), unit);
  let drawn = 0;
  for (const l of lines) {
    let d = "", n = 0, pen = false;
    for (const p of points) {
      const v = l.pick(p);
      if (v === null || v === undefined) { pen = false; continue; }
      d += `${pen ? "L" : "M"}${x(p.t_ms).toFixed(1)},${y(v).toFixed(1)}`;
      pen = true;
      n++;
    }
    if (n > 0) {
      svg.appendChild(el("svg:path", { class: `line ${l.cls}`, d, "data-points": n }));
      drawn += n;
    }
  }
  if (drawn === 0) empty(svg, "no answers in this window yet");
}

// Stacked bars of decisions per second, one colour per branch, the steps
// summed into bins of BIN_SECS (a few dozen bars over five minutes).
const BIN_SECS = 5;
function decisionChart(svg, legend, points, t0, t1) {
  const branches = [];
  for (const p of points) for (const b of Object.keys(p.decisions)) if (!branches.includes(b)) branches.push(b);
  branches.sort();
  const bins = new Map();
  for (const p of points) {
    const end = t1 - Math.floor((t1 - p.t_ms) / (BIN_SECS * 1000)) * BIN_SECS * 1000;
    const bin = bins.get(end) || {};
    for (const [b, n] of Object.entries(p.decisions)) bin[b] = (bin[b] || 0) + n;
    bins.set(end, bin);
  }
  let ymax = 0;
  for (const bin of bins.values()) ymax = Math.max(ymax, Object.values(bin).reduce((a, b) => a + b, 0) / BIN_SECS);
  const { x, y, pw } = frame(svg, t0, t1, niceMax(ymax), "n");
  const bw = Math.max(1, (pw * BIN_SECS * 1000) / Math.max(1, t1 - t0) - 1);
  let bars = 0;
  const totals = {};
  for (const [end, bin] of bins) {
    let base = 0;
    for (const [i, b] of branches.entries()) {
      const n = bin[b] || 0;
      if (n === 0) continue;
      totals[b] = (totals[b] || 0) + n;
      const v = n / BIN_SECS;
      const top = y(base + v), bottom = y(base);
      svg.appendChild(el("svg:rect", {
        class: `bar b${i % 8}`, x: (x(end) - bw).toFixed(1), y: top.toFixed(1),
        width: bw.toFixed(1), height: Math.max(0.5, bottom - top).toFixed(1),
        "data-branch": b, "data-count": n,
      }));
      base += v;
      bars++;
    }
  }
  if (bars === 0) empty(svg, "no decisions in this window yet");
  legend.replaceChildren();
  for (const [i, b] of branches.entries()) {
    const item = el("span", {});
    item.appendChild(el("span", { class: `key b${i % 8}` }));
    item.appendChild(document.createTextNode(`${b} ${totals[b] || 0}`));
    legend.appendChild(item);
  }
}

// ---- tables -----------------------------------------------------------
function workerState(w) {
  if (w.state !== "healthy") {
    const cls = w.state === "draining" || w.state === "pending" ? "info" : "bad";
    return [w.state, cls];
  }
  if (w.ejected) return ["ejected", "bad"];
  if (w.breaker === "open") return ["breaker open", "bad"];
  if (w.breaker === "half_open") return ["breaker half-open", "warn"];
  return ["healthy", "ok"];
}

function cell(text, cls, title) {
  const td = el("td", cls ? { class: cls } : {}, text);
  if (title) td.title = title;
  return td;
}

function workerRows(workers) {
  const maxLoad = Math.max(1, ...workers.map((w) => w.in_flight));
  const rows = workers.map((w) => {
    const tr = el("tr", { "data-worker": w.url });
    const name = w.role && w.role !== "regular" ? `${w.name} (${w.role})` : w.name;
    tr.appendChild(cell(name, null, w.id ? `${w.url} (${w.id})` : w.url));
    const [label, cls] = workerState(w);
    const st = el("td", {});
    st.appendChild(el("span", { class: `state ${cls}` }, label));
    tr.appendChild(st);
    const load = cell(String(w.in_flight), "num");
    const bar = el("span", { class: "load-bar" });
    bar.style.width = `${Math.round((w.in_flight / maxLoad) * 40)}px`;
    load.appendChild(bar);
    tr.appendChild(load);
    tr.appendChild(cell(fmtNum(w.requests_per_sec), "num rps"));
    tr.appendChild(cell(fmtCount(w.requests_total), "num done"));
    tr.appendChild(cell(fmtNum(w.errors_per_sec), w.errors_per_sec > 0 ? "num status-err" : "num"));
    tr.appendChild(cell(fmtCount(w.errors_total), "num"));
    tr.appendChild(cell(w.tree_chars === null ? "–" : fmtCount(w.tree_chars), "num", "characters the prefix tree holds for it"));
    const hit = cell(fmtPct(w.cache_hit_rate), "num hit");
    if (w.cache_hit_source) {
      hit.appendChild(el("span", { class: "src" }, w.cache_hit_source === "reported" ? "R" : "P"));
      hit.title = w.cache_hit_source === "reported" ? "reported cached_tokens / prompt tokens" : "predicted: matched / routed characters";
    }
    tr.appendChild(hit);
    return tr;
  });
  $("workers").tBodies[0].replaceChildren(...rows);
}

function recentRows(recent) {
  const rows = recent.map((r) => {
    const tr = el("tr", { "data-at": r.at_ms });
    tr.appendChild(cell(fmtTime(r.at_ms)));
    tr.appendChild(cell(r.model === null ? "*" : r.model));
    tr.appendChild(cell(String(r.status), r.status >= 400 || r.end === "upstream_error" ? "num status-err" : "num",
      r.end === "complete" ? "" : r.end));
    tr.appendChild(cell(r.worker.replace(/^https?:\/\//, ""), null, r.worker));
    tr.appendChild(cell(r.branch));
    tr.appendChild(cell(r.ttft_ms === null ? "–" : r.ttft_ms.toFixed(1), "num"));
    tr.appendChild(cell(r.latency_ms.toFixed(1), "num"));
    tr.appendChild(cell(r.decision, "decision", r.decision));
    return tr;
  });
  $("recent").tBodies[0].replaceChildren(...rows);
}

// ---- the loop ---------------------------------------------------------
function render(d) {
  document.body.dataset.state = "live";
  $("status").textContent = "live";
  $("message").hidden = true;
  // A prefill/decode pool: `policy` is prefill's, decode has its own.
  const policy = d.decode_policy ? `prefill ${d.policy} · decode ${d.decode_policy}` : d.policy;
  $("policy").textContent = `policy ${policy} · up ${Math.floor(d.uptime_secs / 60)} min`;
  const at = $("sampled-at");
  at.textContent = fmtTime(d.sampled_at_ms);
  at.dataset.ms = d.sampled_at_ms;
  const p = d.pool;
  $("available").textContent = `${p.available} / ${p.workers}`;
  $("in-flight").textContent = String(p.in_flight);
  $("answers-rate").textContent = fmtNum(p.answers_per_sec);
  $("errors-rate").textContent = fmtNum(p.error_answers_per_sec);
  $("ttft-now").textContent = p.ttft_ms ? `${fmtMs(p.ttft_ms.p50)} · ${fmtMs(p.ttft_ms.p99)}` : "–";
  $("latency-now").textContent = p.latency_ms ? `${fmtMs(p.latency_ms.p50)} · ${fmtMs(p.latency_ms.p99)}` : "–";
  $("answers-total").textContent = String(p.answers_total);
  $("rate-window").textContent = String(d.rate_window_secs);
  $("history").textContent = String(Math.round(d.history_secs / 60));
  $("worker-count").textContent = `${d.workers.length}`;

  // The charts span what has been sampled (at least a minute), up to the
  // whole history.
  const pts = d.series;
  const t1 = d.sampled_at_ms;
  const first = pts.length ? pts[0].t_ms : t1;
  const t0 = Math.max(t1 - d.history_secs * 1000, Math.min(first, t1 - 60 * 1000));
  decisionChart($("chart-decisions"), $("legend-decisions"), pts, t0, t1);
  const pct = (key, q) => (pt) => (pt[key] ? pt[key][q] : null);
  lineChart($("chart-ttft"), pts, t0, t1, ["p50", "p90", "p99"].map((q) => ({ cls: q, pick: pct("ttft_ms", q) })), "ms");
  lineChart($("chart-latency"), pts, t0, t1, ["p50", "p90", "p99"].map((q) => ({ cls: q, pick: pct("latency_ms", q) })), "ms");
  lineChart($("chart-answers"), pts, t0, t1, [
    { cls: "answers", pick: (pt) => pt.answers_per_sec },
    { cls: "errors", pick: (pt) => pt.error_answers_per_sec },
  ], "n");
  workerRows(d.workers);
  recentRows(d.recent);
}

function failed(text) {
  document.body.dataset.state = "error";
  $("status").textContent = "not updating";
  const m = $("message");
  m.textContent = text;
  m.hidden = false;
}

async function tick() {
  try {
    const r = await fetch(DATA_URL, {
      cache: "no-store",
      credentials: "same-origin",
      // Covers reading the body too.
      signal: AbortSignal.timeout(FETCH_TIMEOUT_MS),
    });
    if (r.status === 401) {
      failed("The admin key is required: reload the page and give it as the password (any user name).");
    } else if (!r.ok) {
      failed(`The data endpoint answered ${r.status}.`);
    } else {
      const d = await r.json();
      render(d);
      sameReadings = d.sampled_at_ms === shownAt ? sameReadings + 1 : 0;
      shownAt = d.sampled_at_ms;
      if (sameReadings >= SAME_READINGS) {
        failed(`The router answers, but has taken no new reading since ${fmtTime(d.sampled_at_ms)}: the figures shown are from then.`);
      }
    }
  } catch (e) {
    failed(`Cannot reach the router: ${e}`);
  }
  setTimeout(tick, REFRESH_MS);
}

tick();
