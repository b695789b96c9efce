// The status page: reads the gateway's API and draws it. No framework, no build step.
// Every value a job produced is put on the page with textContent, never as HTML.
// Cells carry `data-field` (and, for numbers, `data-value` with the raw number) so the
// page can be checked against the API it reads.
"use strict";

const REFRESH_MS = 3000;
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
  view.append(el("h3", {}, "Results per minute"), spark(t.per_minute));

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

function spark(perMinute) {
  const byMinute = new Map();
  for (const m of perMinute) byMinute.set(m.minute, (byMinute.get(m.minute) || 0) + m.jobs);
  const minutes = [...byMinute.keys()].sort((a, b) => a - b);
  if (!minutes.length) return el("p", { class: "muted" }, "No results in the window.");
  const max = Math.max(...byMinute.values());
  const box = el("div", { class: "spark", id: "per-minute" });
  for (const m of minutes) {
    const bar = el("span", { title: fmtTime(m) + ": " + byMinute.get(m) + " results" });
    bar.style.height = Math.max(2, 100 * byMinute.get(m) / max) + "%";
    box.append(bar);
  }
  return box;
}

// ---------- a batch ----------

async function batchView(id) {
  const page = await api("/v1/jobs?limit=1000&batch=" + encodeURIComponent(id));
  const view = el("div", { id: "batch" });
  view.append(el("h2", {}, "Batch ", el("code", {}, id)));
  view.append(table("jobs",
    ["job", "client id", "kind", "group", "status", "stage", "#attempts", "#restarts", "error"],
    page.jobs.map(j => el("tr", { "data-job": j.id },
      cell("id", link("#/jobs/" + encodeURIComponent(j.id), j.id)),
      cell("client_id", j.client_id || ""), cell("kind", j.kind), cell("group_id", j.group_id || ""),
      cell("status", statusText(j.status)), cell("stage", j.stage),
      num("attempts", j.attempts), num("restarts", j.restarts),
      cell("error", j.error || ""))),
    "No jobs in this batch."));
  if (page.next_cursor) view.append(el("p", { class: "muted" }, "Showing the first 1000 jobs."));
  return view;
}

function statusText(status) {
  const cls = status === "done" ? "ok" : (status === "failed" || status === "timed_out") ? "bad" : status === "stale" ? "warn" : "";
  return el("span", { class: cls }, status);
}

// ---------- a job ----------

async function jobView(id) {
  const { job, result } = await api("/v1/jobs/" + encodeURIComponent(id));
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
  let refresh = true;
  try {
    let view;
    if (parts[0] === "jobs" && parts[1]) {
      view = await jobView(parts[1]);
      refresh = false;
    } else if (parts[0] === "batches" && parts[1]) {
      view = await batchView(parts[1]);
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
  if (refresh) timer = setTimeout(render, REFRESH_MS);
}

document.getElementById("token").addEventListener("submit", ev => {
  ev.preventDefault();
  sessionStorage.setItem(TOKEN_KEY, document.getElementById("token-input").value.trim());
  document.getElementById("token-form").hidden = true;
  render();
});
window.addEventListener("hashchange", render);
render();
