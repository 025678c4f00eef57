// mellum-proxy's live page: one event stream (/ui/events), plain DOM and SVG, no library, no request
// leaving this origin. Sections: Now (state), Explain (doctor), Over time (charts), Live (timeline),
// Compare (reports opened from disk).
"use strict";

const MAX_ROWS = 300;
const WINDOW_S = 300;
const BUCKET_S = 10;
// The outcomes chart's lines, each named by the outcomes it counts (the record's `outcome` values).
const OUTCOME_LINES = [["ok", "s-ok"], ["reused", "s-reused"], ["cancelled/debounced/skipped", "s-dropped"],
  ["client_gone/shutdown", "s-gone"], ["timeout", "s-timeout"],
  ["upstream_error/queue_full/internal_error/bad_request", "s-error"]];
// The chat lane's (chats and agents passed through): answered, refused or waited out, let go, failed.
const CHAT_LINES = [["ok", "s-ok"], ["queue_full/timeout", "s-timeout"], ["client_gone", "s-gone"],
  ["upstream_error", "s-error"]];
const MAX_CHAT_ROWS = 100;
const POLICY_KEYS = ["dispatch", "debounce_ms", "hold_min_ms", "max_inflight", "max_concurrency", "max_queue",
  "timeout_ms", "max_context_tokens", "max_tokens", "reuse", "postprocess", "stop_at_blank_line", "keep_prefill",
  "fim_template", "tokenizer", "log_content", "completion_reserve", "max_bulk_queue", "bulk_wait_ms"];

const rows = new Map(); // request id -> {record, tr}
const finished = []; // {at, ttft, outcome} for the charts
const chats = []; // {at, outcome}: the chat lane's, for its chart
const samples = []; // {at, held, queued, bulk, gpu} from the state events
let gpuReason = "";

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key === "class") node.className = value;
    else node.setAttribute(key, value);
  }
  for (const child of children) node.append(child instanceof Node ? child : String(child ?? ""));
  return node;
}

function svgEl(tag, attrs = {}) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, value);
  return node;
}

const ms = (value) => (typeof value === "number" ? Math.round(value) : "");
const clock = (unix) => new Date(unix * 1000).toLocaleTimeString([], { hour12: false });

// ---- the stream ---------------------------------------------------------------------------------------------

const events = new EventSource("/ui/events");
const connection = document.getElementById("connection");
events.addEventListener("open", () => { connection.textContent = "live"; connection.className = "badge up"; });
events.addEventListener("error", () => { connection.textContent = "reconnecting"; connection.className = "badge down"; });
events.addEventListener("hello", (event) => {
  const hello = JSON.parse(event.data);
  document.getElementById("version").textContent = `v${hello.version}`;
  document.getElementById("content-note").textContent = hello.log_content
    ? "source text shown (--log-content is on)" : "no source text (lengths and digests only)";
});
events.addEventListener("requests", (event) => { for (const record of JSON.parse(event.data)) addRequest(record); drawCharts(); });
events.addEventListener("accepted", (event) => {
  for (const judged of JSON.parse(event.data)) {
    const row = rows.get(judged.request_id);
    if (row) row.tr.querySelector(".kept").textContent = judged.accepted_chars;
  }
});
events.addEventListener("chats", (event) => { for (const record of JSON.parse(event.data)) addChat(record); drawCharts(); });
events.addEventListener("state", (event) => showState(JSON.parse(event.data)));

// ---- Live ---------------------------------------------------------------------------------------------------

function addRequest(record) {
  const known = rows.get(record.id);
  if (known) return; // a reconnect sends the kept records again
  const at = record.received_at + (record.total_ms ?? 0) / 1000;
  finished.push({ at, ttft: record.ttft_ms, outcome: record.outcome });
  const queue = record.queue_ms ?? 0;
  const ttft = record.ttft_ms ?? 0;
  const total = record.total_ms ?? 0;
  const spans = el("div", { class: "spans", title: `queue ${ms(queue)} ms, first token ${ms(ttft)} ms, total ${ms(total)} ms` });
  const scale = 160 / Math.max(2000, total);
  for (const [cls, width] of [["queue", queue], ["ttft", Math.max(0, ttft - queue)], ["rest", Math.max(0, total - Math.max(ttft, queue))]]) {
    const span = el("span", { class: cls });
    span.style.width = `${Math.round(width * scale)}px`;
    spans.append(span);
  }
  const prompt = record.prompt_tokens == null ? "" : `${record.prompt_tokens}${record.cached_tokens ? ` (${record.cached_tokens})` : ""}`;
  const tr = el("tr", { "data-request-id": record.id },
    el("td", {}, clock(record.received_at)),
    el("td", { class: "id" }, record.id),
    el("td", {}, record.dialect),
    el("td", {}, record.session),
    el("td", { class: `outcome outcome-${record.outcome}` }, record.outcome),
    el("td", { class: "num queue" }, ms(record.queue_ms)),
    el("td", { class: "num ttft" }, ms(record.ttft_ms)),
    el("td", { class: "num total" }, ms(record.total_ms)),
    el("td", {}, spans),
    el("td", { class: "num" }, prompt),
    el("td", { class: "rule" }, record.cleaned ?? ""),
    el("td", { class: "num kept" }, ""));
  if (record.content?.completion != null) tr.title = record.content.completion; // only with --log-content
  const body = document.querySelector("#timeline tbody");
  body.prepend(tr);
  rows.set(record.id, { record, tr });
  while (body.rows.length > MAX_ROWS) {
    const last = body.lastElementChild;
    rows.delete(last.dataset.requestId);
    last.remove();
  }
}

// A chat or agent request passed through (the bulk lane): its times and status, never its text.
function addChat(record) {
  const body = document.querySelector("#chats tbody");
  if (body.querySelector(`[data-request-id="${CSS.escape(record.id)}"]`)) return; // sent again on a reconnect
  chats.push({ at: record.received_at + (record.total_ms ?? 0) / 1000, outcome: record.outcome });
  body.prepend(el("tr", { "data-request-id": record.id },
    el("td", {}, clock(record.received_at)),
    el("td", { class: "id" }, record.id),
    el("td", {}, record.session),
    el("td", { class: `outcome outcome-${record.outcome}` }, record.outcome),
    el("td", { class: "num" }, record.upstream_status ?? ""),
    el("td", { class: "num queue" }, ms(record.queue_ms)),
    el("td", { class: "num ttft" }, ms(record.ttft_ms)),
    el("td", { class: "num total" }, ms(record.total_ms))));
  while (body.rows.length > MAX_CHAT_ROWS) body.lastElementChild.remove();
}

// ---- Now, Explain, the warning ------------------------------------------------------------------------------

// A sleeping server (its model unloaded when idle) is up, and says so: the next keystroke wakes it.
function upstreamState(member) {
  if (!member.up) return "down";
  if (member.waking) return "waking";
  if (member.asleep) return "asleep";
  return member.serving ? "serving" : "up";
}

function showState(state) {
  const view = state.discovered ?? {};
  const upstreams = document.querySelector("#upstreams tbody");
  upstreams.replaceChildren(...state.upstreams.map((member, index) => el("tr", {},
    el("td", {}, member.url),
    el("td", {}, el("span", { class: `badge ${upstreamState(member)}` }, upstreamState(member))),
    el("td", {}, index === 0 ? view.kind ?? "unknown" : ""),
    el("td", {}, index === 0 ? view.model ?? "" : ""),
    el("td", { class: "num" }, index === 0 ? view.context_tokens ?? "" : ""),
    el("td", { class: "num" }, index === 0 ? state.upstream.max_concurrency : ""),
    el("td", { class: "num" }, member.served),
    el("td", { class: "num" }, member.failed),
    el("td", { class: "num" }, member.wakes ? `${member.wakes} (last ${member.last_wake_s} s)` : ""))));
  const bulk = state.lanes?.bulk ?? {};
  const counts = [["in flight", state.inflight], ["queued", state.queued], ["held (debounce)", state.debouncing],
    ["sessions", Object.keys(state.sessions ?? {}).length], ["chat / agents in flight", bulk.inflight],
    ["chat / agents waiting", bulk.queued]];
  if (state.speculation) counts.push([`draft acceptance (${state.speculation.accepted} of ${state.speculation.drafted})`,
    `${Math.round(state.speculation.acceptance * 100)} %`]);
  document.getElementById("counts").replaceChildren(...counts.map(([label, value]) => el("div", {}, el("b", {}, value ?? 0), label)));
  const settings = state.settings ?? {};
  document.querySelector("#policies tbody").replaceChildren(...POLICY_KEYS.filter((key) => key in settings)
    .map((key) => el("tr", {}, el("td", {}, key), el("td", {}, JSON.stringify(settings[key])))));
  const warning = document.getElementById("warning");
  warning.hidden = !state.warning;
  warning.textContent = state.warning ?? "";
  if (state.explain) {
    const explain = state.explain;
    document.getElementById("verdict").replaceChildren(el("b", {}, explain.verdict), explain.knob ? ` — move first: ${explain.knob}` : "");
    document.getElementById("evidence").replaceChildren(...explain.evidence.map((line) => el("li", {}, line)));
  }
  const vram = state.vram ?? {};
  gpuReason = vram.source === "nvml" ? "" : `no GPU reading: ${vram.reason ?? vram.source}`;
  samples.push({ at: state.at, held: state.inflight, queued: state.queued, bulk: bulk.inflight, gpu: vram.used_mib });
  while (samples.length && samples[0].at < state.at - WINDOW_S) samples.shift();
  drawCharts(state.at);
}

// ---- charts (plain SVG) -------------------------------------------------------------------------------------

const W = 400, H = 150, LEFT = 40, BOTTOM = 18, LEGEND_ROW = 14;

function percentile(values, q) {
  if (!values.length) return null;
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.min(sorted.length - 1, Math.floor((q / 100) * sorted.length))];
}

// Where each legend entry goes: rows that wrap at the chart's width, so that every name is whole.
function legendPlaces(series) {
  const places = [];
  let x = LEFT + 6, row = 0;
  for (const s of series) {
    const width = 22 + 6 * s.name.length; // a 10 px label is about 5.5 px a character
    if (x + width > W && x > LEFT + 6) { x = LEFT + 6; row += 1; }
    places.push([x, 4 + row * LEGEND_ROW]);
    x += width;
  }
  return places;
}

function plot(svg, series, now, note = "") {
  const places = legendPlaces(series);
  const TOP = 8 + LEGEND_ROW * (places.length ? (places[places.length - 1][1] - 4) / LEGEND_ROW + 1 : 0);
  const top = Math.max(1, ...series.flatMap((s) => s.points.map(([, v]) => v ?? 0)));
  const x = (t) => LEFT + ((t - (now - WINDOW_S)) / WINDOW_S) * (W - LEFT - 4);
  const y = (v) => H - BOTTOM - (v / top) * (H - BOTTOM - TOP);
  const parts = [svgEl("line", { class: "axis", x1: LEFT, y1: H - BOTTOM, x2: W, y2: H - BOTTOM }),
    svgEl("line", { class: "axis", x1: LEFT, y1: TOP, x2: LEFT, y2: H - BOTTOM })];
  for (const [value, label] of [[top, Math.round(top)], [0, 0]]) {
    const text = svgEl("text", { x: LEFT - 4, y: y(value) + 3, "text-anchor": "end" });
    text.textContent = label;
    parts.push(text);
  }
  for (const [offset, label] of [[WINDOW_S, "-5 min"], [0, "now"]]) {
    const text = svgEl("text", { x: x(now - offset), y: H - 4, "text-anchor": offset ? "start" : "end" });
    text.textContent = label;
    parts.push(text);
  }
  series.forEach((s, index) => {
    const [legendX, legendY] = places[index];
    const points = s.points.filter(([t, v]) => v != null && t >= now - WINDOW_S);
    if (points.length > 1) parts.push(svgEl("polyline", { class: s.cls, points: points.map(([t, v]) => `${x(t).toFixed(1)},${y(v).toFixed(1)}`).join(" ") }));
    if (points.length === 1) parts.push(svgEl("circle", { class: `${s.cls} dot`, cx: x(points[0][0]).toFixed(1), cy: y(points[0][1]).toFixed(1), r: 2.5 }));
    parts.push(svgEl("line", { class: s.cls, x1: legendX, y1: legendY + 5, x2: legendX + 10, y2: legendY + 5 }));
    const legend = svgEl("text", { class: "legend", x: legendX + 13, y: legendY + 8 });
    legend.textContent = s.name;
    parts.push(legend);
  });
  if (note) {
    const text = svgEl("text", { x: LEFT + 6, y: H / 2 });
    text.textContent = note;
    parts.push(text);
  }
  svg.replaceChildren(...parts);
}

function buckets(now, ended = finished) {
  const out = [];
  for (let start = now - WINDOW_S; start < now; start += BUCKET_S) {
    const inside = ended.filter((f) => f.at >= start && f.at < start + BUCKET_S);
    out.push({ t: start + BUCKET_S, inside });
  }
  return out;
}

function drawCharts(now = Date.now() / 1000) {
  while (finished.length && finished[0].at < now - WINDOW_S - BUCKET_S) finished.shift();
  const bins = buckets(now);
  const ttfts = bins.map((b) => [b.t, b.inside.map((f) => f.ttft).filter((v) => typeof v === "number")]);
  plot(document.getElementById("chart-ttft"), [
    { name: "p50", cls: "p50", points: ttfts.map(([t, v]) => [t, percentile(v, 50)]) },
    { name: "p95", cls: "p95", points: ttfts.map(([t, v]) => [t, percentile(v, 95)]) }], now);
  const lines = (defined, bucketed) => defined.map(([name, cls]) => {
    const outcomes = new Set(name.split("/"));
    return { name, cls, points: bucketed.map((b) => [b.t, b.inside.filter((f) => outcomes.has(f.outcome)).length]) };
  });
  plot(document.getElementById("chart-outcomes"), lines(OUTCOME_LINES, bins), now);
  while (chats.length && chats[0].at < now - WINDOW_S - BUCKET_S) chats.shift();
  plot(document.getElementById("chart-chats"), lines(CHAT_LINES, buckets(now, chats)), now);
  plot(document.getElementById("chart-held"), [
    { name: "completions held by the server", cls: "held", points: samples.map((s) => [s.at, s.held]) },
    { name: "queued", cls: "queued", points: samples.map((s) => [s.at, s.queued]) },
    { name: "chat / agents running", cls: "bulk", points: samples.map((s) => [s.at, s.bulk]) }], now);
  plot(document.getElementById("chart-gpu"), [
    { name: "used", cls: "gpu", points: samples.map((s) => [s.at, gpuReason ? 0 : s.gpu]) }], now, gpuReason);
}

// ---- Compare ------------------------------------------------------------------------------------------------

const fixed = (digits) => (value) => (typeof value === "number" ? value.toFixed(digits) : value ?? "");
const percent = (value) => (typeof value === "number" ? `${Math.round(value * 100)} %` : "");
const gib = (bytes) => (typeof bytes === "number" ? (bytes / 2 ** 30).toFixed(2) : "");

function table(items, columns) {
  return el("table", {}, el("thead", {}, el("tr", {}, ...columns.map(([label]) => el("th", {}, label)))),
    el("tbody", {}, ...items.map((item) => el("tr", {}, ...columns.map(([, key, show]) => el("td", {}, (show ?? ((v) => v ?? ""))(item[key])))))));
}

function bars(items, label, key, unit = "") {
  const values = items.map((item) => (typeof item[key] === "number" ? item[key] : 0));
  const top = Math.max(1e-9, ...values);
  const height = 18 * items.length + 20;
  const svg = svgEl("svg", { viewBox: `0 0 400 ${height}` });
  const title = svgEl("text", { x: 4, y: 12 });
  title.textContent = label;
  svg.append(title);
  items.forEach((item, index) => {
    const y = 18 + index * 18;
    const name = svgEl("text", { x: 4, y: y + 11 });
    name.textContent = item.policy ?? item.label ?? index;
    const width = (values[index] / top) * 230;
    const text = svgEl("text", { x: 130 + width + 4, y: y + 11 });
    const value = values[index];
    text.textContent = `${Number.isInteger(value) ? value : value.toFixed(value >= 10 ? 0 : 2)}${unit}`;
    svg.append(name, svgEl("rect", { class: "bar", x: 130, y: y + 2, width: width.toFixed(1), height: 12 }), text);
  });
  return svg;
}

const POLICY_COLUMNS = [["policy", "policy"], ["pause coverage", "pause_coverage", percent],
  ["pause->shown p50 ms", "latency_p50_ms", fixed(0)], ["p95 ms", "latency_p95_ms", fixed(0)],
  ["upstream requests", "upstream_requests"], ["wasted completion tokens", "wasted_completion_tokens"],
  ["timeouts", "timeouts"]];

function renderReport(name, report) {
  const box = el("div", { class: "report" }, el("h3", {}, name));
  if (report.command) box.append(el("p", { class: "note" }, el("code", {}, report.command)));
  let policies = null;
  if (Array.isArray(report.policies)) policies = report.policies; // bench replay
  else if (report.means) policies = Object.entries(report.means).flatMap(([profile, items]) => items.map((item) => ({ ...item, policy: `${item.policy} (${profile})` }))); // bench lab
  if (policies) {
    box.append(table(policies, POLICY_COLUMNS), el("div", { class: "charts" },
      bars(policies, "pause coverage", "pause_coverage"), bars(policies, "pause->shown p95 ms", "latency_p95_ms"),
      bars(policies, "upstream requests", "upstream_requests")));
  } else if (Array.isArray(report.cells)) { // mellum-proxy sweep --json
    box.append(table(report.cells, [["quant", "quant"], ["context", "context"], ["batch", "batch"],
      ["weights GiB", "weights_bytes", gib], ["KV GiB", "kv_bytes", gib], ["overhead GiB", "overhead_bytes", gib],
      ["total GiB", "total_bytes", gib], ["of the card", "utilization", percent], ["label", "label"]]));
    if (report.best) box.append(el("p", {}, `best: ${JSON.stringify(report.best)}`));
  } else if (Array.isArray(report.readings)) { // mellum-proxy baseline
    box.append(table(report.readings, [["phase", "phase"], ["at", "at"], ["GPU used MiB", "gpu_used_mib", fixed(0)],
      ["GPU total MiB", "gpu_total_mib", fixed(0)], ["server GPU MiB", "process_gpu_mib", fixed(0)],
      ["server host RSS MiB", "host_rss_mib", fixed(0)], ["note", "note"]]));
    if (report.gpu_note) box.append(el("p", { class: "note" }, report.gpu_note));
  } else {
    box.append(el("p", { class: "error" }, "not a report this page knows (bench replay results.json, bench lab lab.json, sweep --json, baseline)"));
  }
  return box;
}

document.getElementById("report-file").addEventListener("change", async (event) => {
  const view = document.getElementById("report-view");
  const shown = [];
  for (const file of event.target.files) {
    try {
      shown.push(renderReport(file.name, JSON.parse(await file.text())));
    } catch (error) {
      shown.push(el("p", { class: "error" }, `${file.name}: not JSON (${error.message})`));
    }
  }
  view.replaceChildren(...shown);
});

drawCharts();
setInterval(() => drawCharts(), 5000); // the windows slide when nothing happens
