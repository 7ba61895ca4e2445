"""How soon the Wyoming service (Home Assistant) gives audio, against the HTTP stream for the same text.

Starts the real server once with KOKORO_WYOMING on (or uses --url and --wyoming-port) and, one client at
a time, for each text of wyoming-bench's own corpus (one to four sentences) --runs times after a warm-up,
measures with wyoming-bench's client (`wyoming_bench.tts.client.measure_once`, what `wyoming-bench tts`
runs):

- streamed: synthesize-start, the text sentence by sentence (`synthesize-chunk`s --sentence-ms apart, as
  an LLM's sentences come), synthesize-stop; the time from the first sentence sent to the first
  `audio-chunk` (the target: at most 0.5 s at one client);
- not streamed: one `synthesize`; the time from it to the first `audio-chunk`;
- HTTP: POST /v1/audio/speech with the same text (pcm, `stream: true`); the time to the first byte.

Medians and p90 per kind, and the ratio of the not-streamed Wyoming first audio to the HTTP first byte
(the target: at most 1). JSON out.

    python -m scripts.bench wyoming --out bench-results/<machine>/wyoming.json
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from wyoming_bench.const import MODE_NON_STREAMING, MODE_STREAMING
from wyoming_bench.tts.client import measure_once
from wyoming_bench.tts.texts import DEFAULT_TEXTS

from scripts.bench.common import Report, add_weights, positive_int, ratio, summary
from scripts.harness import free_port, launch, process_env, stop_server, wait_engines_ready

STREAMED_TARGET_S = 0.5
TIMEOUT_S = 120.0
TORCH_THREADS = "2"  # the server's, as every Wyoming figure so far was measured


async def wyoming_first_audio(port: int, mode: str, text: str, sentence_s: float) -> float:
    measured = await measure_once(
        "127.0.0.1", port, mode, text, None, None, TIMEOUT_S, TIMEOUT_S, chunk_delay=sentence_s
    )
    if not measured.ok or measured.ttft_s is None:
        raise RuntimeError(f"{mode}: {measured.error}")
    return float(measured.ttft_s)


async def http_first_byte(client: httpx.AsyncClient, url: str, text: str) -> float:
    body = {"input": text, "voice": "af_heart", "response_format": "pcm", "stream": True}
    started = time.perf_counter()
    first: float | None = None
    async with client.stream("POST", f"{url}/v1/audio/speech", json=body, timeout=TIMEOUT_S) as response:
        response.raise_for_status()
        async for data in response.aiter_bytes():  # all of it, so the next request waits for none
            if data and first is None:
                first = time.perf_counter() - started
    if first is None:
        raise RuntimeError("the HTTP stream gave no audio")
    return first


async def measure(url: str, port: int, args: argparse.Namespace) -> dict[str, Any]:
    texts = list(DEFAULT_TEXTS)
    sentence_s = args.sentence_ms / 1000
    samples: dict[str, list[float]] = {"streamed": [], "not_streamed": [], "http": []}
    async with httpx.AsyncClient() as client:
        for text in texts:  # a warm-up of each kind and length
            await wyoming_first_audio(port, MODE_STREAMING, text, sentence_s)
            await wyoming_first_audio(port, MODE_NON_STREAMING, text, sentence_s)
            await http_first_byte(client, url, text)
        for _ in range(args.runs):
            for text in texts:
                samples["streamed"].append(await wyoming_first_audio(port, MODE_STREAMING, text, sentence_s))
                samples["not_streamed"].append(
                    await wyoming_first_audio(port, MODE_NON_STREAMING, text, sentence_s)
                )
                samples["http"].append(await http_first_byte(client, url, text))
    result = {kind: summary(values) for kind, values in samples.items()}
    streamed, wyoming, http = (result[kind]["median_s"] for kind in ("streamed", "not_streamed", "http"))
    return {
        "texts": texts,
        **result,
        "ratios": {
            "not_streamed_over_http_first_byte": round(ratio(wyoming, http) or 0, 3),
            "streamed_first_audio_s": streamed,
            "targets": {
                "streamed_first_audio_at_most_s": STREAMED_TARGET_S,
                "not_streamed_over_http_at_most": 1,
            },
        },
        "samples": samples,
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_weights(parser)
    parser.add_argument("--url", help="a running server instead of starting one (with --wyoming-port)")
    parser.add_argument("--wyoming-port", type=int, help="the running server's Wyoming port")
    parser.add_argument("--runs", type=positive_int, default=5, help="measured runs of each text per kind")
    parser.add_argument("--sentence-ms", type=float, default=300.0, help="time between a stream's sentences")


def prepare(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.url and args.wyoming_port is None:
        parser.error("--url needs --wyoming-port")


def run(args: argparse.Namespace) -> int:
    report = Report(args)
    if args.url:
        result = asyncio.run(measure(args.url, args.wyoming_port, args))
    else:
        wyoming_port = free_port()
        env = process_env(
            args.weights, KOKORO_TORCH_THREADS=TORCH_THREADS, KOKORO_WYOMING="true",
            KOKORO_WYOMING_PORT=str(wyoming_port),
        )  # fmt: skip
        with tempfile.TemporaryDirectory(prefix="bench-wyoming-") as folder:
            server = launch(env, Path(folder) / "server.log")
            try:
                wait_engines_ready(server)
                result = asyncio.run(measure(server.url, wyoming_port, args))
            finally:
                stop_server(server)
    report.write(result)
    print({kind: result[kind]["median_s"] for kind in ("streamed", "not_streamed", "http")}, result["ratios"])
    return 0
