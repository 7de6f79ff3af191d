// The job page: progress, live playback, the finished audio with its waveform, and the job's details;
// shared helpers (sendJson, splitTags, onPage) are in farm.js.
"use strict";

const TIME_FORMAT = new Intl.DateTimeFormat(undefined, { dateStyle: "medium", timeStyle: "medium" });

function showTime(element, iso) {
  if (!iso) return;
  element.dateTime = iso;
  element.textContent = TIME_FORMAT.format(new Date(iso));
}

function seconds(value) {
  return value < 10 ? `${value.toFixed(2)} s` : `${value.toFixed(1)} s`;
}

// What the worker's result says of a finished job, in the details list.
function showFacts(section, job) {
  const fact = (name) => section.querySelector(`#fact-${name}`);
  const result = job.result;
  fact("duration").textContent = seconds(result.duration_s);
  fact("worker").textContent = result.worker || "–";
  const others = (result.batch_size || 1) - 1;
  fact("batch").textContent = others ? `${others} other job${others === 1 ? "" : "s"} (a batch of ${result.batch_size})` : "none: it ran alone";
  showTime(fact("started"), result.started_at);
  showTime(fact("finished"), job.finished_at);
  const queued = Date.parse(job.created_at);
  if (result.started_at) {
    const started = Date.parse(result.started_at);
    fact("wait").textContent = `after ${seconds((started - queued) / 1000)} in the queue`;
    if (job.finished_at) fact("synthesis").textContent = `after ${seconds((Date.parse(job.finished_at) - started) / 1000)} of synthesis`;
    if (result.first_chunk_s !== null && result.first_chunk_s !== undefined) {
      fact("first-chunk").textContent = `${seconds((started - queued) / 1000 + result.first_chunk_s)} after it was queued (streamed)`;
    }
  }
  if (result.first_chunk_s === null || result.first_chunk_s === undefined) fact("first-chunk").textContent = "not streamed";
}

// What the ASR gate heard in each segment it checked, beside the text the segment was asked to say, and
// whether a segment kept was still heard saying something else (the result's asr_mismatch flag). A job
// no recogniser listened to shows none of it.
function showHeard(section, quality) {
  const checked = (quality?.segments || []).map((segment, index) => ({ index, asr: segment.asr })).filter((s) => s.asr);
  if (!checked.length) return;
  const rows = section.querySelector("#job-asr-segments");
  rows.replaceChildren(...checked.map(({ index, asr }) => {
    const row = document.createElement("tr");
    row.className = asr.passed ? "asr-passed" : "asr-failed";
    const cells = [String(index + 1), asr.said ?? "–", asr.heard || "(nothing)", `${Math.round(asr.error_rate * 100)}%`,
      asr.passed ? "yes" : "no"];
    for (const text of cells) {
      const cell = document.createElement("td");
      cell.textContent = text;
      row.append(cell);
    }
    return row;
  }));
  const mismatch = (quality.flags || []).includes("asr_mismatch");
  const verdict = section.querySelector("#job-asr-verdict");
  verdict.className = mismatch ? "error" : "";
  verdict.textContent = mismatch
    ? "asr_mismatch: a segment kept was still heard saying something else after its retries."
    : `Every segment checked was heard as asked (${checked[0].asr.backend}).`;
  section.querySelector("#job-asr").hidden = false;
}

// How the job's callback goes: its state, its attempts so far and the last one's error.
function showCallback(section, callback) {
  const attempts = callback.attempts;
  const last = attempts[attempts.length - 1];
  let text = callback.state;
  if (attempts.length) text += ` after ${attempts.length} attempt${attempts.length === 1 ? "" : "s"}`;
  if (last && last.error) text += ` (${last.error})`;
  section.querySelector("#fact-callback").textContent = text;
}

// The audio's waveform on a canvas: the lowest and highest sample under each column of pixels, in the
// page's accent colour, sharp on high-density screens; a playhead follows playback and a click seeks.
class Waveform {
  constructor(canvas, audio) {
    this.canvas = canvas;
    this.audio = audio;
    this.samples = null;
    canvas.addEventListener("click", (event) => {
      if (!this.audio.duration) return;
      const box = canvas.getBoundingClientRect();
      this.audio.currentTime = ((event.clientX - box.left) / box.width) * this.audio.duration;
      this.draw();
    });
    audio.addEventListener("timeupdate", () => this.draw());
    audio.addEventListener("seeked", () => this.draw());
    window.addEventListener("resize", () => this.draw());
  }

  async load(url) {
    const response = await fetch(url, { credentials: "same-origin" });
    if (!response.ok) throw new Error(`the audio could not be read (${response.status})`);
    const context = new OfflineAudioContext(1, 1, 24000);
    const decoded = await context.decodeAudioData(await response.arrayBuffer());
    this.samples = decoded.getChannelData(0);
    // Drawn to the loudest sample's height: a quiet recording still shows its shape.
    this.peak = this.samples.reduce((loudest, value) => Math.max(loudest, Math.abs(value)), 0) || 1;
    this.canvas.dataset.samples = String(this.samples.length);
    this.draw();
  }

  draw() {
    if (!this.samples) return;
    const ratio = window.devicePixelRatio || 1;
    const width = Math.max(1, Math.round(this.canvas.clientWidth * ratio));
    const height = Math.max(1, Math.round(this.canvas.clientHeight * ratio));
    if (this.canvas.width !== width || this.canvas.height !== height) {
      this.canvas.width = width;
      this.canvas.height = height;
    }
    const style = getComputedStyle(document.documentElement);
    const paint = this.canvas.getContext("2d");
    paint.clearRect(0, 0, width, height);
    const middle = height / 2;
    const scale = middle / this.peak;
    const perColumn = this.samples.length / width;
    const played = this.audio.duration ? this.audio.currentTime / this.audio.duration : 0;
    for (let column = 0; column < width; column += 1) {
      let low = 0;
      let high = 0;
      const end = Math.min(this.samples.length, Math.floor((column + 1) * perColumn));
      for (let index = Math.floor(column * perColumn); index < end; index += 1) {
        const value = this.samples[index];
        if (value < low) low = value;
        if (value > high) high = value;
      }
      paint.fillStyle = column / width <= played ? style.getPropertyValue("--accent") : style.getPropertyValue("--muted");
      paint.fillRect(column, middle - high * scale, 1, Math.max(1, (high - low) * scale));
    }
    paint.fillStyle = style.getPropertyValue("--fg");
    paint.fillRect(Math.round(played * width), 0, Math.max(1, Math.round(ratio)), height);
  }
}

function setUpJobPage(section) {
  showTime(section.querySelector("#fact-queued"), section.querySelector("#fact-queued").dateTime);
  const status = section.querySelector("#job-status");
  const progress = section.querySelector("#job-progress");
  const error = section.querySelector("#job-error");
  const result = section.querySelector("#job-result");
  const audio = section.querySelector("#job-audio");
  const waveform = new Waveform(section.querySelector("#job-waveform"), audio);
  let listening = false;
  let shown = false;
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
    status.className = `status-${job.status}`;
    progress.value = job.progress;
    if (!listening && job.parameters.stream && (job.status === "queued" || job.status === "running")) {
      listening = true;
      playLive(section);
    }
    error.textContent = job.error && job.status !== "cancelled" ? job.error : "";
    if (job.callback) showCallback(section, job.callback);
    const finished = !(job.status === "queued" || job.status === "running");
    if (job.status === "done" && !shown) {
      shown = true;
      audio.src = job.result.audio_url;
      result.hidden = false;
      section.querySelector("#save-voice").hidden = false;
      showFacts(section, job);
      showHeard(section, job.result.quality);
      waveform.load(job.result.audio_url).catch((failure) => { error.textContent = failure.message; });
    }
    if (!finished) {
      window.setTimeout(poll, 500);
    } else if (job.callback && !["delivered", "failed"].includes(job.callback.state)) {
      window.setTimeout(poll, 2000);  // its callback is still on its way
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
