// The batches: the upload form, and a batch's page (its progress, its items with their players, cancel);
// shared helpers (sendJson, onPage) are in farm.js.
"use strict";

function setUpBatchUpload(section) {
  const form = section.querySelector("#batch-form");
  const message = section.querySelector("#batch-message");
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const button = form.querySelector("#batch-submit");
    button.disabled = true;
    message.className = "";
    message.textContent = "Checking every item…";
    const defaults = { format: form.querySelector("#batch-format").value };
    const voice = form.querySelector("#batch-voice").value.trim();
    if (voice) defaults.voice = /^\d+$/.test(voice) ? Number(voice) : voice;
    const body = new FormData();
    body.append("items", form.querySelector("#batch-file").files[0]);
    body.append("defaults", JSON.stringify(defaults));
    try {
      const response = await fetch(section.dataset.url, {
        method: "POST",
        headers: { "Accept": "application/json", "X-CSRF-Token": document.querySelector('meta[name="csrf-token"]').content },
        body,
      });
      const payload = await response.json();
      if (!response.ok) throw new Error(payload.error || response.statusText);
      window.location.assign(`${window.location.pathname.replace(/\/$/, "")}/${payload.id}`);
    } catch (error) {
      message.className = "error";
      message.textContent = error.message;
      button.disabled = false;
    }
  });
}

function setUpBatch(section) {
  const status = section.querySelector("#batch-status");
  const counts = section.querySelector("#batch-counts");
  const progress = section.querySelector("#batch-progress");
  const cancel = section.querySelector("#batch-cancel");
  const error = section.querySelector("#batch-error");
  const callback = section.querySelector("#batch-callback");
  const rows = new Map([...section.querySelectorAll("#batch-items tr")].map((row) => [row.dataset.jobId, row]));

  function show(batch) {
    status.textContent = batch.status;
    status.className = `status-${batch.status}`;
    counts.textContent = Object.entries(batch.counts).filter(([, count]) => count).map(([name, count]) => `${count} ${name}`).join(", ");
    progress.value = batch.progress;
    cancel.hidden = batch.status !== "running";
    if (callback && batch.callback) callback.textContent = batch.callback.state;
    for (const item of batch.items || []) {
      const row = rows.get(item.job_id);
      if (!row) continue;
      const cell = row.querySelector(".item-status");
      cell.textContent = item.status;
      cell.className = `item-status status-${item.status}`;
      const audio = row.querySelector(".item-audio");
      if (item.status === "done" && !audio.firstChild) {
        const player = document.createElement("audio");
        player.controls = true;
        player.preload = "none";
        player.src = item.audio_url;
        audio.append(player);
      }
    }
  }

  // The counts alone each poll (a batch of thousands is megabytes whole); the items only when they change.
  let shownCounts = null;
  async function poll() {
    let batch;
    try {
      batch = await sendJson("GET", `${section.dataset.statusUrl}?items=none`);
      const counts = JSON.stringify([batch.status, batch.counts]);
      if (counts !== shownCounts) {
        batch = await sendJson("GET", section.dataset.statusUrl);
        shownCounts = JSON.stringify([batch.status, batch.counts]);
      }
      error.textContent = "";
    } catch (failure) {
      error.textContent = failure.message;
      window.setTimeout(poll, 2000);
      return;
    }
    show(batch);
    const callbackPending = batch.callback && !["delivered", "failed"].includes(batch.callback.state);
    if (batch.status === "running" || callbackPending) window.setTimeout(poll, 2000);
  }

  cancel.addEventListener("click", async () => {
    cancel.disabled = true;
    try {
      show(await sendJson("DELETE", section.dataset.statusUrl));
    } catch (failure) {
      error.textContent = failure.message;
    }
    cancel.disabled = false;
  });
  poll();
}

onPage("batch-upload", setUpBatchUpload);
onPage("batch", setUpBatch);
