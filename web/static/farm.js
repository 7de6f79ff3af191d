// Behaviour of the farm's pages. Text from users is only ever set with textContent, never as HTML.
"use strict";

async function sendJson(method, url, body) {
  const response = await fetch(url, {
    method,
    // The page's CSRF token: a signed-in session needs it on every change (see web/access/sessions.py).
    headers: {"Content-Type": "application/json", "Accept": "application/json",
              "X-CSRF-Token": document.querySelector('meta[name="csrf-token"]').content},
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const payload = response.status === 204 ? null : await response.json();
  if (!response.ok) {
    const field = payload && payload.field ? ` (${payload.field})` : "";
    throw new Error((payload && payload.error ? payload.error : response.statusText) + field);
  }
  return payload;
}

function splitTags(text) {
  return text.split(",").map((tag) => tag.trim()).filter(Boolean);
}

function numberOrNull(input) {
  return input.value === "" ? null : Number(input.value);
}

function setUpSpeakForm(form) {
  const text = form.querySelector("#text");
  const counter = form.querySelector("#char-count");
  const submit = form.querySelector("#submit");
  const error = form.querySelector("#form-error");
  const catalog = form.querySelector("#catalog-voice");
  const speed = form.querySelector("#speed");
  text.addEventListener("input", () => { counter.textContent = String(text.value.length); });
  speed.addEventListener("input", () => { form.querySelector("#speed-value").textContent = speed.value; });
  form.querySelector("#roll-voice").addEventListener("click", () => {
    form.querySelector("#voice-seed").value = String(Math.floor(Math.random() * 100000000));
    catalog.value = "";
  });
  form.querySelector("#voice-filter").addEventListener("input", (event) => {
    const wanted = event.target.value.trim().toLowerCase();
    for (const option of catalog.options) {
      if (!option.value) continue;
      option.hidden = Boolean(wanted) && !option.dataset.tags.split(" ").some((tag) => tag.startsWith(wanted));
    }
  });
  let sending = false;
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    if (sending) return;  // a double click sends one job
    sending = true;
    submit.disabled = true;
    error.textContent = "";
    const body = {
      text: text.value,
      voice: catalog.value || Number(form.querySelector("#voice-seed").value),
      format: form.querySelector("#format").value,
      speed: Number(speed.value),
      temperature: Number(form.querySelector("#temperature").value),
      top_p: Number(form.querySelector("#top_p").value),
      top_k: Number(form.querySelector("#top_k").value),
      refine_text: form.querySelector("#refine_text").checked,
      seed: numberOrNull(form.querySelector("#audio-seed")),
      stream: true,  // the job page plays it as it is made
    };
    try {
      const job = await sendJson("POST", "/api/jobs", body);
      window.location.assign(`/jobs/${job.id}`);
    } catch (failure) {
      error.textContent = failure.message;
      sending = false;
      submit.disabled = false;
    }
  });
}

function setUpJobPage(section) {
  const status = section.querySelector("#job-status");
  const progress = section.querySelector("#job-progress");
  const error = section.querySelector("#job-error");
  const result = section.querySelector("#job-result");
  const audio = section.querySelector("#job-audio");
  let listening = false;
  async function poll() {
    let job;
    try {
      job = await sendJson("GET", section.dataset.statusUrl);
    } catch (failure) {
      error.textContent = failure.message;
      window.setTimeout(poll, 2000);
      return;
    }
    status.textContent = job.status;
    progress.value = job.progress;
    if (!listening && job.parameters.stream && (job.status === "queued" || job.status === "running")) {
      listening = true;
      playLive(section);
    }
    error.textContent = job.error && job.status !== "cancelled" ? job.error : "";
    if (job.status === "done") {
      audio.src = job.result.audio_url;
      result.hidden = false;
    } else if (job.status === "queued" || job.status === "running") {
      window.setTimeout(poll, 500);
    }
  }
  poll();
  section.querySelector("#save-voice").addEventListener("submit", async (event) => {
    event.preventDefault();
    const message = section.querySelector("#save-message");
    try {
      const voice = await sendJson("POST", section.dataset.saveUrl, {
        name: section.querySelector("#save-name").value,
        tags: splitTags(section.querySelector("#save-tags").value),
      });
      message.textContent = `Saved as "${voice.name}".`;
    } catch (failure) {
      message.textContent = failure.message;
    }
  });
}

// Plays a streaming job's audio as it comes: raw 16-bit samples from its stream, each chunk scheduled on
// a Web Audio context right after the one before, so playback starts at the first chunk.
async function playLive(section) {
  const live = section.querySelector("#live");
  const state = section.querySelector("#live-state");
  const played = section.querySelector("#live-played");
  const seconds = section.querySelector("#live-seconds");
  live.hidden = false;
  let response;
  try {
    response = await fetch(section.dataset.streamUrl, { credentials: "same-origin" });
  } catch (failure) {
    state.textContent = `unavailable: ${failure.message}`;
    return;
  }
  if (!response.ok) {
    state.textContent = "unavailable: the job ended without audio";
    return;
  }
  const rate = Number(response.headers.get("X-Sample-Rate")) || 24000;
  const context = new AudioContext({ sampleRate: rate });
  if (context.state !== "running") {
    // The browser waits for a gesture before it plays sound: the stream fills meanwhile.
    const button = section.querySelector("#live-play");
    button.hidden = false;
    state.textContent = "ready: press play";
    await new Promise((resolve) => button.addEventListener("click", () => context.resume().then(resolve), { once: true }));
    button.hidden = true;
  }
  let startedAt = null;
  let nextAt = 0;
  let received = 0;
  const show = () => {
    const heard = startedAt === null ? 0 : Math.min(received, Math.max(0, context.currentTime - startedAt));
    played.max = Math.max(received, 0.001);
    played.value = heard;
    seconds.textContent = `${heard.toFixed(1)} s played of ${received.toFixed(1)} s received`;
  };
  const timer = window.setInterval(show, 250);
  const reader = response.body.getReader();
  let carried = new Uint8Array(0);  // an odd byte waiting for its sample's other half
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    const bytes = new Uint8Array(carried.length + value.length);
    bytes.set(carried);
    bytes.set(value, carried.length);
    const whole = bytes.length - (bytes.length % 2);
    carried = bytes.slice(whole);
    if (!whole) continue;
    const samples = new Int16Array(bytes.buffer, 0, whole / 2);
    const buffer = context.createBuffer(1, samples.length, rate);
    const channel = buffer.getChannelData(0);
    for (let index = 0; index < samples.length; index += 1) channel[index] = samples[index] / 32768;
    const source = context.createBufferSource();
    source.buffer = buffer;
    source.connect(context.destination);
    nextAt = Math.max(nextAt, context.currentTime + 0.05);
    source.start(nextAt);
    if (startedAt === null) {
      startedAt = nextAt;
      state.textContent = "playing";
    }
    nextAt += buffer.duration;
    received += buffer.duration;
    show();
  }
  state.textContent = "all received";
  window.setTimeout(() => { window.clearInterval(timer); show(); }, Math.max(0, (nextAt - context.currentTime) * 1000));
}

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

document.addEventListener("DOMContentLoaded", () => {
  const ops = document.querySelector("[data-page=ops]");
  if (ops) setUpOps(ops);
  const speak = document.querySelector("[data-page=speak]");
  if (speak) setUpSpeakForm(speak);
  const job = document.querySelector("[data-page=job]");
  if (job) setUpJobPage(job);
  const voices = document.querySelector("[data-page=voices]");
  if (voices) setUpVoices(voices);
});
