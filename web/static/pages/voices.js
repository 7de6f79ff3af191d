// The voice catalog and its workshop; shared helpers (sendJson, splitTags, onPage) are in farm.js.
"use strict";

// A job's state once it has ended (done, or failed: then an error), polled every half second.
async function finished(job, onState = () => {}) {
  for (;;) {
    const state = await sendJson("GET", job.status_url);
    onState(state);
    if (state.status === "done") return state;
    if (state.status !== "queued" && state.status !== "running") throw new Error(state.error || state.status);
    await new Promise((resolve) => window.setTimeout(resolve, 500));
  }
}

// Auditions a catalog voice in its own row: its kept preview, made once and played where it is.
async function preview(row) {
  const audio = row.querySelector(".voice-audio");
  const button = row.querySelector(".voice-preview");
  button.disabled = true;
  button.textContent = "Making…";
  try {
    const job = await sendJson("POST", `/api/voices/${row.dataset.voiceId}/preview`);
    const state = await finished(job);
    audio.src = state.result.audio_url;
    audio.hidden = false;
    await audio.play().catch(() => {});  // a browser that wants a click on the player first shows it
  } finally {
    button.disabled = false;
    button.textContent = "Listen";
  }
}

// A kept voice joins the catalog table at once (read-only until the page is loaded again).
function addCatalogRow(voice) {
  const body = document.querySelector("#voices tbody");
  const row = document.createElement("tr");
  row.className = "voice kept";
  row.dataset.voiceId = String(voice.id);
  row.dataset.voiceName = voice.name;
  const kind = voice.kind === "seed" ? `seed ${voice.seed}` : voice.kind;
  for (const text of [voice.name, kind, voice.tags.join(", "), String(voice.rating), voice.owner ?? "—", "new"]) {
    const cell = document.createElement("td");
    cell.textContent = text;
    row.append(cell);
  }
  body.prepend(row);
}

function setUpWorkshop(section) {
  const form = section.querySelector("#workshop-form");
  const list = section.querySelector("#workshop-voices");
  const template = section.querySelector("#workshop-card");
  const message = section.querySelector("#workshop-message");

  // named: the voice as the form named it (the workshop's jobs come in the order asked), or undefined for a new one.
  function showCard(job, named) {
    const card = template.content.firstElementChild.cloneNode(true);
    card.dataset.jobId = job.id;
    card.querySelector(".card-named").textContent = named === undefined ? "" : `${named}:`;
    card.querySelector(".card-seed").textContent = job.voice.seed === null ? "(embedding)" : String(job.voice.seed);
    const state = card.querySelector(".card-state");
    const keep = card.querySelector(".card-keep");
    list.append(card);
    finished(job, (now) => { state.textContent = now.status; }).then((done) => {
      card.querySelector(".card-audio").src = done.result.audio_url;
      state.textContent = "ready";
      keep.querySelector(".card-keep-button").disabled = false;
    }, (failure) => { state.textContent = `failed: ${failure.message}`; });
    keep.addEventListener("submit", async (event) => {
      event.preventDefault();
      const said = keep.querySelector(".card-message");
      try {
        const voice = await sendJson("POST", `/api/voices/from-job/${job.id}`, {
          name: keep.querySelector(".card-name").value,
          tags: splitTags(keep.querySelector(".card-tags").value),
        });
        said.textContent = `Kept as "${voice.name}".`;
        card.classList.add("kept");
        for (const control of keep.querySelectorAll("input, button")) control.disabled = true;
        addCatalogRow(voice);
      } catch (failure) {
        said.textContent = failure.message;
      }
    });
  }

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const button = form.querySelector("#workshop-submit");
    button.disabled = true;
    message.textContent = "";
    try {
      const named = splitTags(form.querySelector("#workshop-named").value);
      const count = Number(form.querySelector("#workshop-count").value);
      // No new voices beside named ones is the API's default; without named ones, 0 is refused, naming count.
      const made = await sendJson("POST", section.dataset.url, {
        text: form.querySelector("#workshop-text").value,
        voices: named,
        ...(count === 0 && named.length > 0 ? {} : {count}),
      });
      list.replaceChildren();
      made.jobs.forEach((job, index) => showCard(job, named[index]));
      message.textContent = `${made.jobs.length} voices on their way.`;
    } catch (failure) {
      message.textContent = failure.message;
    } finally {
      button.disabled = false;
    }
  });
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

// A voice from a recording: the clip is chosen (dropped or picked), played and timed here before it is
// sent; the server checks it again, and its refusal is shown under the field it names.
function setUpClipVoice(form) {
  const file = form.querySelector("#clip-file");
  const drop = form.querySelector("#clip-drop");
  const audio = form.querySelector("#clip-audio");
  const chosen = form.querySelector("#clip-chosen");
  const message = form.querySelector("#clip-message");
  const button = form.querySelector("#clip-submit");
  let clip = null;
  let playable = null;

  const errors = () => form.querySelectorAll(".field-error");
  const showError = (field, text) => {
    const where = form.querySelector(`#clip-error-${field}`);
    if (where) where.textContent = text; else message.textContent = text;
  };
  const choose = (picked) => {
    errors().forEach((element) => { element.textContent = ""; });
    if (playable) URL.revokeObjectURL(playable);
    clip = picked;
    playable = URL.createObjectURL(picked);
    audio.src = playable;
    audio.hidden = false;
    chosen.textContent = `${picked.name}: ${(picked.size / 1e6).toFixed(2)} MB`;
  };
  audio.addEventListener("loadedmetadata", () => {
    if (clip && Number.isFinite(audio.duration)) {
      chosen.textContent = `${clip.name}: ${audio.duration.toFixed(1)} s, ${(clip.size / 1e6).toFixed(2)} MB`;
    }
  });
  audio.addEventListener("error", () => {
    if (clip) showError("audio", "This browser cannot play the file: the server will say whether it is a clip.");
  });
  file.addEventListener("change", () => { if (file.files[0]) choose(file.files[0]); });
  drop.addEventListener("dragover", (event) => { event.preventDefault(); drop.classList.add("dragging"); });
  drop.addEventListener("dragleave", () => drop.classList.remove("dragging"));
  drop.addEventListener("drop", (event) => {
    event.preventDefault();
    drop.classList.remove("dragging");
    if (event.dataTransfer.files[0]) choose(event.dataTransfer.files[0]);
  });

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    errors().forEach((element) => { element.textContent = ""; });
    message.textContent = "";
    if (!clip) {
      showError("audio", "Choose or drop a clip first.");
      return;
    }
    const body = new FormData();
    body.append("name", form.querySelector("#clip-name").value);
    body.append("transcript", form.querySelector("#clip-transcript").value);
    body.append("tags", form.querySelector("#clip-tags").value);
    body.append("audio", clip, clip.name);
    button.disabled = true;
    message.textContent = "Uploading and encoding the clip…";
    try {
      const response = await fetch(form.dataset.url, {
        method: "POST",
        headers: {"Accept": "application/json",
                  "X-CSRF-Token": document.querySelector('meta[name="csrf-token"]').content},
        body,
      });
      const payload = await response.json();
      if (!response.ok) {
        message.textContent = "";
        showError(payload.field || "", payload.error || response.statusText);
        return;
      }
      window.location.reload();
    } catch (failure) {
      message.textContent = failure.message;
    } finally {
      button.disabled = false;
    }
  });
}

// Composes a blend of 2 to 8 voices with their weights, to hear in the workshop and keep as a catalog
// voice; the API's refusals (all weights 0, a voice it does not know) are shown in the form.
function setUpBlend(form) {
  const list = form.querySelector("#blend-parts");
  const template = form.querySelector("#blend-part");
  const message = form.querySelector("#blend-message");
  const addButton = form.querySelector("#blend-add");
  const [fewest, most] = [Number(list.dataset.min), Number(list.dataset.max)];

  function countChanged() {
    addButton.disabled = list.children.length >= most;
    for (const remove of list.querySelectorAll(".blend-remove")) remove.disabled = list.children.length <= fewest;
  }
  function addPart() {
    const part = template.content.firstElementChild.cloneNode(true);
    part.querySelector(".blend-remove").addEventListener("click", () => { part.remove(); countChanged(); });
    list.append(part);
    countChanged();
  }
  for (let count = 0; count < fewest; count += 1) addPart();
  addButton.addEventListener("click", addPart);
  const mix = () => Array.from(list.children, (part) => ({
    voice: part.querySelector(".blend-voice").value.trim(),
    weight: Number(part.querySelector(".blend-weight").value),
  }));

  // Heard before it is kept: the workshop speaks its sample sentence in the blend.
  const hear = form.querySelector("#blend-hear");
  hear.addEventListener("click", async () => {
    // The parts must be filled in; the name need not be, until the blend is kept.
    if (!Array.from(list.querySelectorAll("input")).every((input) => input.reportValidity())) return;
    const audio = form.querySelector("#blend-audio");
    hear.disabled = true;
    message.textContent = "";
    try {
      const made = await sendJson("POST", hear.dataset.url, {voices: [{mix: mix()}]});
      audio.src = (await finished(made.jobs[0])).result.audio_url;
      audio.hidden = false;
      await audio.play().catch(() => {});  // a browser that wants a click on the player first shows it
    } catch (failure) {
      message.textContent = failure.message;
    } finally {
      hear.disabled = false;
    }
  });

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const submit = form.querySelector("#new-blend-submit");
    submit.disabled = true;
    message.textContent = "";
    try {
      await sendJson("POST", "/api/voices", {
        name: form.querySelector("#blend-name").value,
        tags: splitTags(form.querySelector("#blend-tags").value),
        mix: mix(),
      });
      window.location.reload();
    } catch (failure) {
      message.textContent = failure.message;
      submit.disabled = false;
    }
  });
}

onPage("voices", setUpVoices);
onPage("blend", setUpBlend);
onPage("clip-voice", setUpClipVoice);
onPage("workshop", setUpWorkshop);
