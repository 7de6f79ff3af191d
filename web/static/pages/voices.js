// The voice catalog; shared helpers (sendJson, splitTags, onPage) are in farm.js.
"use strict";

async function preview(row) {
  const audio = row.querySelector(".voice-audio");
  const job = await sendJson("POST", `/api/voices/${row.dataset.voiceId}/preview`);
  for (;;) {
    const state = await sendJson("GET", `/api/jobs/${job.id}`);
    if (state.status === "done") {
      audio.src = state.result.audio_url;
      audio.hidden = false;
      return;
    }
    if (state.status !== "queued" && state.status !== "running") throw new Error(state.error || state.status);
    await new Promise((resolve) => window.setTimeout(resolve, 500));
  }
}

function setUpVoices(table) {
  const message = document.querySelector("#voices-message");
  const report = (failure) => { message.textContent = failure.message; };
  for (const row of table.querySelectorAll("tr.voice")) {
    const url = `/api/voices/${row.dataset.voiceId}`;
    // Rows of voices another key owns have no Save or Delete.
    row.querySelector(".voice-save")?.addEventListener("click", () => sendJson("PATCH", url, {
      name: row.querySelector(".voice-name").value,
      tags: splitTags(row.querySelector(".voice-tags").value),
      rating: Number(row.querySelector(".voice-rating").value),
    }).then(() => { message.textContent = "Saved."; }, report));
    row.querySelector(".voice-delete")?.addEventListener("click", () => sendJson("DELETE", url)
      .then(() => row.remove(), report));
    row.querySelector(".voice-preview").addEventListener("click", () => preview(row).catch(report));
  }
  document.querySelector("#new-voice").addEventListener("submit", (event) => {
    event.preventDefault();
    sendJson("POST", "/api/voices", {
      name: document.querySelector("#new-name").value,
      seed: Number(document.querySelector("#new-seed").value),
      tags: splitTags(document.querySelector("#new-tags").value),
    }).then(() => window.location.reload(), report);
  });
  document.querySelector("#import-file").addEventListener("change", async (event) => {
    const file = event.target.files[0];
    if (!file) return;
    try {
      const outcome = await sendJson("POST", "/api/voices/import", JSON.parse(await file.text()));
      message.textContent = `Added ${outcome.added.length}, skipped ${outcome.skipped.length} existing.`;
    } catch (failure) {
      report(failure);
    }
  });
}

onPage("voices", setUpVoices);
