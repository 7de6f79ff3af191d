// The speak form; shared helpers (sendJson, splitTags, onPage) are in farm.js.
"use strict";

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
      priority: "interactive",  // someone waits at the page for it
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

onPage("speak", setUpSpeakForm);
