// The dashboard's pages, drawn from the JSON endpoints (GET /api lists them) and polled
// every data-poll-ms milliseconds. No framework: a few DOM helpers and uPlot for charts.
"use strict";

const body = document.body;
const PAGE = body.dataset.page;
const ROLE = body.dataset.role;
const USER = body.dataset.user;
const CSRF = body.dataset.csrf;
const POLL_MS = Number(body.dataset.pollMs || 3000);
const SUBJECT = body.dataset.subject;
const content = document.getElementById("content");
const updated = document.getElementById("updated");

// -- helpers -----------------------------------------------------------------------------

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v === true ? "" : String(v));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function usd(v, digits = 4) {
  return v === null || v === undefined ? "—" : "$" + Number(v).toFixed(digits);
}

function num(v, digits = 0) {
  return v === null || v === undefined
    ? "—"
    : Number(v).toLocaleString("en-US", { maximumFractionDigits: digits });
}

function when(epoch) {
  if (epoch === null || epoch === undefined) return "—";
  return new Date(epoch * 1000).toISOString().replace("T", " ").slice(0, 19);
}

function table(headers, rows, attrs) {
  return el(
    "table",
    attrs,
    el("thead", {}, el("tr", {}, headers.map((h) => el("th", {}, h)))),
    el("tbody", {}, rows.map((r) => el("tr", {}, r.map((c) => el("td", {}, c))))),
  );
}

function card(label, value, id) {
  return el("div", { class: "card", id }, el("div", { class: "label" }, label),
    el("div", { class: "value" }, value));
}

function section(title, ...children) {
  return el("section", {}, el("h2", {}, title), ...children);
}

async function getJSON(url) {
  const answer = await fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } });
  if (answer.status === 401) { window.location = "/login"; throw new Error("logged out"); }
  const data = await answer.json();
  if (!answer.ok) throw new Error(data.error || answer.statusText);
  return data;
}

async function act(url, fields, what) {
  const form = new URLSearchParams(fields || {});
  const answer = await fetch(url, {
    method: "POST",
    credentials: "same-origin",
    headers: { "X-CSRF-Token": CSRF, "Content-Type": "application/x-www-form-urlencoded" },
    body: form.toString(),
  });
  const data = await answer.json();
  flash(answer.ok ? `${what}: ${data.status || "done"}` : `${what} refused: ${data.error}`, !answer.ok);
  refresh();
}

function flash(message, error) {
  let box = document.getElementById("flash");
  if (!box) { box = el("p", { id: "flash" }); content.before(box); }
  box.textContent = message;
  box.className = error ? "error" : "ok";
}

// Only roles that may act get buttons; the server checks again (owner or admin).
const CAN_ACT = ROLE === "admin" || ROLE === "submit";
function mayChange(owner) { return ROLE === "admin" || (ROLE === "submit" && owner === USER); }

function cancelButton(job) {
  if (!mayChange(job.owner) || !["queued", "running"].includes(job.status)) return "";
  return el("button", {
    class: "cancel", "data-job": job.job,
    onclick: () => { if (confirm(`Cancel ${job.job}?`)) act(`/api/jobs/${encodeURIComponent(job.job)}/cancel`, {}, `cancel ${job.job}`); },
  }, "Cancel");
}

function drainButton(instance) {
  if (!CAN_ACT || !["pending", "running"].includes(instance.status)) return "";
  return el("button", {
    class: "drain", "data-instance": instance.instance,
    onclick: () => { if (confirm(`Drain ${instance.instance}?`)) act(`/api/instances/${encodeURIComponent(instance.instance)}/drain`, {}, `drain ${instance.instance}`); },
  }, "Drain");
}

// -- charts (uPlot) ------------------------------------------------------------------------

const charts = {};
function chart(id, title, series, data, width) {
  const holder = document.getElementById(id);
  if (!holder) return;
  const w = width || Math.min(900, content.clientWidth || 900);
  if (charts[id] && charts[id].series.length === series.length + 1) {
    charts[id].setData(data);
    return;
  }
  if (charts[id]) charts[id].destroy();
  holder.replaceChildren();
  const opts = {
    title, width: w, height: 260,
    scales: { x: { time: true } },
    series: [{}, ...series],
    axes: [{}, { values: (u, vals) => vals.map((v) => "$" + v.toFixed(2)) }],
  };
  charts[id] = new uPlot(opts, data, holder);
}

// Steps of a ledger: each point holds until the next one.
function stepped() { return uPlot.paths.stepped({ align: 1 }); }

// -- pages ----------------------------------------------------------------------------------

async function renderNow() {
  const d = await getJSON("/api/now");
  const last = d.last_round;
  const h = d.hourly;
  const cards = el("div", { class: "cards" },
    card("$/h now", usd(h.now), "hourly-now"),
    card("$/h planned", usd(h.planned)),
    card("$/h without packing", usd(h.no_packing), "hourly-no-packing"),
    card("LP lower bound $/h", usd(h.lower_bound), "hourly-bound"),
    card("instances", d.instances.length),
    card("last round", last ? `${last.chosen}` : "—", "last-choice"),
  );
  const reason = el("p", { id: "last-reason" }, last ? `Last round (${when(last.at)}, ${last.planner}): ${last.reason}` : "No round yet.");
  const headroom = d.headroom.length
    ? table(["guardrail", "limit", "used", "left", "used %"], d.headroom.map((g) => [
        g.guardrail, num(g.limit, 2), num(g.used, 4), num(g.left, 4),
        el("span", { class: g.used_share > 0.8 ? "warn" : "" }, g.used_share === null ? "—" : num(g.used_share * 100, 1) + "%"),
      ]))
    : el("p", { class: "muted" }, "No guardrail set.");
  const byType = table(["type", "capacity type", "instances"],
    d.instances_by_type.map((g) => [g.type, g.market, g.count]));
  const instances = table(
    ["instance", "type", "capacity", "status", "worker", "$/h", "up", "tasks (measured it/s)", ""],
    d.instances.map((i) => [
      i.instance, i.ec2_type, i.market, i.status, i.worker, usd(i.hourly_price),
      num(i.uptime_s / 60, 1) + " min",
      el("ul", { class: "tasks" }, i.task_detail.map((t) => el("li", {},
        el("a", { href: `/jobs/${encodeURIComponent(t.job)}` }, t.task),
        ` ${t.status}, ${t.throughput === null ? "not measured" : num(t.throughput, 2) + " it/s"}`))),
      drainButton(i),
    ]), { id: "instances" });
  const tasks = table(["status", "tasks"], Object.entries(d.tasks));
  content.replaceChildren(
    cards, reason,
    section("Guardrail headroom", headroom),
    section("Instances by type and capacity type", byType),
    section("Instances and their tasks", instances),
    section("Tasks by status", tasks),
  );
}

let jobFilter = { status: "", text: "" };
async function renderJobs() {
  const d = await getJSON("/api/jobs");
  const filters = el("div", { class: "filters" },
    el("label", {}, "status ", el("select", {
      id: "job-status", onchange: (e) => { jobFilter.status = e.target.value; renderJobs(); },
    }, ["", "queued", "running", "completed", "failed", "cancelled"].map((s) =>
      el("option", { value: s, selected: s === jobFilter.status }, s || "all")))),
    el("label", {}, " search ", el("input", {
      id: "job-text", value: jobFilter.text,
      oninput: (e) => { jobFilter.text = e.target.value; },
      onchange: (e) => { jobFilter.text = e.target.value; renderJobs(); },
    })),
  );
  const shown = d.jobs.filter((j) => (!jobFilter.status || j.status === jobFilter.status)
    && (!jobFilter.text || `${j.job} ${j.name} ${j.owner}`.includes(jobFilter.text)));
  const counts = el("div", { class: "cards" },
    Object.entries(d.counts).map(([s, n]) => card(s, n)), card("spend on jobs", usd(d.spend_on_jobs)), card("idle", usd(d.idle)));
  const rows = shown.slice().reverse().map((j) => [
    el("a", { href: `/jobs/${encodeURIComponent(j.job)}`, class: "job-link" }, j.job),
    j.name, j.owner, el("span", { class: `status ${j.status}`, "data-job-status": j.job }, j.status),
    `${j.running}/${j.tasks}`, el("span", { "data-job-progress": j.job }, num(j.progress)),
    num(j.attempts), num(j.moves), usd(j.cost), usd(j.expected_cost), when(j.submitted_at),
    j.reason, cancelButton(j),
  ]);
  content.replaceChildren(
    counts, filters,
    section(`Jobs (${shown.length} of ${d.jobs.length})`, table(
      ["job", "name", "owner", "status", "running", "progress (it)", "attempts", "moves", "cost so far", "expected", "submitted", "why", ""],
      rows, { id: "jobs" })),
    section("Spend by user", table(["user", "spend"], Object.entries(d.spend_by_user).map(([k, v]) => [k, usd(v)]))),
    section("Spend by team", table(["team", "spend"], Object.entries(d.spend_by_team).map(([k, v]) => [k, usd(v)]))),
  );
}

async function renderJob() {
  const id = encodeURIComponent(SUBJECT);
  const d = await getJSON(`/api/jobs/${id}`);
  let logs = { logs: {} };
  try { logs = await getJSON(`/api/jobs/${id}/logs?tail=50`); } catch (e) { logs = { logs: {}, error: e.message }; }
  const cards = el("div", { class: "cards" },
    card("status", el("span", { id: "job-status", class: `status ${d.status}` }, d.status)),
    card("progress (it)", el("span", { id: "job-progress" }, num(d.progress))),
    card("cost so far", usd(d.cost)),
    card("owner", d.owner),
    card("tasks", `${d.running}/${d.tasks} running`),
  );
  const tasks = table(
    ["task", "status", "instance", "attempt", "moves", "retries", "failures", "progress", "it/s", "checkpoint", "why"],
    d.task_list.map((t) => [t.task, t.status, t.instance || "—", t.attempt, t.migrations, t.retries,
      t.failures, num(t.progress), t.throughput === null ? "—" : num(t.throughput, 2),
      t.checkpoint ? "yes" : "—", t.reason]));
  const timeline = table(["at", "event", "what"], d.timeline.map((e) => [when(e.at), e.event, e.what]), { id: "timeline" });
  const tails = Object.entries(logs.logs).map(([k, text]) => el("div", {}, el("h3", {}, k), el("pre", { class: "log" }, text || "(empty)")));
  content.replaceChildren(
    cards, el("p", {}, cancelButton(d)), d.reason ? el("p", {}, d.reason) : "",
    section("Tasks", tasks), section("Timeline", timeline),
    section("Log tail", tails.length ? tails : el("p", { class: "muted" }, logs.error || "No log yet.")),
  );
}

let spendBuilt = false;
async function renderSpend() {
  const d = await getJSON("/api/spend");
  const r = d.report;
  const s = d.series;
  if (!spendBuilt) {
    content.replaceChildren(
      el("div", { class: "cards", id: "spend-cards" }),
      el("p", { id: "what-if", class: "what-if" }, "What-if: …"),
      section("$/h over time beside the LP lower bound", el("div", { id: "chart-hourly", class: "chart" })),
      section("Spend over time", el("div", { id: "chart-spend", class: "chart" })),
      el("div", { id: "spend-tables" }),
    );
    spendBuilt = true;
  }
  document.getElementById("spend-cards").replaceChildren(
    card("spend", usd(r.spend), "spend-total"),
    card("$/h now", usd(r.hourly_cost_now)),
    card("$/h without packing", usd(r.no_packing_hourly_cost_now)),
    card("LP lower bound $/h", usd(r.lower_bound_hourly_cost_now)),
    card("saved vs no packing", usd(r.savings)),
    card("idle", usd(r.idle)),
  );
  // The ledger's $/h (steps) and each round's planned, no-packing and LP-bound $/h, on the
  // union of their times (uPlot wants one x array): gaps are null and not joined.
  const xs = Array.from(new Set([...s.t, ...s.round_t])).sort((a, b) => a - b);
  const at = (times, values) => { const m = new Map(times.map((t, i) => [t, values[i]])); return xs.map((x) => (m.has(x) ? m.get(x) : null)); };
  const ledger = at(s.t, s.hourly);
  let lastRate = null;
  for (let i = 0; i < ledger.length; i++) { if (ledger[i] === null) ledger[i] = lastRate; else lastRate = ledger[i]; }
  chart("chart-hourly", "$/h", [
    { label: "billed $/h", stroke: "#1f77b4", width: 2, paths: stepped() },
    { label: "planned $/h", stroke: "#2ca02c", spanGaps: true },
    { label: "no packing $/h", stroke: "#d62728", dash: [6, 4], spanGaps: true },
    { label: "LP lower bound $/h", stroke: "#7f7f7f", dash: [2, 3], spanGaps: true },
  ], [xs, ledger, at(s.round_t, s.round_hourly), at(s.round_t, s.round_no_packing), at(s.round_t, s.round_lower_bound)]);
  chart("chart-spend", "cumulative $", [
    { label: "spent $", stroke: "#9467bd", width: 2, fill: "rgba(148,103,189,0.15)" },
  ], [s.t, s.spent]);
  const pairs = (o) => Object.entries(o || {}).map(([k, v]) => [k, usd(v)]);
  document.getElementById("spend-tables").replaceChildren(
    el("div", { class: "grid" },
      section("By type", table(["type", "spend"], pairs(r.spend_by_type))),
      section("By user", table(["user", "spend"], pairs(r.spend_by_user))),
      section("By team", table(["team", "spend"], pairs(r.spend_by_team))),
      section("By job", table(["job", "status", "spend"], Object.entries(r.spend_by_job).map(([k, v]) => [
        el("a", { href: `/jobs/${encodeURIComponent(k)}` }, k), (r.jobs[k] || {}).status || "", usd(v)]))),
    ),
  );
  getJSON("/api/what-if").then((w) => {
    const line = document.getElementById("what-if");
    if (w.state !== "ready") { line.textContent = `What-if: ${w.message}`; return; }
    const costs = Object.entries(w.would_have_cost || {});
    line.textContent = costs.length
      ? `Under ${costs.map(([k]) => k).join(" / ")} this week would have cost ${costs.map(([, v]) => usd(v, 2)).join(" / ")} (paid ${usd(w.paid, 2)}; replayed from the database).`
      : `What-if: ${w.message}`;
  }).catch(() => {});
}

let decisionFilter = { kind: "", outcome: "", chosen: "", q: "" };
async function renderDecisions() {
  const params = new URLSearchParams(Object.entries(decisionFilter).filter(([, v]) => v));
  const d = await getJSON(`/api/decisions?${params}`);
  const select = (name, values) => el("label", {}, `${name} `, el("select", {
    id: `filter-${name}`,
    onchange: (e) => { decisionFilter[name] = e.target.value; renderDecisions(); },
  }, ["", ...values].map((v) => el("option", { value: v, selected: v === decisionFilter[name] }, v || "all"))));
  const filters = el("div", { class: "filters" },
    select("kind", ["launch", "terminate", "start", "migrate", "stop", "adopt", "report"]),
    select("outcome", ["planned", "done", "refused", "failed", "skipped"]),
    select("chosen", ["full", "partial", "none"]),
    el("label", {}, " text ", el("input", {
      id: "filter-q", value: decisionFilter.q,
      oninput: (e) => { decisionFilter.q = e.target.value; },
      onchange: (e) => { decisionFilter.q = e.target.value; renderDecisions(); },
    })),
  );
  const rounds = d.rounds.map((r) => el("article", { class: "round" },
    el("h3", {}, `Round ${r.round} · ${when(r.at)} · ${r.chosen} (${r.planner}) · ${usd(r.hourly_cost)}/h, bound ${usd(r.lower_bound_hourly_cost)}/h`),
    el("p", {}, r.reason),
    r.actions.length ? table(["kind", "target", "outcome", "reason"], r.actions.map((a) => [
      a.kind, a.target, el("span", { class: `outcome ${a.outcome}` }, a.outcome), a.message ? `${a.reason} (${a.message})` : a.reason])) : "",
  ));
  content.replaceChildren(filters, el("div", { id: "rounds" }, rounds.length ? rounds : el("p", { class: "muted" }, "No round matches.")));
}

const RENDER = { now: renderNow, jobs: renderJobs, job: renderJob, spend: renderSpend, decisions: renderDecisions };

let busy = false;
async function refresh() {
  if (busy) return;
  busy = true;
  try {
    // Keep focus and typing in a filter box across a redraw.
    const focused = document.activeElement && document.activeElement.id;
    await RENDER[PAGE]();
    if (focused && document.getElementById(focused)) document.getElementById(focused).focus();
    updated.textContent = `updated ${new Date().toISOString().slice(11, 19)} UTC, every ${POLL_MS / 1000} s`;
    updated.className = "muted";
  } catch (e) {
    updated.textContent = `could not update: ${e.message}`;
    updated.className = "error";
  } finally {
    busy = false;
  }
}

refresh();
setInterval(() => { if (!document.hidden) refresh(); }, POLL_MS);
