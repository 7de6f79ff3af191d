// What every page of the farm shares. Text from users is only ever set with textContent, never as HTML.
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

// Each page's script (static/pages/) sets its page up once the document is parsed.
function onPage(name, setUp) {
  document.addEventListener("DOMContentLoaded", () => {
    const element = document.querySelector(`[data-page=${name}]`);
    if (element) setUp(element);
  });
}
