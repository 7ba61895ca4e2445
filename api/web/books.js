// The Book tab: a book file becomes a job (POST /v1/audio/jobs, docs/api.md#books); the page lists the
// server's jobs with their progress, chapters and downloads, and polls while any is queued or running.

import { headers, voiceSpec } from "./app.js";

const POLL_MS = 2000;
const $ = (id) => document.getElementById(id);
const books = { jobs: [], timer: null, started: 0 };
// Read by the browser tests.
window.kokoroBooks = books;

function authorization() {
  const result = headers();
  delete result["Content-Type"]; // a form sets its own, with the boundary
  return result;
}

function setStatus(text) {
  $("book-status").textContent = text;
}

async function errorMessage(response) {
  try {
    return (await response.json()).error.message;
  } catch {
    return `The server answered ${response.status}.`;
  }
}

async function start() {
  const file = $("book-file").files[0];
  if (!file) {
    setStatus("Choose a book file first.");
    $("book-file").focus();
    return;
  }
  const form = new FormData();
  form.append("file", file);
  form.append("voice", voiceSpec());
  form.append("speed", $("speed").value);
  form.append("response_format", $("book-format").value);
  form.append("captions", $("book-captions").checked ? "true" : "false");
  setStatus(`Sending ${file.name}…`);
  const response = await fetch("/v1/audio/jobs", { method: "POST", headers: authorization(), body: form });
  if (response.status !== 202) {
    setStatus(`The server refused the book: ${await errorMessage(response)}`);
    return;
  }
  const job = await response.json();
  books.started += 1;
  setStatus(`"${job.title}": ${job.chapters.length} chapters, queued.`);
  await refresh();
}

function clock(seconds) {
  const whole = Math.round(seconds);
  const h = Math.floor(whole / 3600);
  const m = Math.floor((whole % 3600) / 60);
  const s = whole % 60;
  return `${h ? `${h}:` : ""}${String(m).padStart(h ? 2 : 1, "0")}:${String(s).padStart(2, "0")}`;
}

function describe(job) {
  const progress = job.progress;
  if (job.state === "done") return `Done: ${clock(progress.audio_seconds)} of audio, ${(job.bytes / 1e6).toFixed(1)} MB.`;
  if (job.state === "failed") return `Failed: ${job.error.message}`;
  if (job.state === "queued") return "Queued.";
  const eta = job.eta_seconds == null ? "" : `, about ${clock(job.eta_seconds)} to go`;
  return `${Math.round(progress.fraction * 100)}%: ${clock(progress.audio_seconds)} of audio made${eta}.`;
}

async function save(url, name) {
  // A fetch, not a plain link, so that an API key goes along.
  setStatus(`Downloading ${name}…`);
  const response = await fetch(url, { headers: authorization() });
  if (!response.ok) {
    setStatus(`The download failed: ${await errorMessage(response)}`);
    return;
  }
  const link = document.createElement("a");
  link.href = URL.createObjectURL(await response.blob());
  link.download = name;
  link.click();
  setTimeout(() => URL.revokeObjectURL(link.href), 60000);
  setStatus(`Downloaded ${name}.`);
}

async function remove(job) {
  const response = await fetch(`/v1/audio/jobs/${job.id}`, { method: "DELETE", headers: authorization() });
  setStatus(response.ok ? `Removed "${job.title}".` : `Not removed: ${await errorMessage(response)}`);
  await refresh();
}

function button(text, action) {
  const element = document.createElement("button");
  element.type = "button";
  element.textContent = text;
  element.addEventListener("click", action);
  return element;
}

function jobItem(job) {
  const item = document.createElement("li");
  item.dataset.job = job.id;
  item.dataset.state = job.state;
  const head = document.createElement("div");
  head.className = "job-head";
  const title = document.createElement("strong");
  title.textContent = job.title;
  const format = document.createElement("span");
  format.textContent = `${job.response_format} · ${job.voice}`;
  head.append(title, format);
  const bar = document.createElement("progress");
  bar.max = 1;
  bar.value = job.state === "done" ? 1 : job.progress.fraction;
  bar.setAttribute("aria-label", `Progress of ${job.title}`);
  const text = document.createElement("p");
  text.className = "job-state";
  text.textContent = describe(job);
  const chapters = document.createElement("ol");
  chapters.setAttribute("aria-label", `Chapters of ${job.title}`);
  for (const chapter of job.chapters) {
    const line = document.createElement("li");
    line.textContent = chapter.start_time == null ? chapter.title : `${chapter.title} (${clock(chapter.start_time)})`;
    chapters.append(line);
  }
  const actions = document.createElement("div");
  actions.className = "job-actions";
  if (job.state === "done") {
    const name = `${job.title}.${job.response_format}`;
    actions.append(button(`Download ${job.response_format}`, () => save(job.audio_url, name)));
    if (job.captions_url) {
      actions.append(button("Captions (SRT)", () => save(`${job.captions_url}?format=srt`, `${job.title}.srt`)));
    }
  }
  actions.append(button(job.state === "done" || job.state === "failed" ? "Remove" : "Cancel", () => remove(job)));
  item.append(head, bar, text, chapters, actions);
  return item;
}

async function refresh() {
  clearTimeout(books.timer);
  let response;
  try {
    response = await fetch("/v1/audio/jobs", { headers: authorization() });
  } catch {
    setStatus("The server is unreachable.");
    books.timer = setTimeout(refresh, POLL_MS);
    return;
  }
  if (!response.ok) {
    setStatus(await errorMessage(response));
    return;
  }
  books.jobs = (await response.json()).data;
  $("book-jobs").replaceChildren(...books.jobs.map(jobItem));
  if (books.jobs.some((job) => job.state === "queued" || job.state === "running")) {
    books.timer = setTimeout(refresh, POLL_MS);
  }
}

function select(tab) {
  for (const other of document.querySelectorAll('[role="tab"]')) {
    const chosen = other === tab;
    other.setAttribute("aria-selected", String(chosen));
    other.tabIndex = chosen ? 0 : -1;
    $(other.getAttribute("aria-controls")).hidden = !chosen;
  }
  tab.focus();
  if (tab.id === "tab-book") refresh();
}

function wire() {
  const tabs = [...document.querySelectorAll('[role="tab"]')];
  for (const tab of tabs) {
    tab.addEventListener("click", () => select(tab));
    tab.addEventListener("keydown", (event) => {
      const step = { ArrowRight: 1, ArrowLeft: -1 }[event.key];
      if (step) select(tabs[(tabs.indexOf(tab) + step + tabs.length) % tabs.length]);
    });
  }
  $("book-start").addEventListener("click", start);
}

wire();
