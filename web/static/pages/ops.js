// The operations page; shared helpers (sendJson, splitTags, onPage) are in farm.js.
"use strict";

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

function setUpOps(section) {
  async function refresh() {
    try {
      const data = await sendJson("GET", section.dataset.url);
      fillRows(section.querySelector("#ops-workers"), data.workers.map((w) => [
        w.worker, w.gpu ? w.gpu.name : "CPU", `${w.model_info.kind} ${w.model_info.scale || ""} ${w.model_info.dtype}`,
        w.gpu ? `${w.gpu.allocated_mb} MiB (peak ${w.gpu.peak_allocated_mb})` : "-",
        String(w.current_batch), String(w.jobs_done), `${w.heartbeat_age_s} s ago`,
      ]));
      fillRows(section.querySelector("#ops-queues"), Object.entries(data.queues).map(([q, n]) => [q, String(n)]));
      section.querySelector("#ops-error").textContent = "";
    } catch (failure) {
      section.querySelector("#ops-error").textContent = failure.message;
    }
    window.setTimeout(refresh, 2000);
  }
  refresh();
}

onPage("ops", setUpOps);
