"""Soak: every protocol at once against one server for a stated time, with faults in the middle.

    python -m scripts.bench soak --start api --workers 2 --duration-s 3600 \\
        --fault kill@900 --fault stop@1500 --fault voice@2100 --fault disk@2400 \\
        --out bench-results/<machine>/soak.json
    python -m scripts.bench soak --start tone --duration-s 120          (the suite's short run)

Load, all at once until the time is up:
- `--clients` HTTP speech clients back to back: every format, streamed, whole and SSE, clients that hang up
  after the first audio and clients that read slowly;
- `--live-clients` clients speaking LLM-sized tokens over the live socket, Deepgram's, ElevenLabs' and
  Cartesia's sockets and Wyoming's TCP protocol in turn, some of them barging in (clear) or leaving
  mid-utterance;
- a book job at a time (`--book-every-s`), a voice upload used and deleted (`--voice-every-s`), and a
  burst of `--burst-size` requests at once above the admission limit (`--burst-every-s`).

Before the load, each text is rendered alone (whole and streamed) as its reference: a 200 whose audio is
shorter than its reference (less a codec's padding) is a short 200, a failure. A refusal must be a 503 with
Retry-After, or the protocol's own busy message. Each worker's RSS, threads and open files are sampled
every `--sample-s`.

Faults (`--fault KIND@SECONDS`): `kill` (SIGKILL of one worker: its requests in flight fail as cut streams;
how long until every worker is ready again, and the longest pause in the others' audio), `stop` (SIGSTOP
of one worker: how long until the supervisor replaces it), `voice` (a saved voice's file corrupted, then
removed, under the library: the answers, and the server still serving), `disk` (the data volume filled,
`--data-dir` on a small filesystem: a book job then fails and says why, speech keeps serving, and once the
space is back a new job succeeds), `postgres` (with `--postgres`: the jobs in a PostgreSQL that every worker
shares, stopped for `--postgres-outage-s` under a book job the workers are making: the jobs' routes answer
503 with Retry-After meanwhile, speech keeps serving, and once it is back the job ends with its whole audio,
every unit made and none thrown away). Each fault's observations go in the report.

Checks: no bad answer (no 5xx but 503 + Retry-After, no short 200, no lost request) outside a fault's
window; gauges back to 0; the RSS of each worker there from the start within `--rss-growth` after the
warm-up (a replacement's is shown), each worker's threads and open files back to where they were; HTTP
first-audio p95 of the last window within `--p95-drift` of the first.
Exits 1 when a check fails.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import random
import re
import shutil
import signal
import statistics
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus, WebSocketException

from scripts import postgres
from scripts.bench import live
from scripts.bench.common import Report, positive_float, positive_int
from scripts.bench.load import measure_audio
from scripts.harness import Server, free_port, launch, process_env, started, stop_server, worker_pids

FORMATS = ("mp3", "opus", "aac", "flac", "wav", "pcm")
VOICES = ("af_heart", "bf_emma", "af_heart(2)+am_adam(1)")
SPEEDS = (1.0, 1.3)
TEXTS = (
    "Hello.",
    "The train leaves at 3:30 PM on Nov 22, 2026, from platform 4.",
    "It was a bright cold day in April, and the clocks were striking thirteen. Winston Smith, his chin "
    "nuzzled into his breast in an effort to escape the vile wind, slipped quickly through the glass doors.",
    " ".join(["Tickets cost $12.50 each, about 45% less than in 2019, and the queue moved slowly."] * 3),
)
HTTP_MODES = ("read", "read", "read", "hang_up", "slow", "whole", "sse")
PROTOCOLS = ("live", "deepgram", "elevenlabs", "cartesia", "wyoming")
BOOK_TEXT = "\n\n".join([TEXTS[2], TEXTS[1], TEXTS[3]])
BURST_TEXT = "A short burst."
# The postgres fault's book: long enough to be under way when the database stops, on any engine.
FAULT_BOOK_TEXT = "\n\n".join([BOOK_TEXT] * 3)
# A coded stream may lose up to this much at its ends (encoder delay and padding) against the raw one.
PADDING_S = 0.08
SHORT_RATIO = 0.97
# Live text is split into phrases as it comes, so its audio differs from a whole rendering more.
LIVE_RATIO = 0.75
OP_TIMEOUT_S = 300.0


@dataclass
class Op:
    """One finished operation: `status` is "ok", "refused" (503 + Retry-After or a busy message), "hung_up"
    (the client left on purpose), or what went wrong."""

    kind: str
    mode: str
    start: float  # seconds from the soak's start
    end: float
    status: str
    first_audio_s: float | None = None
    audio_s: float | None = None
    reference_s: float | None = None
    detail: str | None = None


@dataclass
class Soak:
    args: argparse.Namespace
    server_pid: int | None
    references: dict[str, float]
    started: float = field(default_factory=time.monotonic)
    ops: list[Op] = field(default_factory=list)
    samples: list[dict[str, Any]] = field(default_factory=list)
    faults: list[dict[str, Any]] = field(default_factory=list)
    http_count: int = 0

    def now(self) -> float:
        return time.monotonic() - self.started

    def running(self) -> bool:
        return self.now() < self.args.duration_s

    def record(self, op: Op) -> None:
        self.ops.append(op)


def reference_key(text: str, voice: str, speed: float, stream: bool) -> str:
    return json.dumps([text, voice, speed, stream])


def short(audio_s: float | None, reference_s: float | None, ratio: float = SHORT_RATIO) -> bool:
    return reference_s is not None and (audio_s or 0.0) < reference_s * ratio - PADDING_S


def sse_audio(body: bytes) -> bytes:
    audio = bytearray()
    for line in body.decode(errors="replace").splitlines():
        if line.startswith("data:"):
            event = json.loads(line[5:])
            if event.get("type") == "speech.audio.delta":
                audio += base64.b64decode(event["audio"])
    return bytes(audio)


# --- references -------------------------------------------------------------------------------------------


async def render(client: httpx.AsyncClient, text: str, voice: str, speed: float, stream: bool) -> float:
    body = {"input": text, "voice": voice, "speed": speed, "response_format": "pcm", "stream": stream}
    for _ in range(20):
        response = await client.post("/v1/audio/speech", json=body)
        if response.status_code != 503:
            break
        await asyncio.sleep(float(response.headers.get("retry-after", "1")))
    response.raise_for_status()
    return len(response.content) / 48000


async def references(client: httpx.AsyncClient) -> dict[str, float]:
    found = {}
    for text in TEXTS:
        for voice in VOICES:
            for speed in SPEEDS:
                for stream in (False, True):
                    found[reference_key(text, voice, speed, stream)] = await render(
                        client, text, voice, speed, stream
                    )
    found[reference_key(live.TEXT, "af_heart", 1.0, True)] = await render(
        client, live.TEXT, "af_heart", 1.0, True
    )
    found[reference_key(BOOK_TEXT, "af_heart", 1.0, False)] = await render(
        client, BOOK_TEXT, "af_heart", 1.0, False
    )
    return found


# --- HTTP speech ------------------------------------------------------------------------------------------


async def http_request(soak: Soak, client: httpx.AsyncClient, rng: random.Random, mode: str) -> Op:
    text, voice, speed = rng.choice(TEXTS), rng.choice(VOICES), rng.choice(SPEEDS)
    fmt = rng.choice(FORMATS)
    stream = mode != "whole"
    body: dict[str, Any] = {"input": text, "voice": voice, "speed": speed, "response_format": fmt}
    body["stream"] = stream
    if mode == "sse":
        body["stream_format"] = "sse"
    reference = soak.references[reference_key(text, voice, speed, stream)]
    op = Op("http", f"{mode}:{fmt}", soak.now(), 0.0, "ok", reference_s=reference)
    started = time.perf_counter()
    data = bytearray()
    try:
        async with client.stream("POST", "/v1/audio/speech", json=body) as response:
            async for piece in response.aiter_bytes():
                if op.first_audio_s is None and piece and response.status_code == 200:
                    op.first_audio_s = round(time.perf_counter() - started, 3)
                data += piece
                if mode == "hang_up" and response.status_code == 200:
                    op.status = "hung_up"
                    break  # leaving the block closes the connection mid-stream
                if mode == "slow":
                    await asyncio.sleep(0.2)
        if op.status != "hung_up":
            op.status, op.detail = answer_status(response, bytes(data))
            if op.status == "ok":
                audio = sse_audio(bytes(data)) if mode == "sse" else bytes(data)
                op.audio_s = measure_audio(fmt, audio)
                if short(op.audio_s, reference):
                    op.status = "short"
    except httpx.HTTPError as exc:
        op.status, op.detail = f"error:{type(exc).__name__}", repr(exc)[:200]
    op.end = soak.now()
    return op


def answer_status(response: httpx.Response, body: bytes) -> tuple[str, str | None]:
    if response.status_code == 200:
        return "ok", None
    detail = body[:300].decode(errors="replace")
    if response.status_code in (503, 429) and response.headers.get("retry-after"):
        return "refused", None
    return f"http:{response.status_code}", detail


async def http_client(soak: Soak, client: httpx.AsyncClient, seed: int) -> None:
    rng = random.Random(seed)
    while soak.running() and (soak.args.requests is None or soak.http_count < soak.args.requests):
        soak.http_count += 1
        soak.record(await http_request(soak, client, rng, rng.choice(HTTP_MODES)))


# --- the live protocols -----------------------------------------------------------------------------------


def busy_message(errors: list[Any]) -> bool:
    text = json.dumps(errors).lower()
    return "overloaded" in text or "sessions are open" in text or "retry after" in text


async def speak(soak: Soak, protocol: str, rng: random.Random) -> Op:
    tokens = live.llm_tokens(live.TEXT)
    token_s = soak.args.token_s
    mode = (
        rng.choice(("whole", "whole", "whole", "leave", "barge_in"))
        if protocol in ("live", "deepgram")
        else "whole"
    )
    reference = soak.references[reference_key(live.TEXT, "af_heart", 1.0, True)]
    op = Op(protocol, mode, soak.now(), 0.0, "ok", reference_s=reference)
    try:
        if mode == "barge_in":
            op.status, op.detail = await barge_in(soak.args.url, protocol)
        elif mode == "leave":
            op.status, op.detail = await leave(soak.args.url, protocol, tokens, token_s)
        else:
            heard = await asyncio.wait_for(speak_once(soak, protocol, tokens, token_s), OP_TIMEOUT_S)
            op.audio_s = round(len(heard.audio) / 48000, 3)
            if heard.arrivals and heard.sent.get("first"):
                op.first_audio_s = round(heard.arrivals[0] - heard.sent["first"], 3)
            if heard.errors:
                op.status = "refused" if busy_message(heard.errors) else "protocol_error"
                op.detail = json.dumps(heard.errors)[:300]
            elif heard.done is None:
                op.status = "no_end"
            elif short(op.audio_s, reference, LIVE_RATIO):
                op.status = "short"
    except InvalidStatus as exc:
        code = exc.response.status_code
        op.status = "refused" if code == 503 else f"http:{code}"
    except (WebSocketException, OSError, asyncio.TimeoutError, asyncio.IncompleteReadError) as exc:
        refused = getattr(getattr(exc, "rcvd", None), "code", None) == 1013
        op.status = "refused" if refused else f"error:{type(exc).__name__}"
        op.detail = repr(exc)[:200]
    op.end = soak.now()
    return op


async def speak_once(soak: Soak, protocol: str, tokens: list[str], token_s: float) -> live.Heard:
    if protocol == "live":
        return await live.speak_live(soak.args.url, tokens, token_s)
    if protocol == "deepgram":
        return await live.speak_deepgram(soak.args.url, tokens, token_s)
    if protocol == "elevenlabs":
        return await live.speak_elevenlabs(soak.args.url, tokens, token_s)
    if protocol == "cartesia":
        return await live.speak_cartesia(soak.args.url, tokens, token_s)
    return await live.speak_wyoming(soak.args.wyoming_port, tokens, token_s)


async def barge_in(url: str, protocol: str) -> tuple[str, str | None]:
    """The whole text at once, the first audio, then a clear: answered with its acknowledgement."""
    ws_url = url.replace("http://", "ws://", 1)
    if protocol == "live":
        path, speak_, clear, cleared = (
            "/v1/audio/speech/live",
            "input_text.append",
            "input_text.clear",
            "input_text.cleared",
        )
        first = {"type": speak_, "text": live.LONG_TEXT + " And"}
    else:
        path, clear, cleared = (
            "/v1/speak?model=af_heart&encoding=linear16&sample_rate=24000",
            "Clear",
            "Cleared",
        )
        first = {"type": "Speak", "text": live.LONG_TEXT}
    async with connect(ws_url + path, max_size=None) as ws:
        await ws.send(json.dumps(first))
        if protocol == "deepgram":
            await ws.send(json.dumps({"type": "Flush"}))

        async def cleared_after_audio() -> tuple[str, str | None]:
            while True:
                message = await ws.recv()
                if isinstance(message, bytes) or json.loads(message).get("type") == "speech.audio.delta":
                    break
                event = json.loads(message)
                if event.get("type") in ("error", "Error", "Warning"):
                    return ("refused" if busy_message([event]) else "protocol_error"), str(message)[:300]
            await ws.send(json.dumps({"type": clear}))
            while True:
                message = await ws.recv()
                if isinstance(message, str) and json.loads(message).get("type") == cleared:
                    return "ok", None

        return await asyncio.wait_for(cleared_after_audio(), OP_TIMEOUT_S)


async def leave(url: str, protocol: str, tokens: list[str], token_s: float) -> tuple[str, str | None]:
    """Half the tokens, then the socket closed without a word: the server must drop the utterance."""
    ws_url = url.replace("http://", "ws://", 1)
    path = "/v1/audio/speech/live" if protocol == "live" else "/v1/speak?model=af_heart&encoding=linear16"
    async with connect(ws_url + path, max_size=None) as ws:
        for token in tokens[: len(tokens) // 2]:
            message = (
                {"type": "input_text.append", "text": token}
                if protocol == "live"
                else {"type": "Speak", "text": token}
            )
            await ws.send(json.dumps(message))
            await asyncio.sleep(token_s)
        if protocol == "deepgram":
            await ws.send(json.dumps({"type": "Flush"}))
        else:
            await ws.send(json.dumps({"type": "input_text.done"}))
        await asyncio.sleep(0.3)
    return "hung_up", None


async def live_client(soak: Soak, seed: int, protocols: list[str]) -> None:
    rng = random.Random(seed)
    turn = seed
    while soak.running():
        protocol = protocols[turn % len(protocols)]
        turn += 1
        soak.record(await speak(soak, protocol, rng))


# --- books, voices, bursts --------------------------------------------------------------------------------


def book_reference(soak: Soak, text: str) -> float | None:
    return soak.references[reference_key(BOOK_TEXT, "af_heart", 1.0, False)] if text == BOOK_TEXT else None


async def post_job(client: httpx.AsyncClient, op: Op, text: str) -> str | None:
    """A book job of `text`; its id, or None with `op` saying why not."""
    created = await client.post(
        "/v1/audio/jobs", json={"input": text, "voice": "af_heart", "response_format": "wav"}
    )
    if created.status_code != 202:
        op.status, op.detail = f"http:{created.status_code}", created.text[:300]
        return None
    return str(created.json()["id"])


async def finish_job(client: httpx.AsyncClient, op: Op, job_id: str, delete: bool = True) -> None:
    """Waits for the job's end; its audio measured into `op` (short against `op.reference_s`), and the job
    deleted (unless not `delete`)."""
    deadline = time.monotonic() + OP_TIMEOUT_S * 2
    while (job := (await client.get(f"/v1/audio/jobs/{job_id}")).json())["state"] in ("queued", "running"):
        if time.monotonic() > deadline:
            raise TimeoutError(f"job {job_id} still {job['state']}")
        await asyncio.sleep(1.0)
    if job["state"] != "done":
        op.status, op.detail = f"job:{job['state']}", json.dumps(job.get("error"))[:300]
    else:
        audio = await client.get(f"/v1/audio/jobs/{job_id}/audio")
        op.audio_s = measure_audio("wav", audio.content) if audio.status_code == 200 else None
        if audio.status_code != 200:
            op.status, op.detail = f"http:{audio.status_code}", audio.text[:300]
        elif short(op.audio_s, op.reference_s):
            op.status = "short"
    if delete:
        await client.delete(f"/v1/audio/jobs/{job_id}")


async def book_job(soak: Soak, client: httpx.AsyncClient, text: str = BOOK_TEXT) -> Op:
    op = Op("book", "wav", soak.now(), 0.0, "ok", reference_s=book_reference(soak, text))
    try:
        job_id = await post_job(client, op, text)
        if job_id is not None:
            await finish_job(client, op, job_id)
    except (httpx.HTTPError, TimeoutError, KeyError, ValueError) as exc:
        op.status, op.detail = f"error:{type(exc).__name__}", repr(exc)[:200]
    finally:
        op.end = soak.now()
    return op


async def voice_round(soak: Soak, client: httpx.AsyncClient, name: str) -> Op:
    """A mix saved under `name`, spoken with, and deleted."""
    op = Op("voice", "upload", soak.now(), 0.0, "ok")
    try:
        saved = await client.post("/v1/audio/voices", data={"name": name, "voice": "af_heart(1)+bf_emma(1)"})
        if saved.status_code != 201:
            op.status, op.detail = f"http:{saved.status_code}", saved.text[:300]
            return op
        spoken = await client.post(
            "/v1/audio/speech", json={"input": TEXTS[1], "voice": name, "response_format": "pcm"}
        )
        op.status, op.detail = answer_status(spoken, spoken.content)
        op.audio_s = len(spoken.content) / 48000 if spoken.status_code == 200 else None
        deleted = await client.delete(f"/v1/audio/voices/{name}")
        if deleted.status_code != 200 and op.status == "ok":
            op.status, op.detail = f"http:{deleted.status_code}", deleted.text[:300]
    except httpx.HTTPError as exc:
        op.status, op.detail = f"error:{type(exc).__name__}", repr(exc)[:200]
    finally:
        op.end = soak.now()
    return op


async def burst(soak: Soak, client: httpx.AsyncClient) -> list[Op]:
    async def one() -> Op:
        op = Op("burst", "whole:pcm", soak.now(), 0.0, "ok")
        try:
            response = await client.post(
                "/v1/audio/speech", json={"input": BURST_TEXT, "response_format": "pcm"}
            )
            op.status, op.detail = answer_status(response, response.content)
            op.audio_s = len(response.content) / 48000 if response.status_code == 200 else None
            if op.status == "ok" and not op.audio_s:
                op.status = "short"
        except httpx.HTTPError as exc:
            op.status, op.detail = f"error:{type(exc).__name__}", repr(exc)[:200]
        op.end = soak.now()
        return op

    return list(await asyncio.gather(*(one() for _ in range(soak.args.burst_size))))


async def every(soak: Soak, period_s: float, action: Any) -> None:
    """`action()` each `period_s` (one at a time) until the time is up."""
    index = 0
    await asyncio.sleep(min(period_s, 5.0))
    while soak.running():
        started = time.monotonic()
        result = await action(index)
        for op in result if isinstance(result, list) else [result]:
            soak.record(op)
        index += 1
        await asyncio.sleep(max(0.0, period_s - (time.monotonic() - started)))


# --- resources and faults ---------------------------------------------------------------------------------


def process_sample(pid: int) -> dict[str, int] | None:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        files = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None
    rss_kib = int(re.search(r"VmRSS:\s+(\d+)", status).group(1))  # type: ignore[union-attr]
    threads = int(re.search(r"Threads:\s+(\d+)", status).group(1))  # type: ignore[union-attr]
    return {"rss_mib": rss_kib // 1024, "threads": threads, "open_files": files}


def serving_pids(server_pid: int) -> list[int]:
    """The processes that serve: the workers, or the server itself when it runs a single one."""
    return worker_pids(server_pid) or [server_pid]


async def sampler(soak: Soak) -> None:
    while soak.running():
        if soak.server_pid is not None:
            for pid in serving_pids(soak.server_pid):
                if (sample := process_sample(pid)) is not None:
                    soak.samples.append({"t": round(soak.now(), 1), "pid": pid, **sample})
        await asyncio.sleep(soak.args.sample_s)


async def ready_again(
    client: httpx.AsyncClient, soak: Soak, gone: int, timeout_s: float = 300
) -> float | None:
    """Seconds from now until `gone` has left the workers and /ready answers 200 for all of them."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        pids = serving_pids(soak.server_pid) if soak.server_pid else []
        try:
            ready = (await client.get("/ready", timeout=5)).status_code == 200
        except httpx.HTTPError:
            ready = False
        if gone not in pids and ready:
            return round(time.monotonic() - started, 2)
        await asyncio.sleep(0.25)
    return None


async def fault(soak: Soak, client: httpx.AsyncClient, kind: str, at_s: float) -> None:
    await asyncio.sleep(max(0.0, at_s - soak.now()))
    if not soak.running():
        return
    start = soak.now()
    observed: dict[str, Any] = {"kind": kind, "at_s": round(start, 1)}
    try:
        if kind in ("kill", "stop"):
            observed.update(await worker_fault(soak, client, kind))
        elif kind == "voice":
            observed.update(await voice_fault(soak, client))
        elif kind == "disk":
            observed.update(await disk_fault(soak, client))
        elif kind == "postgres":
            observed.update(await postgres_fault(soak, client))
    except Exception as exc:  # a fault that could not be made is a finding, not a crash of the soak
        observed["failed"] = repr(exc)[:300]
    observed["window_s"] = [round(start, 1), round(soak.now() + soak.args.fault_grace_s, 1)]
    soak.faults.append(observed)


async def worker_fault(soak: Soak, client: httpx.AsyncClient, kind: str) -> dict[str, Any]:
    assert soak.server_pid is not None
    pids = worker_pids(soak.server_pid)
    if len(pids) < 2:
        return {"skipped": "needs --workers 2 or more"}
    victim = pids[0]
    t0 = soak.now()
    os.kill(victim, signal.SIGKILL if kind == "kill" else signal.SIGSTOP)
    back = await ready_again(client, soak, victim)
    if kind == "stop" and back is None:
        os.kill(victim, signal.SIGCONT)
    return {"worker": victim, "t0": round(t0, 2), "ready_again_s": back}


async def voice_fault(soak: Soak, client: httpx.AsyncClient) -> dict[str, Any]:
    """A saved voice's file corrupted, then removed, under the library; what speech with it answers."""
    folder = soak.args.voices_dir
    if folder is None:
        return {"skipped": "needs --voices-dir (the server's KOKORO_CUSTOM_VOICES_DIR)"}
    name = "af_soakfault"
    saved = await client.post("/v1/audio/voices", data={"name": name, "voice": "af_heart(1)+bf_emma(1)"})
    path = Path(folder) / f"{name}.pt"
    answers = {"saved": saved.status_code}
    body = {"input": TEXTS[1], "voice": name, "response_format": "pcm"}
    path.write_bytes(b"this is not a voice tensor" * 10)
    corrupted = await client.post("/v1/audio/speech", json=body)
    answers["corrupted"] = [
        corrupted.status_code,
        corrupted.text[:300] if corrupted.status_code != 200 else "",
    ]
    path.unlink(missing_ok=True)
    removed = await client.post("/v1/audio/speech", json=body)
    answers["removed"] = [removed.status_code, removed.text[:300] if removed.status_code != 200 else ""]
    answers["health"] = (await client.get("/health")).status_code
    answers["after"] = (await client.post("/v1/audio/speech", json={**body, "voice": "af_heart"})).status_code
    return answers


async def disk_fault(soak: Soak, client: httpx.AsyncClient) -> dict[str, Any]:
    """The data volume filled: a book job, a speech request; the space given back: another job."""
    folder = soak.args.data_dir
    if folder is None:
        return {"skipped": "needs --data-dir"}
    total = shutil.disk_usage(folder).total
    if total > soak.args.max_fill_mib * 2**20:
        return {"skipped": f"{folder} is {total // 2**20} MiB, over --max-fill-mib: not filling it"}
    filler = Path(folder) / "soak-filler"
    written = 0
    with filler.open("wb") as out:
        block = b"\0" * 2**20
        try:
            while True:
                out.write(block)
                out.flush()
                written += len(block)
        except OSError:
            pass
    observed: dict[str, Any] = {"filled_mib": written // 2**20, "free_b": shutil.disk_usage(folder).free}
    try:
        full = await book_job(soak, client, TEXTS[2])
        observed["job_when_full"] = [full.status, full.detail]
        upload = await client.post("/v1/audio/voices", data={"name": "af_soakfull", "voice": "af_heart"})
        observed["voice_upload_when_full"] = [upload.status_code, upload.text[:300]]
        speech = await client.post("/v1/audio/speech", json={"input": TEXTS[1], "response_format": "pcm"})
        observed["speech_when_full"] = speech.status_code
    finally:
        filler.unlink()
    after = await book_job(soak, client, TEXTS[2])
    observed["job_after"] = [after.status, after.detail]
    return observed


def units_made(metrics: str) -> dict[str, float]:
    """`kokoro_book_units_total` by outcome, over the workers."""
    found = re.findall(r'^kokoro_book_units_total\{outcome="(\w+)"\} (\S+)$', metrics, flags=re.MULTILINE)
    return {outcome: float(value) for outcome, value in found}


async def postgres_fault(soak: Soak, client: httpx.AsyncClient) -> dict[str, Any]:
    """PostgreSQL stopped under a book job the workers are making, and started again: what the jobs'
    routes and speech answer while it is away, and whether the job then ends whole, with every unit made
    and none of the work thrown away."""
    cluster, database = soak.args.cluster, soak.args.jobs_database
    if cluster is None:
        return {"skipped": "needs --postgres (and --start)"}
    units_before = units_made((await client.get("/metrics")).text)
    op = Op("book", "postgres_fault", soak.now(), 0.0, "ok")
    job_id = await post_job(client, op, FAULT_BOOK_TEXT)
    if job_id is None:
        return {"failed": f"no job: {op.status} {op.detail}"}
    deadline = time.monotonic() + OP_TIMEOUT_S
    while True:  # some of it made
        job = (await client.get(f"/v1/audio/jobs/{job_id}")).json()
        if job["progress"]["chunks_done"] >= 1 or job["state"] not in ("queued", "running"):
            break
        if time.monotonic() > deadline:
            return {"failed": f"job {job_id} made nothing in {OP_TIMEOUT_S} s"}
        await asyncio.sleep(0.2)
    observed: dict[str, Any] = {
        "job": job_id,
        "chunks_at_stop": [job["progress"]["chunks_done"], job["progress"]["chunks_total"]],
    }
    await asyncio.to_thread(cluster.stop)
    stopped = time.monotonic()
    await asyncio.sleep(soak.args.postgres_outage_s)
    asked = time.monotonic()
    status = await client.get(f"/v1/audio/jobs/{job_id}")
    observed["status_when_down"] = [
        status.status_code,
        status.headers.get("retry-after"),
        round(time.monotonic() - asked, 2),
    ]
    speech = await client.post("/v1/audio/speech", json={"input": TEXTS[1], "response_format": "pcm"})
    observed["speech_when_down"] = speech.status_code
    await asyncio.to_thread(cluster.start)
    restarted = time.monotonic()
    observed["outage_s"] = round(restarted - stopped, 1)
    while (await client.get(f"/v1/audio/jobs/{job_id}")).status_code != 200:
        if time.monotonic() - restarted > 120:
            return {**observed, "failed": "the jobs' routes did not answer again within 120 s"}
        await asyncio.sleep(0.2)
    observed["answered_again_s"] = round(time.monotonic() - restarted, 1)
    try:
        await finish_job(client, op, job_id, delete=False)
    except (httpx.HTTPError, TimeoutError, KeyError, ValueError) as exc:
        op.status, op.detail = f"error:{type(exc).__name__}", repr(exc)[:200]
    observed["done_after_restart_s"] = round(time.monotonic() - restarted, 1)
    with psycopg.connect(database, autocommit=True) as db:
        row = db.execute(
            "SELECT COUNT(*), SUM(1 - done), SUM(samples) FROM units WHERE job_id = %s", (job_id,)
        ).fetchone()
    await client.delete(f"/v1/audio/jobs/{job_id}")
    units, undone, samples = (int(value or 0) for value in row) if row else (0, None, 0)
    # The file holds every unit's audio once: as long as the units' samples, less a codec's padding.
    made_s = samples / 24000
    if op.status == "ok" and abs((op.audio_s or 0) - made_s) > PADDING_S:
        op.status, op.detail = "short", f"{op.audio_s} s of audio for {made_s:.2f} s of units"
    units_after = units_made((await client.get("/metrics")).text)
    observed.update(
        job=[op.status, op.detail],
        audio_s=op.audio_s,
        units_audio_s=round(made_s, 2),
        units=units,
        units_not_made=undone,
        units_kept=units_after.get("kept", 0) - units_before.get("kept", 0),
        units_not_kept=units_after.get("not_kept", 0) - units_before.get("not_kept", 0),
    )
    return observed


# --- the run ----------------------------------------------------------------------------------------------


async def soak_run(args: argparse.Namespace, pid: int | None) -> dict[str, Any]:
    limits = httpx.Limits(max_connections=args.clients + args.burst_size + 8)
    async with httpx.AsyncClient(base_url=args.url, timeout=OP_TIMEOUT_S, limits=limits) as client:
        refs = await references(client)
        soak = Soak(args, pid, refs)
        protocols = [p for p in args.protocols if p != "wyoming" or args.wyoming_port]
        tasks = [http_client(soak, client, args.seed + index) for index in range(args.clients)]
        tasks += [live_client(soak, args.seed + index, protocols) for index in range(args.live_clients)]
        if args.book_every_s:
            tasks.append(every(soak, args.book_every_s, lambda _: book_job(soak, client)))
        if args.voice_every_s:
            tasks.append(every(soak, args.voice_every_s, lambda i: voice_round(soak, client, f"af_soak{i}")))
        if args.burst_every_s:
            tasks.append(every(soak, args.burst_every_s, lambda _: burst(soak, client)))
        tasks.append(sampler(soak))
        tasks += [fault(soak, client, kind, at) for kind, at in args.fault]
        await asyncio.gather(*tasks)
        wall = soak.now()
        await asyncio.sleep(args.settle_s)
        after = gauges((await client.get("/metrics")).text)
    # After the client's pooled connections have closed: what each worker holds with nothing going on.
    await asyncio.sleep(args.settle_s)
    final = {}
    if pid is not None:
        for worker in serving_pids(pid):
            if (sample := process_sample(worker)) is not None:
                final[str(worker)] = sample
    return {
        "wall_s": round(wall, 1),
        "references": len(refs),
        "ops": [asdict(op) for op in soak.ops],
        "samples": soak.samples,
        "final": final,
        "faults": soak.faults,
        "gauges": after,
    }


def gauges(metrics: str) -> dict[str, float]:
    names = ("kokoro_requests_in_flight", "kokoro_requests_waiting", "kokoro_engine_queue_depth")
    found = dict(re.findall(rf"^({'|'.join(names)}) (\S+)$", metrics, flags=re.MULTILINE))
    return {name: float(value) for name, value in found.items()}


# --- what it shows ----------------------------------------------------------------------------------------


GOOD = {"ok", "refused", "hung_up"}


def in_window(op: dict[str, Any], faults: list[dict[str, Any]]) -> bool:
    return any(f["window_s"][0] - 1 <= op["end"] and op["start"] <= f["window_s"][1] for f in faults)


def p95(values: list[float]) -> float | None:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))], 3) if ordered else None


def analyse(result: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    ops, faults = result["ops"], result["faults"]
    tally = Counter(f"{op['kind']}:{op['status']}" for op in ops)
    bad = [op for op in ops if op["status"] not in GOOD and not in_window(op, faults)]
    in_fault = Counter(f"{op['kind']}:{op['status']}" for op in ops if in_window(op, faults))
    window = args.window_s
    firsts = [
        (op["start"], op["first_audio_s"])
        for op in ops
        if op["kind"] == "http"
        and op["mode"].startswith("read")
        and op["first_audio_s"]
        and not in_window(op, faults)
    ]
    windows = []
    for begin in range(0, int(result["wall_s"]), int(window)):
        values = [value for start, value in firsts if begin <= start < begin + window]
        if values:
            windows.append(
                {
                    "from_s": begin,
                    "n": len(values),
                    "p50_s": round(statistics.median(values), 3),
                    "p95_s": p95(values),
                }
            )
    for observed in faults:
        if "t0" in observed:
            observed.update(worker_fault_effects(ops, observed))
    audio = [op for op in ops if op["status"] == "ok" and op["audio_s"] and op["reference_s"]]
    memory = worker_memory(result["samples"], args.warmup_s, result["final"])
    return {
        "operations": len(ops),
        "tally": dict(sorted(tally.items())),
        "bad_outside_faults": bad[:50],
        "bad_outside_faults_count": len(bad),
        "in_fault_windows": dict(in_fault),
        "http_first_audio_windows": windows,
        "audio_ratio_min": round(min((op["audio_s"] / op["reference_s"] for op in audio), default=0), 3),
        "audio_seconds_served": round(sum(op["audio_s"] or 0 for op in ops if op["status"] == "ok"), 1),
        "memory": memory,
    }


def worker_fault_effects(ops: list[dict[str, Any]], observed: dict[str, Any]) -> dict[str, Any]:
    """What a worker's kill or stop did: the operations in flight at it that failed (and how), those
    started in its window that failed, and the longest time without an operation ending well, in its
    window against the two minutes before."""
    t0, end = observed["t0"], observed["window_s"][1]
    across = [op for op in ops if op["start"] < t0 <= op["end"]]
    failed = Counter(f"{op['kind']}:{op['status']}" for op in across if op["status"] not in GOOD)
    later = Counter(
        f"{op['kind']}:{op['status']}" for op in ops if t0 < op["start"] <= end and op["status"] not in GOOD
    )

    def longest_gap(begin: float, stop: float) -> float:
        ends = sorted(op["end"] for op in ops if op["status"] == "ok" and begin <= op["end"] <= stop)
        marks = [begin, *ends, stop]
        return round(max(b - a for a, b in zip(marks, marks[1:], strict=False)), 2)

    return {
        "in_flight": len(across),
        "in_flight_failed": dict(failed),
        "started_in_window_failed": dict(later),
        "longest_gap_s": longest_gap(t0, end),
        "longest_gap_before_s": longest_gap(max(0.0, t0 - 120), t0),
    }


def worker_memory(
    samples: list[dict[str, Any]], warmup_s: float, final: dict[str, dict[str, int]]
) -> dict[str, Any]:
    """Per process: its RSS at the end of its warm-up, at the end and at its highest after the warm-up (and
    the growth to that), and its threads and open files at their highest in the first half after the
    warm-up and once the load has ended (`final`; a process gone by then shows its last sample)."""
    by_pid: dict[int, list[dict[str, Any]]] = {}
    for sample in samples:
        by_pid.setdefault(sample["pid"], []).append(sample)
    first_round = min((sample["t"] for sample in samples), default=0.0)
    found = {}
    for pid, series in by_pid.items():
        begin = series[0]["t"] + warmup_s
        after = [s for s in series if s["t"] >= begin]
        if len(after) < 3:
            continue
        base, last = after[0], final.get(str(pid))
        # Pools start threads as they are needed, up to their bound: a leak goes on past the first
        # half's highest count, a pool does not.
        first_half = after[: max(1, len(after) // 2)]
        found[str(pid)] = {
            "from_s": base["t"],
            "to_s": after[-1]["t"],
            "rss_mib": [base["rss_mib"], after[-1]["rss_mib"], max(s["rss_mib"] for s in after)],
            "rss_growth": round(max(s["rss_mib"] for s in after) / base["rss_mib"] - 1, 4),
            "ended": last is None,  # killed in a fault, or replaced: no count once the load had gone
            # Started by a fault (a worker replaced): its warm-up ran under the whole load, so its growth
            # is shown, and the check is on the workers there from the start.
            "replacement": series[0]["t"] > first_round + 1.0,
            "threads": [max(s["threads"] for s in first_half), (last or after[-1])["threads"]],
            "open_files": [max(s["open_files"] for s in first_half), (last or after[-1])["open_files"]],
        }
    return found


def checks(result: dict[str, Any], shown: dict[str, Any], args: argparse.Namespace) -> dict[str, bool]:
    memory = shown["memory"].values()
    windows = shown["http_first_audio_windows"]
    verdict = {
        "no_bad_answer_outside_faults": shown["bad_outside_faults_count"] == 0,
        "gauges_back_to_zero": all(value == 0 for value in result["gauges"].values()),
        "memory_measured": bool(shown["memory"]) or result["final"] == {},
        "rss_growth_within": all(m["rss_growth"] <= args.rss_growth for m in memory if not m["replacement"]),
        "threads_back": all(
            m["threads"][1] <= m["threads"][0] + args.thread_slack for m in memory if not m["ended"]
        ),
        "open_files_back": all(
            m["open_files"][1] <= m["open_files"][0] + 4 for m in memory if not m["ended"]
        ),
    }
    if len(windows) >= 2:
        verdict["first_audio_p95_stable"] = windows[-1]["p95_s"] <= windows[0]["p95_s"] * (1 + args.p95_drift)
    for observed in result["faults"]:
        verdict[f"fault_{observed['kind']}_made"] = "failed" not in observed and "skipped" not in observed
        if observed["kind"] == "postgres" and "job" in observed:
            verdict["fault_postgres_refused_cleanly"] = (
                observed["status_when_down"][0] == 503
                and bool(observed["status_when_down"][1])
                and observed["speech_when_down"] == 200
            )
            verdict["fault_postgres_nothing_lost"] = (
                observed["job"][0] == "ok"
                and observed["units_not_made"] == 0
                and observed["units_not_kept"] == 0
            )
    return verdict


FAULTS = ("kill", "stop", "voice", "disk", "postgres")


def fault_spec(text: str) -> tuple[str, float]:
    kind, _, at = text.partition("@")
    if kind not in FAULTS or not at:
        raise argparse.ArgumentTypeError(
            f"want KIND@SECONDS with KIND one of {', '.join(FAULTS)}, got {text!r}"
        )
    return kind, float(at)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", default=None, help="a running server (else --start)")
    parser.add_argument(
        "--pid", type=int, default=None, help="the running server's process, for its resources"
    )
    parser.add_argument("--start", choices=("tone", "api"), default=None, help="start a server of this kind")
    parser.add_argument("--workers", type=positive_int, default=1, help="--start's workers")
    parser.add_argument("--weights", type=Path, default=None, help="KOKORO_WEIGHTS_DIR for --start")
    parser.add_argument("--duration-s", type=positive_float, default=300.0)
    parser.add_argument(
        "--requests", type=positive_int, default=None, help="stop the HTTP clients after this many"
    )
    parser.add_argument("--clients", type=int, default=6, help="HTTP speech clients")
    parser.add_argument("--live-clients", type=int, default=3, help="clients of the live protocols")
    parser.add_argument("--protocols", nargs="+", choices=PROTOCOLS, default=list(PROTOCOLS))
    parser.add_argument("--token-s", type=float, default=0.02, help="seconds between a live client's tokens")
    parser.add_argument("--book-every-s", type=float, default=60.0, help="a book job this often (0: none)")
    parser.add_argument(
        "--voice-every-s", type=float, default=45.0, help="a voice upload this often (0: none)"
    )
    parser.add_argument("--burst-every-s", type=float, default=90.0, help="a burst this often (0: none)")
    parser.add_argument("--burst-size", type=positive_int, default=30)
    parser.add_argument("--fault", type=fault_spec, action="append", default=[], metavar="KIND@SECONDS")
    parser.add_argument("--fault-grace-s", type=float, default=15.0, help="a fault's window after recovery")
    parser.add_argument("--data-dir", type=Path, default=None, help="the server's KOKORO_DATA_DIR")
    parser.add_argument("--voices-dir", type=Path, default=None, help="the server's KOKORO_CUSTOM_VOICES_DIR")
    parser.add_argument(
        "--max-fill-mib", type=int, default=1024, help="the disk fault fills no larger volume"
    )
    parser.add_argument(
        "--postgres",
        action="store_true",
        help="--start's jobs in a throwaway PostgreSQL (scripts/postgres.py), for the postgres fault",
    )
    parser.add_argument("--postgres-outage-s", type=positive_float, default=8.0, help="the postgres fault's")
    parser.add_argument("--sample-s", type=positive_float, default=10.0)
    parser.add_argument("--warmup-s", type=float, default=60.0, help="memory is compared from this on")
    parser.add_argument("--window-s", type=positive_float, default=600.0, help="first-audio p95 windows")
    parser.add_argument(
        "--p95-drift", type=float, default=0.25, help="allowed p95 rise, first to last window"
    )
    parser.add_argument("--rss-growth", type=float, default=0.05, help="allowed RSS growth after the warm-up")
    parser.add_argument(
        "--thread-slack", type=int, default=2, help="threads a worker may end with over its first half's peak"
    )
    parser.add_argument("--settle-s", type=float, default=3.0)
    parser.add_argument("--seed", type=int, default=0)


def prepare(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.url is None and args.start is None:
        parser.error("give --url (and --pid) or --start")
    if args.postgres and args.start is None:
        parser.error("--postgres needs --start")
    args.wyoming_port = None
    args.cluster = args.jobs_database = None


def start_server(args: argparse.Namespace, folder: Path) -> Server:
    """`--start`'s server, ready, with its data and voices in `folder` (unless given), Wyoming on, and its
    jobs in `args.jobs_database` where there is one."""
    args.data_dir = args.data_dir or folder / "data"
    args.voices_dir = args.voices_dir or folder / "voices"
    args.wyoming_port = free_port()
    jobs = {"KOKORO_JOBS_DATABASE": args.jobs_database} if args.jobs_database else {}
    env = process_env(
        args.weights,
        KOKORO_DATA_DIR=str(args.data_dir),
        KOKORO_CUSTOM_VOICES_DIR=str(args.voices_dir),
        KOKORO_WYOMING="true",
        KOKORO_WYOMING_PORT=str(args.wyoming_port),
        **jobs,
    )
    module = "tests.tone_server" if args.start == "tone" else "api"
    return started(launch(env, folder / "server.log", module, args.workers))


def run(args: argparse.Namespace) -> int:
    report = Report(args)
    with contextlib.ExitStack() as stack:
        if args.postgres:
            args.cluster = stack.enter_context(postgres.server())
            args.jobs_database = postgres.database(args.cluster.url)
        if args.start:
            folder = Path(tempfile.mkdtemp(prefix="kokoro-soak-"))
            server = start_server(args, folder)
            stack.callback(stop_server, server)
            args.url, args.pid = server.url, server.process.pid
            print(f"soak: server log {server.log_path}", flush=True)
        result = asyncio.run(soak_run(args, args.pid))
    shown = analyse(result, args)
    verdict = checks(result, shown, args)
    report.write(
        {
            **{k: v for k, v in result.items() if k != "ops"},
            "shown": shown,
            "checks": verdict,
            "ops": result["ops"],
        }
    )
    print(json.dumps({"tally": shown["tally"], "faults": result["faults"], "checks": verdict}, indent=1))
    return 0 if all(verdict.values()) else 1
