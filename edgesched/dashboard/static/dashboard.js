// The dashboard's page: one view of the run (edgesched.observe) per server-sent event.
"use strict";

const COLOURS = { delivered: "#2e7d32", late: "#ef8f00", dropped: "#c62828", running: "#1e63c6" };
let lastUpdate = 0;

function esc(value) {
  return String(value).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
}
function num(value, digits) { return value === null || value === undefined ? "" : Number(value).toFixed(digits); }
function pct(value) { return value === null || value === undefined ? "–" : (100 * value).toFixed(2) + " %"; }
function bytes(value) {
  if (value === null || value === undefined) return "–";
  const units = ["B", "kB", "MB", "GB", "TB"];
  let i = 0;
  while (value >= 1000 && i < units.length - 1) { value /= 1000; i += 1; }
  return value.toFixed(i ? 1 : 0) + " " + units[i];
}

function header(run, view) {
  document.getElementById("run-name").textContent = run.name;
  document.title = "edgesched · " + run.name;
  const steps = run.steps ? run.step + "/" + run.steps : run.step;
  const acc = view.accuracy.accuracy;
  const clock = run.clock === "virtual" ? " virtual s" : " s";
  document.getElementById("run-line").innerHTML =
    `<span class="badge ${esc(run.status)}">${esc(run.status)}</span> ` +
    `${esc(run.strategy || "")}${run.fleet ? " on " + esc(run.fleet) : ""} · step ${esc(steps)} · ` +
    `${num(run.t, 0)}${clock} · accuracy ${pct(acc.length ? acc[acc.length - 1] : null)}` +
    (run.target_accuracy ? ` (target ${pct(run.target_accuracy)})` : "");
  document.body.dataset.step = run.step;
  document.body.dataset.status = run.status;
}

function cards(view) {
  const c = view.counts;
  document.getElementById("card-devices").innerHTML =
    `<div class="big">${c.training + c.online + c.stale} up</div>` +
    `${c.training} training · ${c.online} idle · ${c.stale} stale · ${c.offline} offline`;
  const j = view.jobs;
  document.getElementById("card-jobs").innerHTML =
    `<div class="big">${j.counted} counted</div>${j.sent} sent · ${j.failed} failed · ${j.late} late`;
  const h = view.heartbeats;
  const dropped = Object.values(h.dropped).reduce((a, b) => a + b, 0);
  document.getElementById("card-telemetry").innerHTML =
    `<div class="big">${h.accepted} in</div>${dropped} dropped` +
    (view.bytes ? ` · model ${bytes(view.bytes.down)} down, ${bytes(view.bytes.up)} up` : "");
  document.getElementById("card-model").innerHTML =
    `<div class="big">${pct(view.accuracy.accuracy.slice(-1)[0])}</div>` +
    `prediction error ${view.prediction_error === null ? "–" : (100 * view.prediction_error).toFixed(1) + " %"}`;
}

function accuracyChart(view) {
  const a = view.accuracy;
  const axis = view.run.clock === "virtual" ? "virtual seconds" : "seconds";
  const traces = [
    { x: a.t, y: a.accuracy, name: "accuracy", mode: "lines+markers", marker: { size: 4 } },
    { x: a.t, y: a.loss, name: "loss", yaxis: "y2", mode: "lines", line: { dash: "dot" } },
  ];
  const shapes = view.run.target_accuracy ? [{ type: "line", xref: "paper", x0: 0, x1: 1, y0: view.run.target_accuracy,
    y1: view.run.target_accuracy, line: { color: "#8a93a6", dash: "dash", width: 1 } }] : [];
  Plotly.react("accuracy", traces, {
    margin: { l: 50, r: 50, t: 10, b: 40 }, xaxis: { title: { text: axis } },
    yaxis: { title: { text: "accuracy" }, range: [0, 1] },
    yaxis2: { title: { text: "loss" }, overlaying: "y", side: "right", rangemode: "tozero" },
    legend: { orientation: "h", y: 1.1 }, shapes,
  }, { displaylogo: false, responsive: true });
}

function timelineChart(view) {
  const now = view.timeline_now || view.run.t || 0;
  const byOutcome = {};
  for (const span of view.timeline) {
    const end = span.end === null ? Math.max(now, span.start) : span.end;
    const o = (byOutcome[span.outcome] ||= { x: [], base: [], y: [] });
    o.x.push(Math.max(end - span.start, 1e-3)); o.base.push(span.start); o.y.push(span.device);
  }
  const traces = Object.entries(byOutcome).map(([outcome, o]) => ({
    type: "bar", orientation: "h", name: outcome, x: o.x, base: o.base, y: o.y,
    marker: { color: COLOURS[outcome] || "#888" }, hovertemplate: "%{y}: %{base:.1f}–%{x:.1f} s<extra>" + outcome + "</extra>",
  }));
  Plotly.react("timeline", traces, {
    barmode: "overlay", margin: { l: 130, r: 10, t: 10, b: 40 }, showlegend: true, legend: { orientation: "h", y: 1.1 },
    xaxis: { title: { text: view.run.clock === "virtual" ? "virtual seconds" : "seconds" } },
    yaxis: { type: "category", automargin: true, tickfont: { size: 10 } },
  }, { displaylogo: false, responsive: true });
}

function deviceRows(view) {
  const rows = view.devices.map((d) => {
    const heat = d.temp_c === null || d.temp_c === undefined ? "" :
      `<span class="${d.throttled ? "hot" : ""}">${num(d.temp_c, 0)} °C${d.throttled ? " throttled" : ""}</span>`;
    const battery = d.battery_percent === null || d.battery_percent === undefined ? "" :
      num(d.battery_percent, 0) + " %" + (d.charging ? " ⚡" : "");
    const link = [d.net_type, d.rtt_ms ? num(d.rtt_ms, 0) + " ms" : ""].filter(Boolean).join(" ");
    return `<tr data-device="${esc(d.device)}"><td>${esc(d.device)}</td><td>${esc(d.board || "")}</td>` +
      `<td><span class="state ${esc(d.state)}">${esc(d.state)}</span></td><td>${heat}</td><td>${battery}</td>` +
      `<td>${esc(link)}</td><td class="num">${num(d.predicted_s, 1)}</td><td class="num">${num(d.actual_s, 1)}</td>` +
      `<td class="num">${num(d.risk, 2)}</td><td class="num">${d.staleness_bound ?? ""}</td>` +
      `<td class="num">${d.counted ?? ""}</td><td>${esc(d.last || "")}</td></tr>`;
  });
  document.querySelector("#devices tbody").innerHTML = rows.join("");
  document.getElementById("device-count").textContent = `(${view.devices.length})`;
}

function sideLists(view) {
  document.getElementById("decisions").innerHTML = view.decisions.map((d) =>
    `<li><span class="muted">${num(d.t, 1)} s · r${d.round}</span> ${esc(d.text)}</li>`).join("") ||
    "<li class=\"muted\">none (this strategy keeps no decision log)</li>";
  const drops = Object.entries(view.heartbeats.dropped);
  document.getElementById("drops").innerHTML = drops.length ?
    drops.map(([reason, n]) => `<li>${esc(reason)}: ${n}</li>`).join("") : "<li class=\"muted\">none</li>";
}

function render(view) {
  header(view.run, view);
  cards(view);
  accuracyChart(view);
  timelineChart(view);
  deviceRows(view);
  sideLists(view);
  lastUpdate = Date.now();
}

function connect() {
  const source = new EventSource("/api/stream");
  source.onmessage = (event) => render(JSON.parse(event.data));
  source.onerror = () => { document.getElementById("live").textContent = "reconnecting…"; };
}

setInterval(() => {
  const live = document.getElementById("live");
  if (!lastUpdate) return;
  const age = Math.round((Date.now() - lastUpdate) / 1000);
  live.textContent = `updated ${age} s ago`;
  live.classList.toggle("stale", age > 30 && document.body.dataset.status === "running");
}, 1000);
connect();
