// The operations page: charts of the farm's last 15 minutes (uPlot, vendored) and tables of the workers
// and queues now, all refreshed every 2 s; shared helpers (sendJson, onPage) are in farm.js.
"use strict";

const REFRESH_MS = 2000;
const CHART_HEIGHT = 220;
// A farm up for less than the 15 minutes is charted from shortly before its first measurement.
const LEAD_POINTS = 15;

function fillRows(body, rows) {
  body.replaceChildren(...rows.map((cells) => {
    const row = document.createElement("tr");
    for (const cell of cells) {
      const td = document.createElement("td");
      td.textContent = cell;
      row.append(td);
    }
    return row;
  }));
}

// The page's colours, from the stylesheet's custom properties: charts follow dark mode as the page does.
function palette() {
  const style = getComputedStyle(document.documentElement);
  const read = (name) => style.getPropertyValue(name).trim();
  return {
    text: read("--muted"),
    grid: read("--border"),
    series: [1, 2, 3, 4, 5, 6].map((index) => read(`--series-${index}`)),
  };
}

// What each chart shows, from one answer of /api/ops/series: lines (label, values, scale) and scales.
function throughputChart(data) {
  return {
    lines: [
      { label: "audio s/s", values: data.audio_s_per_s, scale: "audio" },
      { label: "jobs/s", values: data.jobs_per_s, scale: "jobs" },
    ],
    axes: [{ scale: "audio", label: "audio s/s" }, { scale: "jobs", label: "jobs/s", side: 1 }],
  };
}

function queueChart(data) {
  return {
    lines: Object.entries(data.queues).map(([queue, values]) => ({ label: queue, values, scale: "jobs" })),
    axes: [{ scale: "jobs", label: "jobs" }],
  };
}

function latencyChart(data) {
  return {
    lines: [
      { label: "job p50", values: data.latency.p50_s, scale: "s" },
      { label: "job p95", values: data.latency.p95_s, scale: "s" },
      { label: "first chunk p50", values: data.first_chunk.p50_s, scale: "s" },
      { label: "first chunk p95", values: data.first_chunk.p95_s, scale: "s" },
    ],
    axes: [{ scale: "s", label: "seconds" }],
  };
}

function gpuChart(gpu) {
  const percent = (values) => values.map((value) => (value === null ? null : value * 100));
  return {
    lines: [
      { label: "allocated MiB", values: gpu.allocated_mb, scale: "MiB" },
      { label: "reserved MiB", values: gpu.reserved_mb, scale: "MiB" },
      { label: "fragmentation %", values: percent(gpu.fragmentation), scale: "%" },
      { label: "utilisation %", values: percent(gpu.utilisation), scale: "%" },
    ],
    axes: [{ scale: "MiB", label: "MiB" }, { scale: "%", label: "%", side: 1, range: [0, 100] }],
  };
}

function lonePoints(plot, seriesIndex) {
  const values = plot.data[seriesIndex];
  const lone = [];
  for (let index = 0; index < values.length; index += 1) {
    if (values[index] !== null && (values[index - 1] ?? null) === null && (values[index + 1] ?? null) === null) {
      lone.push(index);
    }
  }
  return lone;
}

// One uPlot chart in a <figure>: built again only when its lines change (a new queue, say), else fed new data.
class Chart {
  constructor(figure) {
    this.figure = figure;
    this.plot = null;
    this.shape = "";
  }

  show(times, spec, from) {
    const shape = spec.lines.map((line) => `${line.label}/${line.scale}`).join("|");
    const data = [times.slice(from), ...spec.lines.map((line) => line.values.slice(from))];
    if (shape !== this.shape) {
      this.plot?.destroy();
      this.plot = new uPlot(this.options(spec), data, this.figure);
      this.shape = shape;
    } else {
      this.plot.setData(data);
    }
    // How many measured points it drew: what the page's tests (and curious readers of the DOM) check.
    this.figure.dataset.points = String(spec.lines.reduce(
      (count, line) => count + line.values.filter((value) => value !== null).length, 0));
  }

  options(spec) {
    const colours = palette();
    const scales = { x: { time: true } };
    // Every figure charted is a count, a rate, a size or a time: each axis starts at zero.
    const fromZero = (plot, min, max) => [0, max > 0 ? max * 1.1 : 1];
    for (const axis of spec.axes) scales[axis.scale] = { range: axis.range ?? fromZero };
    return {
      width: this.width(),
      height: CHART_HEIGHT,
      scales,
      series: [{}, ...spec.lines.map((line, index) => ({
        label: line.label,
        scale: line.scale,
        stroke: colours.series[index % colours.series.length],
        width: 2,
        spanGaps: false,
        // A measurement between two gaps draws no line: it shows as a dot.
        points: { size: 6, filter: lonePoints },
        value: (plot, value) => (value === null || value === undefined ? "–" : Number(value.toFixed(3)).toString()),
      }))],
      axes: [
        { stroke: colours.text, grid: { stroke: colours.grid, width: 1 }, ticks: { stroke: colours.grid } },
        ...spec.axes.map((axis) => ({
          scale: axis.scale, label: axis.label, side: axis.side ?? 3, stroke: colours.text,
          grid: { show: axis.side !== 1, stroke: colours.grid, width: 1 }, ticks: { stroke: colours.grid },
        })),
      ],
    };
  }

  width() {
    return Math.max(240, this.figure.clientWidth);
  }

  resize() {
    this.plot?.setSize({ width: this.width(), height: CHART_HEIGHT });
  }
}

function setUpOps(section) {
  const charts = {
    throughput: new Chart(section.querySelector("#chart-throughput")),
    queues: new Chart(section.querySelector("#chart-queues")),
    latency: new Chart(section.querySelector("#chart-latency")),
  };
  const gpuCharts = new Map();  // worker -> Chart
  const gpuArea = section.querySelector("#ops-gpu-charts");

  function showGpus(series, from) {
    for (const [worker, chart] of gpuCharts) {
      if (!(worker in series.gpus)) {
        chart.figure.remove();
        gpuCharts.delete(worker);
      }
    }
    for (const [worker, gpu] of Object.entries(series.gpus)) {
      if (!gpuCharts.has(worker)) {
        const figure = document.createElement("figure");
        figure.className = "chart";
        figure.dataset.chart = `gpu ${worker}`;
        const caption = document.createElement("figcaption");
        caption.textContent = `${worker}: memory, fragmentation and utilisation`;
        figure.append(caption);
        gpuArea.append(figure);
        gpuCharts.set(worker, new Chart(figure));
      }
      gpuCharts.get(worker).show(series.t, gpuChart(gpu), from);
    }
    section.querySelector("#ops-no-gpu").hidden = gpuCharts.size > 0;
  }

  async function refresh() {
    try {
      const [data, series] = await Promise.all([
        sendJson("GET", section.dataset.url), sendJson("GET", section.dataset.seriesUrl),
      ]);
      fillRows(section.querySelector("#ops-workers"), data.workers.map((w) => [
        w.worker, w.gpu ? w.gpu.name : "CPU", `${w.model_info.kind} ${w.model_info.scale || ""} ${w.model_info.dtype}`,
        w.gpu ? `${w.gpu.allocated_mb} MiB (peak ${w.gpu.peak_allocated_mb})` : "-",
        String(w.current_batch), String(w.jobs_done), `${w.heartbeat_age_s} s ago`,
      ]));
      fillRows(section.querySelector("#ops-queues"), Object.entries(data.queues).map(([q, n]) => [q, String(n)]));
      // Every chart starts where the farm's history does (workers sample even when idle), on one time axis.
      const measured = series.jobs_per_s.findIndex((value) => value !== null);
      const from = measured < 0 ? 0 : Math.max(0, measured - LEAD_POINTS);
      charts.throughput.show(series.t, throughputChart(series), from);
      charts.queues.show(series.t, queueChart(series), from);
      charts.latency.show(series.t, latencyChart(series), from);
      showGpus(series, from);
      section.querySelector("#ops-error").textContent = "";
    } catch (failure) {
      section.querySelector("#ops-error").textContent = failure.message;
    }
    window.setTimeout(refresh, REFRESH_MS);
  }

  let resizing = null;
  window.addEventListener("resize", () => {
    window.clearTimeout(resizing);
    resizing = window.setTimeout(() => {
      for (const chart of [...Object.values(charts), ...gpuCharts.values()]) chart.resize();
    }, 100);
  });
  refresh();
}

onPage("ops", setUpOps);
