// The job page: progress, live playback and the finished audio; shared helpers (sendJson, splitTags, onPage) are in farm.js.
"use strict";

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

onPage("job", setUpJobPage);
