// The status strip: stages, live replicas, requests in flight and the recent time to
// first output / first audio, read from /metrics (Prometheus text; no key needed) every
// few seconds while the page is visible. "Recent" = requests finished since the last read.

import { $, el } from "./dom.js";

const EVERY_MS = 3000;
const SPARK_POINTS = 20;
const history = [];
let previous = {};

// {name: [{labels, value}]} of the samples this strip reads
function parse(text) {
  const samples = {};
  for (const line of text.split("\n")) {
    const match = /^(omni_[a-z_]+)(?:\{([^}]*)\})? ([0-9.eE+-]+|NaN)$/.exec(line);
    if (!match) continue;
    const labels = Object.fromEntries([...(match[2] || "").matchAll(/(\w+)="([^"]*)"/g)]
      .map((m) => [m[1], m[2]]));
    (samples[match[1]] ||= []).push({ labels, value: Number(match[3]) });
  }
  return samples;
}

const total = (samples, name) => (samples[name] || []).reduce((n, s) => n + s.value, 0);

// mean of a histogram over the requests observed since the last read, or null
function recent(samples, name) {
  const sum = total(samples, `${name}_sum`);
  const count = total(samples, `${name}_count`);
  const before = previous[name] || { sum: 0, count: 0 };
  previous[name] = { sum, count };
  return count > before.count ? (sum - before.sum) / (count - before.count) : null;
}

const shown = {};  // the last recent value of each, kept while no request finishes

function ms(seconds) {
  return seconds === null || seconds === undefined ? "–" : `${Math.round(seconds * 1000)} ms`;
}

function stageText(samples) {
  const byPipeline = {};
  for (const s of samples.omni_stage_replicas_live || []) {
    (byPipeline[s.labels.pipeline] ||= []).push(`${s.labels.stage}×${s.value}`);
  }
  return Object.entries(byPipeline).map(([p, st]) => `${p}: ${st.join(" ")}`).join("; ") || "–";
}

function render(samples) {
  const inflight = total(samples, "omni_requests_in_flight");
  for (const [key, name] of [["ttft", "omni_first_output_seconds"],
    ["ttfa", "omni_ttfp_seconds"]]) {
    const value = recent(samples, name);
    if (value !== null) shown[key] = value;
  }
  const items = [["Stages (replicas)", stageText(samples)],
    ["Live replicas", String(total(samples, "omni_stage_replicas_live"))],
    ["In flight", String(inflight)], ["First output", ms(shown.ttft)],
    ["First audio", ms(shown.ttfa)]];
  $("status-list").replaceChildren(...items.map(([term, value]) => el("div", {},
    el("dt", { textContent: term }), el("dd", { textContent: value }))));
  spark(inflight);
}

function spark(value) {
  history.push(value);
  if (history.length > SPARK_POINTS) history.shift();
  const top = Math.max(1, ...history);
  const points = history.map((v, i) => `${(i * 120) / (SPARK_POINTS - 1)},${22 - (v / top) * 20}`);
  $("status-spark").querySelector("polyline").setAttribute("points", points.join(" "));
}

async function refresh() {
  if (document.hidden) return;
  try {
    const response = await fetch("/metrics");
    if (response.ok) render(parse(await response.text()));
  } catch {
    $("status-list").replaceChildren(el("div", {}, el("dt", { textContent: "Server" }),
      el("dd", { textContent: "not answering" })));
  }
}

export function startStatus() {
  refresh();
  setInterval(refresh, EVERY_MS);
}
