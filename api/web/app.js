// The playground: streams speech as server-sent events (pcm + word timestamps), plays it through Web Audio
// as it arrives, highlights each word as it is spoken, and shows what the server says when it refuses.
// "Type it live" sends the text a word at a time over the live WebSocket instead, as an LLM writes it.
// Served by the server itself; no build step, no third-party code.

const SAMPLE_RATE = 24000;
const FIELDS = { input: "text", text: "text", voice: "voice", speed: "speed" };
// How fast "Type it live" types: about a fast LLM's pace.
const TYPE_MS = 80;
// Close codes of the live socket (docs/api.md#live-text).
const TRY_AGAIN_LATER = 1013;
const POLICY_VIOLATION = 1008;
const $ = (id) => document.getElementById(id);

const state = {
  voices: [],
  mix: [],
  controller: null,
  socket: null,
  typing: null,
  ctx: null,
  sources: [],
  words: [],
  pcm: [],
  played: null,
  startAt: 0,
  nextTime: 0,
  streamDone: false,
  retryTimer: null,
  frame: 0,
};

// Read by the browser tests, and handy in the console.
const player = {
  samplesScheduled: 0,
  currentWord: -1,
  playing: false,
  retries: 0,
  ttfaMs: null,
  live: false,
  wordsTyped: 0,
  wordsTypedAtFirstAudio: null,
  contextTime: () => (state.ctx ? state.ctx.currentTime : 0),
};
window.kokoroPlayer = player;

export function headers() {
  const result = { "Content-Type": "application/json" };
  const key = $("api-key").value.trim();
  if (key) result.Authorization = `Bearer ${key}`;
  return result;
}

export function voiceSpec() {
  if (state.mix.length) return state.mix.map((term) => `${term.name}(${term.weight})`).join("+");
  return $("voice").value;
}

function speechBody(format, { stream = true, sse = false } = {}) {
  const body = {
    model: "kokoro",
    input: $("text").value,
    voice: voiceSpec(),
    speed: Number($("speed").value),
    response_format: format,
    stream,
  };
  if (sse) Object.assign(body, { stream_format: "sse", return_timestamps: true });
  return body;
}

// --- status and errors -----------------------------------------------------------------------------------

function setStatus(text) {
  $("status").textContent = text;
}

function clearErrors() {
  for (const id of ["text-error", "voice-error", "speed-error"]) {
    $(id).hidden = true;
    $(id).textContent = "";
  }
  for (const id of Object.values(FIELDS)) $(id).removeAttribute("aria-invalid");
}

async function showRefusal(response) {
  let error = { message: `The server answered ${response.status}.` };
  try {
    error = (await response.json()).error || error;
  } catch {
    // not JSON: keep the status line
  }
  showError(error);
}

function showError(error) {
  const field = FIELDS[(error.param || "").replace(/^session\./, "")];
  if (field) {
    $(`${field}-error`).textContent = error.message;
    $(`${field}-error`).hidden = false;
    $(field).setAttribute("aria-invalid", "true");
    $(field).focus();
    setStatus("The server refused the request: see the message by the field.");
  } else {
    setStatus(`The server refused the request: ${error.message}`);
  }
}

function retryLater(retryAfter, again) {
  let seconds = Math.max(1, parseInt(retryAfter || "2", 10));
  player.retries += 1;
  const tick = () => {
    if (seconds <= 0) {
      state.retryTimer = null;
      again();
      return;
    }
    setStatus(`The server is busy (${player.live ? "1013" : "503"}). Retrying in ${seconds} s…`);
    seconds -= 1;
    state.retryTimer = setTimeout(tick, 1000);
  };
  tick();
}

// --- voices and the mix ----------------------------------------------------------------------------------

async function loadVoices() {
  let response;
  try {
    response = await fetch("/v1/audio/voices", { headers: headers() });
  } catch {
    setStatus("Connection lost: the server could not be reached.");
    return;
  }
  if (!response.ok) {
    await showRefusal(response);
    return;
  }
  state.voices = (await response.json()).voices;
  const languages = [...new Set(state.voices.map((voice) => voice.language).filter(Boolean))].sort();
  $("language").replaceChildren(new Option("All languages", ""), ...languages.map((name) => new Option(name, name)));
  renderVoices();
}

function renderVoices() {
  const query = $("voice-search").value.trim().toLowerCase();
  const language = $("language").value;
  const previous = $("voice").value || "af_heart";
  const shown = state.voices.filter(
    (voice) => (!language || voice.language === language) && (!query || voice.id.toLowerCase().includes(query)),
  );
  $("voice").replaceChildren(
    ...shown.map((voice) => {
      const details = [voice.language, voice.gender].filter(Boolean).join(", ");
      const option = new Option(details ? `${voice.id} (${details})` : voice.id, voice.id);
      option.selected = voice.id === previous;
      return option;
    }),
  );
  updateSnippets();
}

function renderMix() {
  $("mix").replaceChildren(
    ...state.mix.map((term, index) => {
      const item = document.createElement("li");
      item.append(`${term.name} × ${term.weight} `);
      const remove = document.createElement("button");
      remove.type = "button";
      remove.textContent = "✕";
      remove.setAttribute("aria-label", `Remove ${term.name} from the mix`);
      remove.addEventListener("click", () => {
        state.mix.splice(index, 1);
        renderMix();
      });
      item.append(remove);
      return item;
    }),
  );
  updateSnippets();
}

// --- playback --------------------------------------------------------------------------------------------

function stopPlayback() {
  if (state.controller) state.controller.abort();
  state.controller = null;
  clearTimeout(state.typing);
  state.typing = null;
  const socket = state.socket;
  state.socket = null;
  if (socket && socket.readyState === WebSocket.OPEN) {
    // A barge-in: the server drops what it has not sent yet.
    socket.send(JSON.stringify({ type: "input_text.clear" }));
    socket.close(1000, "stopped");
  }
  if (state.retryTimer) clearTimeout(state.retryTimer);
  state.retryTimer = null;
  for (const source of state.sources) {
    try {
      source.stop();
    } catch {
      // not started yet
    }
  }
  state.sources = [];
  cancelAnimationFrame(state.frame);
  player.playing = false;
  $("stop").disabled = true;
  $("play").disabled = false;
  $("live").disabled = false;
}

function resetPlayback() {
  state.words = [];
  state.pcm = [];
  state.played = null;
  state.streamDone = false;
  state.nextTime = 0;
  player.currentWord = -1;
  player.ttfaMs = null;
  $("readalong").replaceChildren();
  $("ttfa").textContent = "";
  $("download").disabled = true;
}

async function play() {
  stopPlayback();
  clearErrors();
  const body = speechBody("pcm", { sse: true });
  resetPlayback();
  player.live = false;
  state.ctx = state.ctx || new AudioContext({ sampleRate: SAMPLE_RATE });
  await state.ctx.resume();
  const controller = new AbortController();
  state.controller = controller;
  $("play").disabled = true;
  $("live").disabled = true;
  $("stop").disabled = false;
  setStatus("Synthesizing…");
  const started = performance.now();
  let response;
  try {
    response = await fetch("/v1/audio/speech", {
      method: "POST",
      headers: headers(),
      body: JSON.stringify(body),
      signal: controller.signal,
    });
  } catch {
    if (!controller.signal.aborted) lost();
    return;
  }
  if (response.status === 503) {
    $("play").disabled = false;
    $("live").disabled = false;
    retryLater(response.headers.get("Retry-After"), play);
    return;
  }
  if (!response.ok) {
    await showRefusal(response);
    stopPlayback();
    return;
  }
  try {
    await readEvents(response, started);
  } catch {
    if (!controller.signal.aborted) lost();
    return;
  }
  state.streamDone = true;
  state.played = body;
  $("download").disabled = false;
}

// --- live: the text typed into the socket a word at a time -----------------------------------------------

function liveUrl() {
  const scheme = window.location.protocol === "https:" ? "wss" : "ws";
  return `${scheme}://${window.location.host}/v1/audio/speech/live`;
}

async function playLive() {
  stopPlayback();
  clearErrors();
  resetPlayback();
  player.live = true;
  player.wordsTyped = 0;
  player.wordsTypedAtFirstAudio = null;
  state.ctx = state.ctx || new AudioContext({ sampleRate: SAMPLE_RATE });
  await state.ctx.resume();
  const key = $("api-key").value.trim();
  // A browser's WebSocket sends no headers: the key goes as a subprotocol.
  const socket = new WebSocket(liveUrl(), key ? ["kokoro-live", `openai-insecure-api-key.${key}`] : ["kokoro-live"]);
  state.socket = socket;
  const body = speechBody("pcm");
  const words = body.input.split(/(?=\s+\S)/);
  let started = null;
  let refused = null;
  $("play").disabled = true;
  $("live").disabled = true;
  $("stop").disabled = false;
  setStatus("Connecting…");
  socket.addEventListener("open", () => {
    const session = { voice: body.voice, speed: body.speed, response_format: "pcm", return_timestamps: true };
    socket.send(JSON.stringify({ type: "session.update", session }));
  });
  const typeNext = () => {
    if (state.socket !== socket) return;
    if (player.wordsTyped === words.length) {
      socket.send(JSON.stringify({ type: "input_text.done" }));
      return;
    }
    socket.send(JSON.stringify({ type: "input_text.append", text: words[player.wordsTyped] }));
    player.wordsTyped += 1;
    if (!player.playing) setStatus(`Typing word ${player.wordsTyped} of ${words.length}…`);
    state.typing = setTimeout(typeNext, TYPE_MS);
  };
  socket.addEventListener("message", (message) => {
    const event = JSON.parse(message.data);
    if (event.type === "session.updated") {
      started = performance.now();
      typeNext();
    } else if (event.type === "speech.audio.delta") {
      if (player.wordsTypedAtFirstAudio === null) player.wordsTypedAtFirstAudio = player.wordsTyped;
      handleEvent(event, started);
    } else if (event.type === "speech.audio.done") {
      state.streamDone = true;
      setStatus("All audio received; playing.");
      socket.close(1000, "done");
    } else if (event.type === "error") {
      refused = event.error;
      showError(event.error);
      // A refused session.update stops here; a busy server closes the socket with 1013 (retried below).
      if (started === null && event.error.type !== "server_error") stopPlayback();
    }
  });
  socket.addEventListener("close", (event) => {
    if (state.socket !== socket) return; // stopped, or replaced by another playback
    state.socket = null;
    clearTimeout(state.typing);
    if (event.code === TRY_AGAIN_LATER) {
      stopPlayback();
      const seconds = (/retry after (\d+)/.exec(event.reason) || [])[1];
      retryLater(seconds, playLive);
    } else if (event.code === POLICY_VIOLATION || (refused && !player.playing)) {
      stopPlayback();
      if (refused) showError(refused);
    } else if (!state.streamDone) {
      lost();
    }
  });
}

function lost() {
  stopPlayback();
  setStatus("Connection lost: the audio stopped arriving. Check the server and press Play again.");
}

async function readEvents(response, started) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffered = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffered += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffered.indexOf("\n\n")) >= 0) {
      const event = buffered.slice(0, end);
      buffered = buffered.slice(end + 2);
      const data = event.split("\n").find((line) => line.startsWith("data: "));
      if (data) handleEvent(JSON.parse(data.slice(6)), started);
    }
  }
}

function handleEvent(event, started) {
  if (event.type === "speech.audio.delta") {
    if (event.audio) schedule(event.audio, started);
    for (const word of event.timestamps || []) addWord(word);
  } else if (event.type === "speech.audio.done") {
    setStatus("All audio received; playing.");
  }
}

function schedule(base64, started) {
  const bytes = Uint8Array.from(atob(base64), (char) => char.charCodeAt(0));
  const samples = new Int16Array(bytes.buffer, 0, bytes.length >> 1);
  if (!samples.length) return;
  state.pcm.push(samples);
  const buffer = state.ctx.createBuffer(1, samples.length, SAMPLE_RATE);
  buffer.copyToChannel(Float32Array.from(samples, (sample) => sample / 32768), 0);
  const source = state.ctx.createBufferSource();
  source.buffer = buffer;
  source.connect(state.ctx.destination);
  if (!player.playing) {
    player.playing = true;
    state.startAt = state.ctx.currentTime + 0.05;
    state.nextTime = state.startAt;
    player.ttfaMs = Math.round(performance.now() - started);
    const since = player.live ? " after the first word was typed" : "";
    $("ttfa").textContent = `Time to first audio: ${player.ttfaMs} ms${since}`;
    setStatus("Playing…");
    state.frame = requestAnimationFrame(follow);
  }
  source.start(state.nextTime);
  state.nextTime += buffer.duration;
  state.sources.push(source);
  player.samplesScheduled += samples.length;
}

function addWord(word) {
  const span = document.createElement("span");
  span.textContent = word.word;
  state.words.push({ ...word, span });
  $("readalong").append(span, " ");
}

function follow() {
  const elapsed = state.ctx.currentTime - state.startAt;
  let index = -1;
  while (index + 1 < state.words.length && state.words[index + 1].start_time <= elapsed) index += 1;
  if (index !== player.currentWord) {
    if (player.currentWord >= 0) {
      state.words[player.currentWord].span.classList.remove("current");
      state.words[player.currentWord].span.removeAttribute("aria-current");
    }
    if (index >= 0) {
      const { span } = state.words[index];
      span.classList.add("current");
      span.setAttribute("aria-current", "true");
      span.scrollIntoView({ block: "nearest" });
    }
    player.currentWord = index;
  }
  if (state.streamDone && state.ctx.currentTime > state.nextTime + 0.1) {
    player.playing = false;
    $("stop").disabled = true;
    $("play").disabled = false;
    $("live").disabled = false;
    setStatus("Done.");
    return;
  }
  state.frame = requestAnimationFrame(follow);
}

// --- download --------------------------------------------------------------------------------------------

function samePlayback(body) {
  const played = state.played;
  return played && ["input", "voice", "speed"].every((key) => played[key] === body[key]);
}

function wavOf(chunks) {
  const length = chunks.reduce((total, chunk) => total + chunk.length, 0);
  const view = new DataView(new ArrayBuffer(44 + 2 * length));
  const text = (offset, value) => [...value].forEach((char, i) => view.setUint8(offset + i, char.charCodeAt(0)));
  text(0, "RIFF");
  view.setUint32(4, 36 + 2 * length, true);
  text(8, "WAVEfmt ");
  view.setUint32(16, 16, true);
  view.setUint16(20, 1, true);
  view.setUint16(22, 1, true);
  view.setUint32(24, SAMPLE_RATE, true);
  view.setUint32(28, 2 * SAMPLE_RATE, true);
  view.setUint16(32, 2, true);
  view.setUint16(34, 16, true);
  text(36, "data");
  view.setUint32(40, 2 * length, true);
  let offset = 44;
  for (const chunk of chunks) {
    for (const sample of chunk) {
      view.setInt16(offset, sample, true);
      offset += 2;
    }
  }
  return new Blob([view], { type: "audio/wav" });
}

async function download() {
  const format = $("format").value;
  const body = speechBody(format, { stream: false });
  let blob;
  if (samePlayback(body) && (format === "wav" || format === "pcm")) {
    // Exactly the samples that were played.
    blob = format === "wav" ? wavOf(state.pcm) : new Blob(state.pcm, { type: "audio/pcm" });
  } else {
    setStatus(`Preparing the ${format} file…`);
    let response;
    try {
      response = await fetch("/v1/audio/speech", { method: "POST", headers: headers(), body: JSON.stringify(body) });
    } catch {
      setStatus("Connection lost: the server could not be reached.");
      return;
    }
    if (response.status === 503) {
      retryLater(response.headers.get("Retry-After"), download);
      return;
    }
    if (!response.ok) {
      await showRefusal(response);
      return;
    }
    blob = await response.blob();
  }
  const link = document.createElement("a");
  link.href = URL.createObjectURL(blob);
  link.download = `speech.${format}`;
  document.body.append(link);
  link.click();
  link.remove();
  setStatus(`Downloaded speech.${format}.`);
}

// --- snippets --------------------------------------------------------------------------------------------

function updateSnippets() {
  const format = $("format").value;
  const body = { model: "kokoro", input: $("text").value, voice: voiceSpec(), speed: Number($("speed").value), response_format: format };
  const base = window.location.origin;
  const key = $("api-key").value.trim() ? ' -H "Authorization: Bearer $KOKORO_API_KEY"' : "";
  const json = JSON.stringify(body).replaceAll("'", "'\\''");
  $("curl").textContent = `curl -s ${base}/v1/audio/speech -H "Content-Type: application/json"${key} \\\n  -d '${json}' -o speech.${format}`;
  const apiKey = $("api-key").value.trim() ? 'os.environ["KOKORO_API_KEY"]' : '"not-needed"';
  $("python").textContent = [
    ...(key ? ["import os", ""] : []),
    "from openai import OpenAI",
    "",
    `client = OpenAI(base_url="${base}/v1", api_key=${apiKey})`,
    "with client.audio.speech.with_streaming_response.create(",
    `    model="kokoro", voice=${JSON.stringify(body.voice)}, speed=${body.speed},`,
    `    response_format="${format}", input=${JSON.stringify(body.input)},`,
    ") as response:",
    `    response.stream_to_file("speech.${format}")`,
  ].join("\n");
}

async function copy(id) {
  const text = $(id).textContent;
  try {
    await navigator.clipboard.writeText(text);
  } catch {
    const area = document.createElement("textarea");
    area.value = text;
    document.body.append(area);
    area.select();
    document.execCommand("copy");
    area.remove();
  }
  setStatus(`Copied the ${id} snippet.`);
}

// --- server state ----------------------------------------------------------------------------------------

async function pollServer() {
  try {
    const response = await fetch("/ready");
    const body = await response.json();
    const load = `${body.in_flight ?? 0} in flight, ${body.waiting ?? 0} waiting`;
    const states = { ready: "ready", starting: "loading the model", failed: "failed to load", stopped: "stopped" };
    $("server-state").textContent = `Server ${states[body.status] || body.status} (${body.engine}) · ${load}`;
  } catch {
    $("server-state").textContent = "Server unreachable";
  }
  setTimeout(pollServer, 2000);
}

// --- wiring ----------------------------------------------------------------------------------------------

function wire() {
  $("play").addEventListener("click", play);
  $("live").addEventListener("click", playLive);
  $("stop").addEventListener("click", () => {
    stopPlayback();
    setStatus("Stopped.");
  });
  $("download").addEventListener("click", download);
  $("voice-search").addEventListener("input", renderVoices);
  $("language").addEventListener("change", renderVoices);
  $("mix-add").addEventListener("click", () => {
    const name = $("voice").value;
    const weight = Math.max(0.1, Number($("mix-weight").value) || 1);
    if (name) state.mix.push({ name, weight });
    renderMix();
  });
  $("speed").addEventListener("input", () => {
    $("speed-value").textContent = Number($("speed").value).toFixed(2);
    updateSnippets();
  });
  for (const id of ["text", "voice", "format"]) $(id).addEventListener("input", updateSnippets);
  $("api-key").addEventListener("change", () => {
    sessionStorage.setItem("kokoro-api-key", $("api-key").value);
    loadVoices();
  });
  $("api-key").value = sessionStorage.getItem("kokoro-api-key") || "";
  for (const button of document.querySelectorAll("[data-copy]")) {
    button.addEventListener("click", () => copy(button.dataset.copy));
  }
  document.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) play();
    if (event.key === "Escape") stopPlayback();
  });
}

wire();
updateSnippets();
loadVoices();
pollServer();
