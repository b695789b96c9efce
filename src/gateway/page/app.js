// The status page: reads the gateway's API and draws it. No framework, no build step.
// Every value a job produced is put on the page with textContent, never as HTML.
// Cells carry `data-field` (and, for numbers, `data-value` with the raw number) so the
// page can be checked against the API it reads.
"use strict";

const REFRESH_MS = 3000;
// The training tab reads every result's summary of the latest batches: a slower beat.
const TRAINING_REFRESH_MS = 15000;
const TOKEN_KEY = "rollout-gateway-token";
let timer = null;

// ---------- the API ----------

async function api(path) {
  const headers = {};
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) headers.Authorization = "Bearer " + token;
  const resp = await fetch(path, { headers });
  if (resp.status === 401) {
    askToken();
    throw new Error("the gateway wants its token");
  }
  const body = await resp.json().catch(() => ({}));
  if (!resp.ok) throw new Error(body.error || resp.status + " " + resp.statusText);
  return body;
}

function askToken() {
  document.getElementById("token-form").hidden = false;
}

// ---------- building the page ----------

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null) continue;
    if (k === "class") node.className = v;
    else if (k === "text") node.textContent = v;
    else node.setAttribute(k, v);
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

function fmtMs(ms) {
  if (ms === null || ms === undefined) return "–";
  if (ms < 1000) return Math.round(ms) + " ms";
  if (ms < 120000) return (ms / 1000).toFixed(1) + " s";
  return (ms / 60000).toFixed(1) + " min";
}

function fmtNum(v, digits) {
  if (v === null || v === undefined) return "–";
  return typeof v === "number" && digits !== undefined ? v.toFixed(digits) : String(v);
}

function fmtTime(ms) {
  if (!ms) return "–";
  return new Date(ms).toLocaleTimeString();
}

// A minute's start as hours and minutes, for axis labels.
function fmtMinute(ms) {
  return new Date(ms).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
}

function fmtAgo(ms, now) {
  if (!ms) return "–";
  return fmtMs(Math.max(0, now - ms)) + " ago";
}

// A numeric cell: shown formatted, the raw value in data-value.
function num(field, value, shown) {
  return el("td", { class: "num", "data-field": field, "data-value": value ?? "" },
    shown === undefined ? fmtNum(value) : shown);
}

function cell(field, ...children) {
  return el("td", { "data-field": field }, ...children);
}

function table(id, headers, rows, empty) {
  if (!rows.length) return el("p", { id, class: "muted" }, empty);
  const head = el("tr", {}, headers.map(h =>
    el("th", { class: h.startsWith("#") ? "num" : "" }, h.replace(/^#/, ""))));
  return el("table", { id }, el("thead", {}, head), el("tbody", {}, rows));
}

function link(href, text) {
  return el("a", { href }, text);
}

function progress(b) {
  const total = Math.max(b.submitted, 1);
  const ok = el("span");
  const failed = el("span", { class: "failed" });
  const bar = el("div", { class: "bar", title: b.finished + " of " + b.submitted + " ended" }, ok, failed);
  // Widths are set as properties: the page's policy allows no inline style attribute.
  ok.style.width = (100 * b.done / total) + "%";
  failed.style.left = (100 * b.done / total) + "%";
  failed.style.width = (100 * (b.finished - b.done) / total) + "%";
  return bar;
}

// ---------- the overview ----------

function overview(d) {
  const now = d.generated_at;
  const view = el("div", { id: "overview" });
  const t = d.throughput;
  const running = d.stages.reduce((s, x) => s + x.queue.running, 0);
  const queued = d.stages.reduce((s, x) => s + x.queue.queued, 0);
  view.append(el("div", { class: "cards" },
    card("throughput", "jobs/s (last minute)", t.recent_jobs_per_s.toFixed(2), t.recent_jobs_per_s),
    card("window-jobs", "results in the last " + fmtMs(d.window_ms), t.jobs, t.jobs),
    card("queued", "queued", queued, queued),
    card("running", "running", running, running),
    card("healthy-backends", "healthy backends",
      d.backends.filter(b => b.healthy).length + " / " + d.backends.length,
      d.backends.filter(b => b.healthy).length),
    policyCard(d.policy || {}, now),
  ));
  view.append(barChart("per-minute", "Results per minute (last " + fmtMs(d.window_ms) + ")", "time (minute)",
    "results / minute", perMinute(t.per_minute), v => String(Math.round(v))));

  view.append(el("h2", {}, "Batches"));
  view.append(table("batches",
    ["batch", "progress", "#submitted", "#ended", "#in flight", "#done", "#failed",
     "#cancelled", "#timed out", "#stale", "#mean reward", "last result"],
    d.batches.map(b => el("tr", { "data-batch": b.batch_id },
      cell("batch_id", link("#/batches/" + encodeURIComponent(b.batch_id), b.batch_id)),
      cell("progress", progress(b)),
      num("submitted", b.submitted), num("finished", b.finished), num("in_flight", b.in_flight),
      num("done", b.done), num("failed", b.failed), num("cancelled", b.cancelled),
      num("timed_out", b.timed_out), num("stale", b.stale),
      num("reward_mean", b.reward_mean, fmtNum(b.reward_mean, 3)),
      cell("last_result_at", fmtAgo(b.last_result_at, now)))),
    "No batches yet."));

  view.append(el("h2", {}, "Stages"));
  view.append(table("stages",
    ["stage", "#queued", "#running", "oldest waiting", "#finished", "#wait p50", "#wait p90",
     "#wait p99", "#work p50", "#work p90", "#work p99"],
    d.stages.map(s => el("tr", { "data-stage": s.queue.stage },
      cell("stage", s.queue.stage),
      num("queued", s.queue.queued), num("running", s.queue.running),
      cell("oldest_queued_at", fmtAgo(s.queue.oldest_queued_at, now)),
      num("finished", s.work_ms.count),
      num("wait_p50", s.wait_ms.p50, fmtMs(s.wait_ms.p50)),
      num("wait_p90", s.wait_ms.p90, fmtMs(s.wait_ms.p90)),
      num("wait_p99", s.wait_ms.p99, fmtMs(s.wait_ms.p99)),
      num("work_p50", s.work_ms.p50, fmtMs(s.work_ms.p50)),
      num("work_p90", s.work_ms.p90, fmtMs(s.work_ms.p90)),
      num("work_p99", s.work_ms.p99, fmtMs(s.work_ms.p99)))),
    ""));

  view.append(el("h2", {}, "Inference backends"));
  view.append(table("backends",
    ["backend", "kind", "model", "health", "#in flight", "#weight", "checked", "last error"],
    d.backends.map(b => el("tr", { "data-backend": b.backend_id },
      cell("backend_id", b.backend_id), cell("kind", b.kind), cell("model", b.model),
      el("td", { "data-field": "healthy", "data-value": b.healthy, class: b.healthy ? "ok" : "bad" },
        b.healthy ? "healthy" : "unhealthy"),
      num("in_flight", b.in_flight), num("weight", b.weight),
      cell("checked_at", fmtAgo(b.checked_at, now)),
      cell("last_error", b.last_error || ""))),
    "No inference backends registered."));

  view.append(el("h2", {}, "Failures in the last " + fmtMs(d.window_ms)));
  view.append(table("failures",
    ["status", "kind", "#jobs", "last", "error", "example"],
    d.failures.map(f => el("tr", { "data-reason": f.reason },
      el("td", { "data-field": "status", class: "bad" }, f.status), cell("kind", f.kind),
      num("jobs", f.jobs), cell("last_at", fmtAgo(f.last_at, now)),
      cell("reason", el("pre", {}, f.reason || "(no error)")),
      cell("example_job_id", link("#/jobs/" + encodeURIComponent(f.example_job_id), "job")))),
    "No failed or timed-out jobs in the last " + fmtMs(d.window_ms) + "."));

  view.append(el("h2", {}, "Sandboxes"));
  view.append(table("sandboxes",
    ["node", "sandbox backend", "#live RUN sandboxes", "oldest", "next lease ends"],
    d.sandboxes.map(s => el("tr", { "data-node": s.node },
      cell("node", s.node), cell("backend", s.backend), num("sandboxes", s.sandboxes),
      cell("oldest_created_at", fmtAgo(s.oldest_created_at, now)),
      cell("earliest_lease_until", fmtTime(s.earliest_lease_until)))),
    "No live sandboxes."));

  if (d.sampling.length) {
    view.append(el("h2", {}, "Dynamic-sampling batches"));
    view.append(table("sampling",
      ["batch", "status", "#informative", "#target", "#uniform", "#incomplete", "#stale",
       "#kept", "#adopted", "#launched", "#decided", "#jobs saved", "sandbox time saved"],
      d.sampling.map(s => el("tr", { "data-batch": s.batch_id },
        cell("batch_id", link("#/batches/" + encodeURIComponent(s.batch_id), s.batch_id)),
        cell("status", s.status + (s.reason ? " (" + s.reason + ")" : "")),
        num("informative", s.informative), num("target_groups", s.target_groups),
        num("uniform", s.uniform), num("incomplete", s.incomplete),
        num("stale_groups", s.stale_groups),
        num("kept_groups", s.kept_groups), num("adopted_groups", s.adopted_groups),
        num("groups_launched", s.groups_launched), num("groups_decided", s.groups_decided),
        num("jobs_saved", s.jobs_saved),
        num("sandbox_ms_saved", s.sandbox_ms_saved, fmtMs(s.sandbox_ms_saved)))),
      ""));
  }
  return view;
}

// The current policy version; during a weight update, the version it goes to, its mode
// and how long it has held generation.
function policyCard(p, now) {
  const current = p.current ? "v" + p.current.version : "none";
  if (!p.pause) return card("policy", "policy version", current, p.current ? p.current.version : "");
  const shown = current + " \u2192 v" + p.pause.version;
  const label = "weight update (" + p.pause.mode + ") for " + fmtMs(now - p.pause.since);
  return card("policy", label, shown, p.pause.version);
}

function card(id, label, shown, value) {
  return el("div", { class: "card", id: "card-" + id, "data-value": value },
    el("div", { class: "value" }, String(shown)), el("div", { class: "muted" }, label));
}

// Results per minute, all statuses together, as bars.
function perMinute(rows) {
  const byMinute = new Map();
  for (const m of rows) byMinute.set(m.minute, (byMinute.get(m.minute) || 0) + m.jobs);
  return [...byMinute.keys()].sort((a, b) => a - b)
    .map(m => ({ label: fmtMinute(m), value: byMinute.get(m), title: fmtTime(m) }));
}

// ---------- charts ----------
// Small SVG charts with labelled axes. Every mark carries its raw numbers in data-*
// attributes (data-x, data-y, data-label, data-value), so a test can check each one
// against the API.

const SVG = "http://www.w3.org/2000/svg";
const CHART_W = 560, CHART_H = 220, PAD_L = 56, PAD_R = 12, PAD_T = 12, PAD_B = 40;
const SERIES_CLASSES = ["s0", "s1", "s2", "s3"];

function svg(tag, attrs, ...children) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null) continue;
    if (k === "text") node.textContent = v;
    else node.setAttribute(k, v);
  }
  for (const c of children.flat()) if (c) node.append(c);
  return node;
}

// The y range of `values`, from 0 unless they go below it, never empty.
function yRange(values) {
  let lo = Math.min(0, ...values), hi = Math.max(...values);
  if (!isFinite(hi) || hi === lo) hi = lo + 1;
  return [lo, hi];
}

function axes(title, xLabel, yLabel, lo, hi, yFmt) {
  const g = svg("g", { class: "axes" });
  const x0 = PAD_L, y0 = CHART_H - PAD_B;
  g.append(svg("line", { x1: x0, y1: PAD_T, x2: x0, y2: y0 }));
  g.append(svg("line", { x1: x0, y1: y0, x2: CHART_W - PAD_R, y2: y0 }));
  g.append(svg("text", { x: x0 - 6, y: y0, "text-anchor": "end", class: "tick", text: yFmt(lo) }));
  g.append(svg("text", { x: x0 - 6, y: PAD_T + 8, "text-anchor": "end", class: "tick", text: yFmt(hi) }));
  g.append(svg("text", { x: (x0 + CHART_W - PAD_R) / 2, y: CHART_H - 4, "text-anchor": "middle", class: "axis-label", text: xLabel }));
  g.append(svg("text", { x: 12, y: (PAD_T + y0) / 2, "text-anchor": "middle", class: "axis-label",
    transform: "rotate(-90 12 " + (PAD_T + y0) / 2 + ")", text: yLabel }));
  return g;
}

function chartBox(id, title, node, legend) {
  return el("figure", { class: "chart", id },
    el("figcaption", {}, title), node, legend || null);
}

// A line chart: `series` = [{name, points: [{x, y}]}] over a shared x (epoch ms).
function lineChart(id, title, xLabel, yLabel, series, yFmt) {
  const pts = series.flatMap(s => s.points);
  if (!pts.length) return el("p", { id, class: "muted" }, title + ": no data in the window.");
  const xs = pts.map(p => p.x), ys = pts.map(p => p.y);
  const xlo = Math.min(...xs), xhi = Math.max(...xs) === xlo ? xlo + 60000 : Math.max(...xs);
  const [lo, hi] = yRange(ys);
  const X = x => PAD_L + (CHART_W - PAD_L - PAD_R) * (x - xlo) / (xhi - xlo);
  const Y = y => CHART_H - PAD_B - (CHART_H - PAD_B - PAD_T) * (y - lo) / (hi - lo);
  const root = svg("svg", { viewBox: "0 0 " + CHART_W + " " + CHART_H, role: "img", "aria-label": title });
  root.append(axes(title, xLabel, yLabel, lo, hi, yFmt));
  root.append(svg("text", { x: PAD_L, y: CHART_H - PAD_B + 14, class: "tick", text: fmtMinute(xlo) }));
  root.append(svg("text", { x: CHART_W - PAD_R, y: CHART_H - PAD_B + 14, "text-anchor": "end", class: "tick", text: fmtMinute(xhi) }));
  const legend = el("div", { class: "legend" });
  series.forEach((s, i) => {
    const cls = SERIES_CLASSES[i % SERIES_CLASSES.length];
    if (s.points.length > 1) {
      root.append(svg("polyline", { class: "line " + cls,
        points: s.points.map(p => X(p.x) + "," + Y(p.y)).join(" ") }));
    }
    for (const p of s.points) {
      root.append(svg("circle", { class: "dot " + cls, cx: X(p.x), cy: Y(p.y), r: 3,
        "data-series": s.name, "data-x": p.x, "data-y": p.y },
        svg("title", { text: s.name + " at " + fmtTime(p.x) + ": " + yFmt(p.y) })));
    }
    legend.append(el("span", { class: "key " + cls }, s.name));
  });
  return chartBox(id, title, root, series.length > 1 ? legend : null);
}

// A bar chart: `bars` = [{label, value, title}], labelled under each bar.
function barChart(id, title, xLabel, yLabel, bars, yFmt) {
  if (!bars.length) return el("p", { id, class: "muted" }, title + ": no data yet.");
  const [lo, hi] = yRange(bars.map(b => b.value));
  const root = svg("svg", { viewBox: "0 0 " + CHART_W + " " + CHART_H, role: "img", "aria-label": title });
  root.append(axes(title, xLabel, yLabel, lo, hi, yFmt));
  const w = (CHART_W - PAD_L - PAD_R) / bars.length;
  const Y = y => CHART_H - PAD_B - (CHART_H - PAD_B - PAD_T) * (y - lo) / (hi - lo);
  bars.forEach((b, i) => {
    const x = PAD_L + i * w + w * 0.15;
    const top = Math.min(Y(b.value), Y(0)), height = Math.max(1, Math.abs(Y(0) - Y(b.value)));
    root.append(svg("rect", { class: "bar-mark", x, y: top, width: w * 0.7, height,
      "data-label": b.label, "data-value": b.value },
      svg("title", { text: (b.title || b.label) + ": " + yFmt(b.value) })));
    if (bars.length <= 24) {
      root.append(svg("text", { x: x + w * 0.35, y: CHART_H - PAD_B + 14, "text-anchor": "middle",
        class: "tick", text: b.label.length > 10 ? b.label.slice(0, 9) + "…" : b.label }));
    }
  });
  return chartBox(id, title, root);
}

// ---------- training ----------

async function trainingView() {
  const t = await api("/v1/training");
  const view = el("div", { id: "training" });
  view.append(el("h2", {}, "Reward"));
  const rewardPoints = t.minutes.filter(m => m.reward_mean !== null && m.reward_mean !== undefined)
    .map(m => ({ x: m.minute, y: m.reward_mean }));
  view.append(el("div", { class: "charts" },
    lineChart("chart-reward-time", "Mean reward of done results, per minute", "time (minute)", "mean reward",
      [{ name: "mean reward", points: rewardPoints }], v => v.toFixed(2)),
    barChart("chart-reward-batch", "Mean reward by batch (oldest first)", "batch", "mean reward",
      t.batches.filter(b => b.reward_mean !== null).map(b => ({ label: b.batch_id, value: b.reward_mean })),
      v => v.toFixed(2)),
    t.policy_versions.length ? barChart("chart-reward-version", "Mean reward by policy version", "policy version",
      "mean reward", t.policy_versions.filter(v => v.reward_mean !== null)
        .map(v => ({ label: "v" + v.policy_version, value: v.reward_mean })), v => v.toFixed(2)) : null,
  ));
  view.append(el("h2", {}, "Throughput and stage latency"));
  const stages = ["init", "run", "eval"];
  view.append(el("div", { class: "charts" },
    barChart("chart-throughput", "Results per minute (last " + fmtMs(t.window_ms) + ")", "time (minute)",
      "results / minute", t.minutes.map(m => ({ label: fmtMinute(m.minute), value: m.results, title: fmtTime(m.minute) })),
      v => String(Math.round(v))),
    lineChart("chart-stage-latency", "Stage work time p50, per minute", "time (minute)", "p50 work time",
      stages.map(st => ({ name: st, points: t.stage_latency.filter(s => s.stage === st && s.work_ms.p50 !== null)
        .map(s => ({ x: s.minute, y: s.work_ms.p50 })) })).filter(s => s.points.length),
      v => fmtMs(v)),
  ));
  view.append(el("h2", {}, "Episodes by batch"));
  view.append(table("training-batches",
    ["batch", "#results", "#done", "#mean reward", "#reward std", "finish reasons", "#mean turns", "turns",
     "#response p50", "#response p90", "#response max", "response lengths", "#tool calls", "#tool errors", "#tool-error rate"],
    t.batches.map(b => el("tr", { "data-batch": b.batch_id },
      cell("batch_id", link("#/batches/" + encodeURIComponent(b.batch_id), b.batch_id)),
      num("results", b.results), num("done", b.done),
      num("reward_mean", b.reward_mean, fmtNum(b.reward_mean, 3)),
      num("reward_std", b.reward_std, fmtNum(b.reward_std, 3)),
      cell("finish_reasons", counts(b.finish_reasons)),
      num("turns_mean", b.turns_mean, fmtNum(b.turns_mean, 2)),
      cell("turns", histogramBars(b.turns, "turns")),
      num("response_p50", b.response_tokens.p50, fmtNum(b.response_tokens.p50, 0)),
      num("response_p90", b.response_tokens.p90, fmtNum(b.response_tokens.p90, 0)),
      num("response_max", b.response_tokens_max),
      cell("response_histogram", histogramBars(b.response_tokens_histogram, "tokens from")),
      num("tool_calls", b.tool_calls), num("tool_errors", b.tool_errors),
      num("tool_error_rate", b.tool_error_rate,
        b.tool_error_rate === null ? "–" : (100 * b.tool_error_rate).toFixed(1) + "%"))),
    "No batches yet."));
  if (t.batches.some(b => b.read < b.results)) {
    view.append(el("p", { class: "muted" }, "Distributions of large batches are read from their latest results."));
  }
  return view;
}

// Categories with their counts, one chip each: "answered 12".
function counts(list) {
  return el("span", { class: "chips" }, list.map(c =>
    el("span", { class: "chip", "data-count": c.value, "data-value": c.jobs }, c.value + " " + c.jobs)));
}

// A small histogram: one bar per value, its height the share of the largest.
function histogramBars(list, what) {
  if (!list.length) return "–";
  const max = Math.max(...list.map(c => c.jobs));
  const box = el("span", { class: "mini-hist" });
  for (const c of list) {
    const bar = el("span", { "data-bucket": c.value, "data-value": c.jobs, title: what + " " + c.value + ": " + c.jobs });
    bar.style.height = Math.max(8, 100 * c.jobs / max) + "%";
    box.append(bar);
  }
  return box;
}

// ---------- a batch ----------

async function batchView(id) {
  const page = await api("/v1/jobs?limit=1000&batch=" + encodeURIComponent(id));
  const sampling = await api("/v1/batches/" + encodeURIComponent(id)).catch(() => null);
  const view = el("div", { id: "batch" });
  view.append(el("h2", {}, "Batch ", el("code", {}, id)));
  if (sampling && sampling.batch) {
    const verdicts = await api("/v1/batches/" + encodeURIComponent(id) + "/verdicts");
    view.append(groupsView(sampling, verdicts, page.jobs));
  }
  view.append(el("h3", {}, "Jobs"));
  view.append(table("jobs",
    ["job", "client id", "kind", "group", "status", "stage", "#reward", "finish", "#attempts", "#restarts", "error"],
    page.jobs.map(j => el("tr", { "data-job": j.id },
      cell("id", link("#/jobs/" + encodeURIComponent(j.id), j.id)),
      cell("client_id", j.client_id || ""), cell("kind", j.kind), cell("group_id", j.group_id || ""),
      cell("status", statusText(j.status)), cell("stage", j.stage),
      num("reward", j.reward, fmtNum(j.reward, 3)), cell("finish_reason", j.finish_reason || ""),
      num("attempts", j.attempts), num("restarts", j.restarts),
      cell("error", j.error || ""))),
    "No jobs in this batch."));
  if (page.next_cursor) view.append(el("p", { class: "muted" }, "Showing the first 1000 jobs."));
  return view;
}

// A sampling batch: its verdict counts, then every group it launched with its verdict
// and each sample's reward (from the batch's jobs).
function groupsView(v, verdicts, jobs) {
  const b = v.batch, c = b.counters;
  const box = el("div", { id: "groups-view" });
  box.append(el("h3", {}, "Dynamic sampling"));
  box.append(el("dl", { class: "kv", id: "sampling-summary" },
    el("dt", {}, "status"), el("dd", { "data-field": "status" }, b.status + (b.reason ? " (" + b.reason + ")" : "")),
    el("dt", {}, "informative (accepted)"), el("dd", { "data-field": "informative", "data-value": c.informative }, c.informative + " of " + b.target_groups),
    el("dt", {}, "uniform"), el("dd", { "data-field": "uniform", "data-value": c.uniform }, c.uniform),
    el("dt", {}, "incomplete"), el("dd", { "data-field": "incomplete", "data-value": c.incomplete }, c.incomplete),
    el("dt", {}, "stale"), el("dd", { "data-field": "stale_groups", "data-value": c.stale_groups }, c.stale_groups),
    el("dt", {}, "groups launched / decided"), el("dd", { "data-field": "groups_decided", "data-value": c.groups_decided },
      c.groups_launched + " / " + c.groups_decided),
    el("dt", {}, "samples cancelled early"), el("dd", { "data-field": "jobs_saved", "data-value": c.jobs_saved }, c.jobs_saved),
  ));
  const byGroup = new Map();
  for (const j of jobs) {
    if (!byGroup.has(j.group_id)) byGroup.set(j.group_id, []);
    byGroup.get(j.group_id).push(j);
  }
  box.append(table("groups",
    ["group", "#prompt", "verdict", "#accepted rank", "#mean reward", "#reward std", "rewards per sample"],
    verdicts.groups.map(g => el("tr", { "data-group": g.group_id },
      cell("group_id", g.group_id), num("prompt_index", g.prompt_index),
      el("td", { "data-field": "state", class: g.state === "informative" ? "ok" : g.state === "in_flight" ? "" : "warn" },
        g.state),
      num("accepted_rank", g.accepted_rank), num("reward_mean", g.reward_mean, fmtNum(g.reward_mean, 3)),
      num("reward_std", g.reward_std, fmtNum(g.reward_std, 3)),
      cell("rewards", g.carried_from ? "samples in batch " + g.carried_from :
        el("span", { class: "chips" }, (byGroup.get(g.group_id) || []).map(j =>
          el("a", { class: "chip", href: "#/jobs/" + encodeURIComponent(j.id), "data-job": j.id,
            "data-value": j.reward ?? "" }, j.reward === undefined ? j.status : fmtNum(j.reward, 2))))))),
    "No group launched yet."));
  if (verdicts.more) box.append(el("p", { class: "muted" }, "Showing the first groups launched."));
  return box;
}

function statusText(status) {
  const cls = status === "done" ? "ok" : (status === "failed" || status === "timed_out") ? "bad" : status === "stale" ? "warn" : "";
  return el("span", { class: cls }, status);
}

// ---------- a job ----------

async function jobView(id) {
  const { job, result, events } = await api("/v1/jobs/" + encodeURIComponent(id));
  const view = el("div", { id: "job", "data-job": job.id });
  view.append(el("h2", {}, "Job ", el("code", {}, job.id)));
  const reward = result ? result.reward : null;
  view.append(el("dl", { class: "kv", id: "job-summary" },
    el("dt", {}, "kind"), el("dd", { "data-field": "kind" }, job.kind),
    el("dt", {}, "batch"), el("dd", { "data-field": "batch_id" },
      link("#/batches/" + encodeURIComponent(job.batch_id), job.batch_id)),
    el("dt", {}, "status"), el("dd", { "data-field": "status" }, statusText(job.status)),
    el("dt", {}, "stage"), el("dd", { "data-field": "stage" }, job.stage),
    el("dt", {}, "reward"), el("dd", { "data-field": "reward", "data-value": reward ?? "" }, fmtNum(reward)),
    el("dt", {}, "attempts / restarts"), el("dd", {}, job.attempts + " / " + job.restarts),
    job.error ? [el("dt", {}, "error"), el("dd", { "data-field": "error", class: "bad" }, el("pre", {}, job.error))] : null,
  ));
  if (job.status === "failed" || job.status === "timed_out") view.append(errorContext(job, events));
  view.append(promptView(job.task));
  view.append(timeline(job, events));
  const run = job.run_output || (result && result.output && result.output.run) || null;
  if (run && Array.isArray(run.turns)) view.append(trajectory(run));
  else if (run && Array.isArray(run.steps)) view.append(steps(run.steps));
  const evalOut = result && result.output ? result.output.eval : null;
  if (evalOut) {
    view.append(el("h3", {}, "Evaluation"));
    view.append(el("pre", { id: "eval" }, JSON.stringify(evalOut, null, 2)));
  }
  return view;
}

// Where a failed job failed: its stage, attempt and node, and the events before the end.
function errorContext(job, events) {
  const last = (events || []).slice(-6);
  const box = el("div", { id: "error-context", class: "bad-box" });
  box.append(el("h3", {}, "Why it " + (job.status === "timed_out" ? "timed out" : "failed")));
  box.append(el("p", {},
    "In stage ", el("b", { "data-field": "error_stage" }, job.stage),
    ", attempt ", el("b", { "data-field": "error_attempt", "data-value": job.attempts }, job.attempts),
    job.node ? [", on node ", el("b", { "data-field": "error_node" }, job.node)] : null, "."));
  box.append(el("pre", { "data-field": "error_text" }, job.error || "(no error recorded)"));
  box.append(el("p", { class: "muted" }, "The last events:"));
  box.append(eventTable("error-events", last, job.created_at));
  return box;
}

// The task's prompt: its messages, or its prompt text, or else its spec.
function promptView(task) {
  const spec = (task && task.spec) || {};
  const box = el("div", { id: "prompt" });
  box.append(el("h3", {}, "Prompt"));
  if (Array.isArray(spec.messages)) {
    for (const m of spec.messages) {
      const content = typeof m.content === "string" ? m.content : JSON.stringify(m.content);
      box.append(el("div", { class: "message", "data-role": m.role },
        el("div", { class: "meta" }, m.role), el("pre", { "data-field": "prompt" }, content)));
    }
  } else if (typeof spec.prompt === "string") {
    box.append(el("pre", { "data-field": "prompt" }, spec.prompt));
  } else {
    box.append(el("pre", { "data-field": "spec" }, JSON.stringify(spec, null, 2)));
  }
  return box;
}

// The stages' times (queued, started, finished, wait, work) and every event.
function timeline(job, events) {
  const box = el("div", { id: "timeline" });
  box.append(el("h3", {}, "Stage timeline"));
  const t0 = job.created_at;
  const rel = at => at ? "+" + fmtMs(at - t0) : "–";
  box.append(table("stage-times",
    ["stage", "queued", "started", "finished", "#wait", "#work"],
    ["init", "run", "eval"].map(st => {
      const x = job.timings[st] || {};
      const wait = x.started_at && x.queued_at ? x.started_at - x.queued_at : null;
      const work = x.finished_at && x.started_at ? x.finished_at - x.started_at : null;
      return el("tr", { "data-stage": st },
        cell("stage", st), cell("queued_at", rel(x.queued_at)), cell("started_at", rel(x.started_at)),
        cell("finished_at", rel(x.finished_at)),
        num("wait_ms", wait, fmtMs(wait)), num("work_ms", work, fmtMs(work)));
    }), ""));
  box.append(el("p", { class: "muted" }, "Events (times from submission):"));
  box.append(eventTable("events", events || [], t0));
  return box;
}

function eventTable(id, events, t0) {
  return table(id, ["time", "event", "stage", "#attempt", "node", "detail"],
    events.map(e => el("tr", { "data-event": e.event },
      cell("at", "+" + fmtMs(e.at - t0)), cell("event", e.event), cell("stage", e.stage || ""),
      num("attempt", e.attempt), cell("node", e.node || ""), cell("detail", e.detail || ""))),
    "No events.");
}

function trajectory(run) {
  const box = el("div", { id: "trajectory" });
  const modelTokens = run.loss_mask ? run.loss_mask.reduce((s, m) => s + m, 0) : null;
  const drift = run.drift;
  box.append(el("h3", {}, "Trajectory"));
  box.append(el("dl", { class: "kv" },
    el("dt", {}, "model"), el("dd", {}, run.model || ""),
    el("dt", {}, "finish reason"), el("dd", { "data-field": "finish_reason" }, run.finish_reason || "–"),
    el("dt", {}, "turns"), el("dd", { "data-field": "turns", "data-value": run.turns.length }, run.turns.length),
    el("dt", {}, "prompt tokens"), el("dd", { "data-field": "prompt_tokens", "data-value": (run.prompt_ids || []).length }, (run.prompt_ids || []).length),
    el("dt", {}, "response tokens"), el("dd", { "data-field": "response_tokens", "data-value": (run.response_ids || []).length },
      (run.response_ids || []).length + (modelTokens !== null ? " (" + modelTokens + " from the model)" : "")),
    el("dt", {}, "drift"), el("dd", { "data-field": "drift", class: drift ? (drift.identical ? "ok" : "warn") : "muted" },
      drift ? (drift.error ? "could not be checked: " + drift.error
        : drift.identical ? "none: re-tokenizing gives the same tokens"
        : "re-tokenizing differs from token " + drift.first_difference) : "not checked"),
    run.answer ? [el("dt", {}, "answer"), el("dd", { "data-field": "answer" }, el("pre", {}, run.answer))] : null,
  ));
  run.turns.forEach((t, i) => {
    const modelN = t.model_range[1] - t.model_range[0];
    const obsN = t.observation_range[1] - t.observation_range[0];
    const turn = el("div", { class: "turn", "data-turn": i },
      el("div", { class: "meta" },
        "turn " + (i + 1) + " · " + modelN + " model tokens · " + obsN + " observation tokens · prompt " +
        t.prompt_tokens + " tokens · " + t.backend + " · " + t.generation_finish + " · model " +
        fmtMs(t.llm_latency_us / 1000) + ", tools " + fmtMs(t.tool_latency_us / 1000)),
      el("pre", { class: "model-text" }, t.text));
    for (const tool of t.tools || []) {
      const call = tool.call ? tool.call.name + " " + JSON.stringify(tool.call.arguments) : "(unparsed call)";
      turn.append(el("div", { class: "tool" },
        el("div", { class: "call" }, el("code", {}, call),
          tool.ok ? null : el("span", { class: "bad" }, " failed"),
          el("span", { class: "muted" }, " · " + fmtMs(tool.latency_us / 1000))),
        el("pre", { class: "observation" }, tool.observation)));
    }
    box.append(turn);
  });
  return box;
}

function steps(list) {
  const box = el("div", { id: "trajectory" });
  box.append(el("h3", {}, "Steps"));
  list.forEach((s, i) => {
    const obs = s.observation || {};
    box.append(el("div", { class: "turn", "data-turn": i },
      el("div", { class: "meta" }, "step " + (i + 1) + " · " + (s.tool || "")),
      el("pre", { class: "model-text" }, JSON.stringify(s.args ?? {}, null, 1)),
      el("pre", { class: "observation" }, obs.output ?? JSON.stringify(obs, null, 1))));
  });
  return box;
}

// ---------- routing and refresh ----------

async function render() {
  clearTimeout(timer);
  const hash = location.hash.replace(/^#/, "") || "/";
  const parts = hash.split("/").filter(Boolean).map(decodeURIComponent);
  const errorBox = document.getElementById("error");
  let refresh = REFRESH_MS;
  try {
    let view;
    if (parts[0] === "jobs" && parts[1]) {
      view = await jobView(parts[1]);
      refresh = 0;
    } else if (parts[0] === "batches" && parts[1]) {
      view = await batchView(parts[1]);
    } else if (parts[0] === "training") {
      view = await trainingView();
      refresh = TRAINING_REFRESH_MS;
    } else {
      view = overview(await api("/v1/dashboard"));
    }
    document.getElementById("view").replaceChildren(view);
    document.getElementById("updated").textContent = "updated " + new Date().toLocaleTimeString();
    errorBox.hidden = true;
    document.body.dataset.loaded = hash;
  } catch (e) {
    errorBox.textContent = "Cannot read the gateway: " + e.message;
    errorBox.hidden = false;
  }
  if (refresh) timer = setTimeout(render, refresh);
}

document.getElementById("token").addEventListener("submit", ev => {
  ev.preventDefault();
  sessionStorage.setItem(TOKEN_KEY, document.getElementById("token-input").value.trim());
  document.getElementById("token-form").hidden = true;
  render();
});
window.addEventListener("hashchange", render);
render();
