"""Live text (/v1/audio/speech/live): how soon a phrase is heard once an LLM has written it, against
sending the whole answer to /v1/audio/speech after the LLM finished; and how fast a barge-in stops.

Starts the real server once (or uses --url). At each client count (1 and 4 by default), each client, all at
once, --rounds times:

- live: types TEXT into the socket in LLM-sized tokens (a word's first 4 characters with the space before
  it, then the rest 4 at a time), --token-ms apart, and records the time from the append that completes
  the first phrase (the server's splitter rules run on the same tokens say which one) to the first audio
  byte, and from the first token to it (what a user waits for);
- whole: waits as long as the LLM takes to write TEXT, then POSTs it to /v1/audio/speech (pcm, streamed):
  the time from the first token to the first audio byte, and from the POST.

With --also deepgram elevenlabs cartesia wyoming, each client of a round also types the same tokens into
Deepgram's `/v1/speak` socket (Speak per token, Flush at the end: what the voice-agent frameworks' Deepgram
plugins send, docs/api.md#voice-agents), ElevenLabs' multi-stream-input socket (a text per token in one
context, then flush and close_context), Cartesia's socket (a transcript per token with continue, then
continue false) and Home Assistant's Wyoming protocol (a synthesize-chunk per token between
synthesize-start and -stop), timed the same way to their first audio.

Barge-in, one client alone: types a long text at once, waits for the first audio, sends input_text.clear,
and records the time from the clear to the last audio byte that arrives before input_text.cleared, and
the engine's queue depth from /metrics right after. JSON out.

    python -m scripts.bench live --weights DIR --out bench-results/<machine>/live.json
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import re
import tempfile
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed
from wyoming.audio import AudioChunk
from wyoming.client import AsyncTcpClient
from wyoming.tts import SynthesizeChunk, SynthesizeStart, SynthesizeStop, SynthesizeVoice

from api.settings import Settings
from api.text.live_split import PhraseSplitter, SplitRules
from scripts.bench.common import ENGINES, Report, add_weights, positive_int, summary
from scripts.harness import Server, free_port, launch, process_env, serving

TEXT = (
    "Sure, here is a quick summary of the plan. We leave at nine in the morning and drive north along "
    "the coast, stopping for lunch in a small harbour town. After that, the road climbs into the hills, "
    "where the views are wonderful. We should reach the cabin before dark."
)
LONG_TEXT = " ".join([TEXT] * 4)
TOKEN_CHARS = 4
TORCH_THREADS = "2"  # the server's, as every live figure so far was measured


def llm_tokens(text: str) -> list[str]:
    """`text` cut as an LLM streams it: each word with the space before it, at most 4 characters a token."""
    tokens = []
    for word in re.findall(r"\s*\S+", text):
        tokens += [word[i : i + TOKEN_CHARS] for i in range(0, len(word), TOKEN_CHARS)]
    return tokens


def first_phrase(tokens: Sequence[str], rules: SplitRules) -> tuple[int, str]:
    """The index of the token whose append completes the first phrase, and that phrase."""
    splitter = PhraseSplitter(rules)
    for index, token in enumerate(tokens):
        if phrases := splitter.append(token):
            return index, phrases[0]
    return len(tokens) - 1, splitter.pending  # only input_text.done completes it


def server_rules() -> SplitRules:
    fields = Settings.model_fields
    return SplitRules(fields["live_clause_words"].default, fields["live_max_words"].default)


def refused(error: Any) -> bool:
    """A busy answer (admission's, or the live sessions' bound) to an utterance."""
    text = json.dumps(error, default=str).lower()
    return "overloaded" in text or "sessions are open" in text


def ws_url(url: str) -> str:
    return url.replace("http://", "ws://", 1) + "/v1/audio/speech/live"


@dataclass
class Heard:
    """What one live utterance gave back: its deltas' arrival times and audio, and what was sent when."""

    sent: dict[str, float] = field(default_factory=dict)
    arrivals: list[float] = field(default_factory=list)
    audio: bytearray = field(default_factory=bytearray)
    timestamps: list[dict[str, Any]] = field(default_factory=list)
    done: dict[str, Any] | None = None
    errors: list[dict[str, Any]] = field(default_factory=list)


async def feed(
    ws: Any,
    heard: Heard,
    tokens: Sequence[str],
    token_s: float,
    mark: int | None,
    message: Callable[[str], dict[str, Any]],
    ending: Sequence[dict[str, Any]],
) -> None:
    """Sends `message(token)` per token `token_s` apart, then `ending`; records the send times in `heard`:
    the first token's, token `mark`'s and the ending's (perf_counter)."""
    for index, token in enumerate(tokens):
        await ws.send(json.dumps(message(token)))
        now = time.perf_counter()
        heard.sent.setdefault("first", now)
        if index == mark:
            heard.sent["mark"] = now
        await asyncio.sleep(token_s)
    for last in ending:
        await ws.send(json.dumps(last))
    heard.sent["done"] = time.perf_counter()


def feeding_task(feeding: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
    """`feeding` as a task whose failure is retrieved when it ends: where the server closes the socket
    while text is still going (a refusal, a worker gone), the reading side says what happened, and asyncio
    no longer logs "Task exception was never retrieved" for the sending side."""
    task = asyncio.create_task(feeding)
    task.add_done_callback(lambda done: done.cancelled() or done.exception())
    return task


async def fed(feeding: asyncio.Task[None], heard: Heard) -> None:
    """The feeding task, once the answer has been read: awaited, or cancelled where the utterance was
    refused (the server may have closed the connection then, and the rest of the text has nowhere to go)."""
    if not (heard.errors and refused(heard.errors[-1])):
        await feeding
        return
    feeding.cancel()
    with contextlib.suppress(asyncio.CancelledError, ConnectionError, ConnectionClosed):
        await feeding


async def speak_live(
    url: str,
    tokens: Sequence[str],
    token_s: float,
    *,
    session: dict[str, Any] | None = None,
    mark: int | None = None,
) -> Heard:
    """One utterance: `tokens` appended `token_s` apart, then input_text.done; `sent["first"]`,
    `sent["mark"]` (the append of token `mark`) and `sent["done"]` are the send times (perf_counter)."""
    heard = Heard()
    async with connect(ws_url(url), max_size=None) as ws:
        if session:
            await ws.send(json.dumps({"type": "session.update", "session": session}))
            reply = json.loads(await ws.recv())
            if reply["type"] != "session.updated":
                raise RuntimeError(f"session.update refused: {reply}")

        append = {"type": "input_text.append"}
        done = [{"type": "input_text.done"}]
        feeding = feeding_task(
            feed(ws, heard, tokens, token_s, mark, lambda token: {**append, "text": token}, done)
        )
        async for message in ws:
            event = json.loads(message)
            if event["type"] == "speech.audio.delta":
                heard.arrivals.append(time.perf_counter())
                heard.audio += base64.b64decode(event["audio"])
                heard.timestamps += event.get("timestamps") or []
            elif event["type"] == "error":
                heard.errors.append(event["error"])
                if refused(heard.errors[-1]):
                    break  # the utterance is not spoken: no end of it comes
            elif event["type"] == "speech.audio.done":
                heard.done = event
                break
        await fed(feeding, heard)
    return heard


async def speak_deepgram(
    url: str, tokens: Sequence[str], token_s: float, *, mark: int | None = None
) -> Heard:
    """One utterance over Deepgram's socket: a Speak per token, then Flush; audio until Flushed."""
    heard = Heard()
    query = "model=af_heart&encoding=linear16&sample_rate=24000"
    async with connect(url.replace("http://", "ws://", 1) + f"/v1/speak?{query}", max_size=None) as ws:
        speak = {"type": "Speak"}
        flush = [{"type": "Flush"}]
        feeding = feeding_task(
            feed(ws, heard, tokens, token_s, mark, lambda token: {**speak, "text": token}, flush)
        )
        async for message in ws:
            if isinstance(message, bytes):
                heard.arrivals.append(time.perf_counter())
                heard.audio += message
                continue
            event = json.loads(message)
            if event["type"] in ("Warning", "Error"):
                heard.errors.append(event)
                if refused(heard.errors[-1]):
                    break  # the utterance is not spoken: no end of it comes
            elif event["type"] == "Flushed":
                heard.done = event
                break
        await fed(feeding, heard)
    return heard


async def speak_elevenlabs(
    url: str, tokens: Sequence[str], token_s: float, *, mark: int | None = None
) -> Heard:
    """One context on ElevenLabs' multi-stream socket: a text per token, flush, close; audio to isFinal."""
    heard = Heard()
    path = "/v1/text-to-speech/af_heart/multi-stream-input?output_format=pcm_24000"
    async with connect(url.replace("http://", "ws://", 1) + path, max_size=None) as ws:
        await ws.send(json.dumps({"text": " ", "context_id": "bench"}))
        end = [
            {"text": "", "context_id": "bench", "flush": True},
            {"context_id": "bench", "close_context": True},
        ]
        feeding = feeding_task(
            feed(ws, heard, tokens, token_s, mark, lambda token: {"text": token, "context_id": "bench"}, end)
        )
        async for message in ws:
            event = json.loads(message)
            if event.get("error"):
                heard.errors.append(event)
                if refused(heard.errors[-1]):
                    break  # the utterance is not spoken: no end of it comes
            if event.get("audio"):
                heard.arrivals.append(time.perf_counter())
                heard.audio += base64.b64decode(event["audio"])
            if event.get("isFinal"):
                heard.done = event
                break
        await fed(feeding, heard)
    return heard


async def speak_cartesia(
    url: str, tokens: Sequence[str], token_s: float, *, mark: int | None = None
) -> Heard:
    """One context on Cartesia's socket: a transcript per token with continue, then continue false."""
    heard = Heard()
    context = {
        "context_id": "bench",
        "voice": {"mode": "id", "id": "af_heart"},
        "output_format": {"container": "raw", "encoding": "pcm_s16le", "sample_rate": 24000},
    }
    async with connect(url.replace("http://", "ws://", 1) + "/tts/websocket", max_size=None) as ws:
        end = [{**context, "transcript": "", "continue": False}]
        feeding = feeding_task(
            feed(
                ws,
                heard,
                tokens,
                token_s,
                mark,
                lambda token: {**context, "transcript": token, "continue": True},
                end,
            )
        )
        async for message in ws:
            event = json.loads(message)
            if event["type"] == "error":
                heard.errors.append(event)
                if refused(heard.errors[-1]):
                    break  # the utterance is not spoken: no end of it comes
            elif event["type"] == "chunk":
                heard.arrivals.append(time.perf_counter())
                heard.audio += base64.b64decode(event["data"])
            elif event["type"] == "done":
                heard.done = event
                break
        await fed(feeding, heard)
    return heard


async def speak_wyoming(
    port: int, tokens: Sequence[str], token_s: float, *, mark: int | None = None
) -> Heard:
    """One stream over Home Assistant's Wyoming protocol: synthesize-start, a synthesize-chunk per token,
    synthesize-stop; audio until synthesize-stopped."""
    heard = Heard()
    async with AsyncTcpClient("127.0.0.1", port) as client:
        await client.write_event(SynthesizeStart(voice=SynthesizeVoice(name="af_heart")).event())

        async def send() -> None:
            for index, token in enumerate(tokens):
                await client.write_event(SynthesizeChunk(text=token).event())
                now = time.perf_counter()
                heard.sent.setdefault("first", now)
                if index == mark:
                    heard.sent["mark"] = now
                await asyncio.sleep(token_s)
            await client.write_event(SynthesizeStop().event())
            heard.sent["done"] = time.perf_counter()

        feeding = feeding_task(send())
        while (event := await client.read_event()) is not None:
            if event.type == "audio-chunk":
                heard.arrivals.append(time.perf_counter())
                heard.audio += AudioChunk.from_event(event).audio
            elif event.type == "error":
                heard.errors.append(event.data)
                if refused(heard.errors[-1]):
                    break  # the utterance is not spoken: no end of it comes
            elif event.type == "synthesize-stopped":
                heard.done = event.data
                break
        await fed(feeding, heard)
    return heard


async def live_client(
    url: str, token_s: float, protocol: str = "live", wyoming_port: int | None = None
) -> dict[str, float]:
    tokens = llm_tokens(TEXT)
    mark = first_phrase(tokens, server_rules())[0]
    if protocol == "deepgram":
        heard = await speak_deepgram(url, tokens, token_s, mark=mark)
    elif protocol == "elevenlabs":
        heard = await speak_elevenlabs(url, tokens, token_s, mark=mark)
    elif protocol == "cartesia":
        heard = await speak_cartesia(url, tokens, token_s, mark=mark)
    elif protocol == "wyoming":
        assert wyoming_port is not None
        heard = await speak_wyoming(wyoming_port, tokens, token_s, mark=mark)
    else:
        heard = await speak_live(url, tokens, token_s, mark=mark)
    if heard.errors or not heard.arrivals:
        raise RuntimeError(f"live utterance failed: {heard.errors}")
    first = heard.arrivals[0]
    return {
        "phrase_to_audio_s": first - heard.sent["mark"],
        "first_token_to_audio_s": first - heard.sent["first"],
        "audio_s": len(heard.audio) / 48000,
    }


async def whole_client(url: str, token_s: float, client: httpx.AsyncClient) -> dict[str, float]:
    """The same answer spoken the usual way: the LLM finishes first, then one streamed request."""
    started = time.perf_counter()
    await asyncio.sleep(len(llm_tokens(TEXT)) * token_s)  # the LLM writes the whole answer
    posted = time.perf_counter()
    body = {"input": TEXT, "voice": "af_heart", "response_format": "pcm", "stream": True}
    async with client.stream("POST", f"{url}/v1/audio/speech", json=body, timeout=300) as response:
        response.raise_for_status()
        first = None
        async for data in response.aiter_bytes():  # read to the end, as a player would
            if data and first is None:
                first = time.perf_counter()
    if first is None:
        raise RuntimeError("no audio")
    return {"first_token_to_audio_s": first - started, "request_to_audio_s": first - posted}


async def round_of(
    url: str,
    clients: int,
    token_s: float,
    protocols: Sequence[str] = ("live",),
    wyoming_port: int | None = None,
) -> dict[str, list[dict[str, float]]]:
    runs: dict[str, list[dict[str, float]]] = {}
    for protocol in protocols:
        runs[protocol] = list(
            await asyncio.gather(*(live_client(url, token_s, protocol, wyoming_port) for _ in range(clients)))
        )
    async with httpx.AsyncClient() as http:
        runs["whole"] = list(
            await asyncio.gather(*(whole_client(url, token_s, http) for _ in range(clients)))
        )
    return runs


async def measure_clients(
    url: str,
    clients: int,
    rounds: int,
    token_s: float,
    protocols: Sequence[str] = ("live",),
    wyoming_port: int | None = None,
) -> dict[str, Any]:
    runs = [await round_of(url, clients, token_s, protocols, wyoming_port) for _ in range(rounds)]
    whole = [sample for run in runs for sample in run["whole"]]
    result: dict[str, Any] = {"clients": clients}
    for protocol in protocols:
        samples = [sample for run in runs for sample in run[protocol]]
        result[f"{protocol}_phrase_to_audio"] = summary([s["phrase_to_audio_s"] for s in samples])
        result[f"{protocol}_first_token_to_audio"] = summary([s["first_token_to_audio_s"] for s in samples])
    result["whole_first_token_to_audio"] = summary([s["first_token_to_audio_s"] for s in whole])
    result["whole_request_to_audio"] = summary([s["request_to_audio_s"] for s in whole])
    result["runs"] = runs
    return result


def queue_depth(url: str) -> float:
    metrics = httpx.get(f"{url}/metrics", timeout=10).text
    found = re.search(r"^kokoro_engine_queue_depth (\S+)$", metrics, flags=re.MULTILINE)
    return float(found.group(1)) if found else float("nan")


async def barge_in(url: str) -> dict[str, Any]:
    """Long text at once, the first audio, then a clear: how long audio goes on arriving after it."""
    async with connect(ws_url(url), max_size=None) as ws:
        await ws.send(json.dumps({"type": "input_text.append", "text": LONG_TEXT + " And"}))
        while json.loads(await ws.recv())["type"] != "speech.audio.delta":
            pass
        await asyncio.sleep(0.3)  # mid-utterance, with chunks queued and one in synthesis
        depth_before = queue_depth(url)
        cleared = time.perf_counter()
        await ws.send(json.dumps({"type": "input_text.clear"}))
        last_audio, late = cleared, 0
        while (event := json.loads(await ws.recv()))["type"] != "input_text.cleared":
            if event["type"] == "speech.audio.delta":
                last_audio, late = time.perf_counter(), late + 1
        acknowledged = time.perf_counter()
        depth_after = queue_depth(url)
    return {
        "clear_to_last_audio_s": round(last_audio - cleared, 4),
        "clear_to_cleared_event_s": round(acknowledged - cleared, 4),
        "deltas_after_clear": late,
        "queue_depth_before_clear": depth_before,
        "queue_depth_after_clear": depth_after,
    }


def start(weights: Path, engine: str, log_dir: Path, wyoming_port: int | None = None) -> Server:
    env = process_env(weights, KOKORO_TORCH_THREADS=TORCH_THREADS, KOKORO_ENGINE=engine)
    if wyoming_port is not None:
        env.update(KOKORO_WYOMING="true", KOKORO_WYOMING_PORT=str(wyoming_port))
    return launch(env, log_dir / "server.log")


async def measure(url: str, args: argparse.Namespace) -> dict[str, Any]:
    token_s = args.token_ms / 1000
    await live_client(url, token_s)  # warm-up: the first synthesis and G2P of each kind
    protocols = ["live", *args.also]
    for protocol in args.also:
        await live_client(url, token_s, protocol, args.wyoming_port)
    levels = [
        await measure_clients(url, clients, args.runs, token_s, protocols, args.wyoming_port)
        for clients in args.clients
    ]
    barge = [await barge_in(url) for _ in range(args.barge_ins)]
    return {"levels": levels, "barge_in": barge}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_weights(parser)
    parser.add_argument("--url", help="a running server instead of starting one")
    parser.add_argument("--engine", default="torch", choices=ENGINES)
    parser.add_argument("--clients", nargs="+", type=positive_int, default=[1, 4])
    parser.add_argument("--runs", type=positive_int, default=3, help="rounds of every client at each level")
    parser.add_argument("--token-ms", type=float, default=30.0)
    parser.add_argument("--barge-ins", type=int, default=3)
    parser.add_argument(
        "--also", nargs="*", default=[], choices=["deepgram", "elevenlabs", "cartesia", "wyoming"],
        help="protocols beside live",
    )  # fmt: skip
    parser.add_argument(
        "--wyoming-port", type=int, help="with --url and --also wyoming: the running server's Wyoming port"
    )


def prepare(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.url and "wyoming" in args.also and args.wyoming_port is None:
        parser.error("--url with --also wyoming needs --wyoming-port")


def run(args: argparse.Namespace) -> int:
    report = Report(args)
    if args.url:
        measured = asyncio.run(measure(args.url, args))
    else:
        log_dir = Path(tempfile.mkdtemp(prefix="kokoro-bench-live-"))
        if "wyoming" in args.also:
            args.wyoming_port = free_port()
        with serving(start(args.weights, args.engine, log_dir, args.wyoming_port)) as server:
            measured = asyncio.run(measure(server.url, args))
    for level in measured["levels"]:
        phrase, live, whole = (
            level[key]["median_s"]
            for key in ("live_phrase_to_audio", "live_first_token_to_audio", "whole_first_token_to_audio")
        )
        print(
            f"{level['clients']} client(s): phrase complete -> audio {phrase} s; first token -> audio: "
            f"live {live} s, whole text after the LLM {whole} s"
        )
        for protocol in args.also:
            other = level[f"{protocol}_phrase_to_audio"]["median_s"]
            print(f"  {protocol}: phrase complete -> audio {other} s")
    for barge in measured["barge_in"]:
        print(f"barge-in: {barge}")
    tokens = llm_tokens(TEXT)
    report.write({
        "text_chars": len(TEXT), "tokens": len(tokens),
        "first_phrase": first_phrase(tokens, server_rules())[1], **measured,
    })  # fmt: skip
    return 0
