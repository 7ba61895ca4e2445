"""Can the CPU side feed an H100? The CPU work per audio second, per core, with the GPU simulated.

At the GPU target (2,500 audio seconds per second on one H100) every audio second still costs CPU time in
the front end: normalization, G2P and chunk planning, the scheduler, encoding and HTTP. This script
measures that cost on this machine's cores, in three parts, and writes JSON:

- g2p: the server's text path (normalize, phonemize with misaki/spaCy, plan chunks) over the built-in
  paragraphs, in this process pinned to one core after a warm-up: audio seconds of text per CPU second.
  Audio seconds come from tokens x --seconds-per-token, the real model's figure (see calibrate).
- encode: each response format's streaming encoder (PyAV for mp3/opus/aac/flac) fed speech-like audio
  in 3 s chunks, as the server feeds it: audio seconds per CPU second, per format.
- server: the real app (`create_app`: routes, admission, G2P thread, scheduler, encoders, uvicorn) in
  its own process with --workers workers, over a simulated GPU engine instead of the model. The engine
  batches as the torch engine does on CUDA (its GPU batch policy) and sleeps for a stated model of an
  H100's batched forward: FIXED_S + padded tokens x PER_TOKEN_S (defaults: 10 ms + 20 us per padded
  token, i.e. ~3,000 audio-s/s for full batches of 150-token chunks: a GPU that meets the target). It
  returns audio of the real model's length. `load`'s client drives it with closed-loop streaming
  clients; the server's processes' CPU time (from /proc) per audio second delivered is the cost, and
  2,500 x that cost is the number of cores the front end needs.

calibrate (--onnx-texts N, needs the registry weights): the ONNX engine synthesizes the first N
paragraphs to measure seconds of audio per phoneme token; without it the recorded figure is used.

Simulated: the GPU (a sleep following the stated model). Real: everything else. The load-test client
runs on the same machine and takes CPU of its own, which is not counted as the server's.

    python -m scripts.bench frontend --out bench-results/<machine>/frontend.json
    python -m scripts.bench frontend --parts g2p encode --onnx-texts 0
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from scripts.bench import load
from scripts.bench.common import (
    PARAGRAPHS,
    ROOT,
    Report,
    add_weights,
    positive_int,
    process_tree_cpu,
)
from scripts.bench.simulated import (
    ENCODE_PIECE_S,
    FIXED_S,
    PER_TOKEN_S,
    SAMPLE_RATE,
    SECONDS_PER_TOKEN,
    GpuModel,
    SimulatedGpuEngine,
    calibrate,
    pin_to_one_core,
    speech_like,
)
from scripts.harness import free_port, process_env, serving, spawn

TARGET_AUDIO_S_PER_S = 2500.0
SERVER_READY_TIMEOUT_S = 120
FORMATS = ("pcm", "wav", "mp3", "opus", "aac", "flac")


def measure_g2p(texts: Sequence[str], repeats: int, seconds_per_token: float) -> dict[str, Any]:
    """The server's text path on one core: normalize, phonemize, plan, as SpeechService does."""
    from api.settings import Settings
    from api.speech.planning import chunk_limits
    from api.text.normalize import normalize_text
    from api.text.phonemize import Phonemizer
    from api.text.plan import PlannedChunk, Planner

    config = json.loads((ROOT / "api" / "data" / "kokoro-82m-config.json").read_text())
    vocab = dict(config["vocab"])
    settings = Settings()
    planner = Planner(chunk_limits(settings), settings.g2p_piece_chars, settings.first_g2p_piece_chars)
    phonemizer = Phonemizer()

    async def plan(text: str) -> int:
        normalized = normalize_text(text, lang_code="a", date_order=settings.date_order)

        async def words_of(piece: str) -> list[Any]:
            return phonemizer.words(piece, "a")

        steps = [step async for step in planner.plan(normalized, vocab, words_of)]
        return sum(len(step.tokens) for step in steps if isinstance(step, PlannedChunk))

    core = pin_to_one_core()
    asyncio.run(plan(texts[0]))  # warm-up: spaCy and misaki's lexicons load on first use
    cpu0, wall0 = time.process_time(), time.perf_counter()
    tokens = sum(asyncio.run(plan(text)) for _ in range(repeats) for text in texts)
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    chars = sum(len(text) for text in texts) * repeats
    audio = tokens * seconds_per_token
    return {
        "pinned_core": core,
        "texts": len(texts) * repeats,
        "chars": chars,
        "tokens": tokens,
        "audio_s": round(audio, 1),
        "cpu_s": round(cpu, 3),
        "wall_s": round(wall, 3),
        "audio_s_per_cpu_s": round(audio / cpu, 1),
        "chars_per_cpu_s": round(chars / cpu, 1),
        "cores_for_target": round(TARGET_AUDIO_S_PER_S * cpu / audio, 2),
    }


def measure_encoding(speech: np.ndarray, formats: Sequence[str], seconds: float) -> dict[str, Any]:
    """Each format's streaming encoder fed `seconds` of audio in ENCODE_PIECE_S pieces, on one core."""
    from api.audio.encoder import create_encoder
    from api.audio.formats import AudioFormat

    pin_to_one_core()
    repeats = int(np.ceil(seconds * SAMPLE_RATE / len(speech)))
    audio = np.tile(speech, repeats)[: int(seconds * SAMPLE_RATE)]
    piece = int(ENCODE_PIECE_S * SAMPLE_RATE)
    results: dict[str, Any] = {}
    for name in formats:
        encoder = create_encoder(AudioFormat(name), SAMPLE_RATE, streaming=True)
        cpu0 = time.process_time()
        size = sum(len(encoder.encode(audio[i : i + piece])) for i in range(0, len(audio), piece))
        size += len(encoder.finish())
        cpu = time.process_time() - cpu0
        encoder.close()
        results[name] = {
            "audio_s": seconds,
            "cpu_s": round(cpu, 3),
            "bytes": size,
            "audio_s_per_cpu_s": round(seconds / cpu, 1) if cpu > 0 else None,
            "cores_for_target": round(TARGET_AUDIO_S_PER_S * cpu / seconds, 2),
        }
    return results


# --- the server under load --------------------------------------------------------------------------------


def serve(args: argparse.Namespace) -> None:
    """The server process: the real app over the simulated GPU engine (`serve` subcommand)."""
    import uvicorn

    os.environ["BENCH_FRONTEND_ENGINE"] = json.dumps(
        {
            "fixed_s": args.fixed_s,
            "per_token_s": args.per_token_s,
            "seconds_per_token": args.seconds_per_token,
        }
    )
    uvicorn.run(
        "scripts.bench.frontend:create_simulated_app",
        factory=True,
        host="127.0.0.1",
        port=args.port,
        workers=args.workers,
        limit_concurrency=args.limit_concurrency,
        log_level="warning",
    )


def create_simulated_app() -> Any:
    from api.server.app import create_app
    from api.settings import Settings

    spec = json.loads(os.environ["BENCH_FRONTEND_ENGINE"])
    engine = SimulatedGpuEngine(
        GpuModel(spec["fixed_s"], spec["per_token_s"]), spec["seconds_per_token"], speech_like(30.0)
    )
    return create_app(Settings(), engine=engine)


def measure_server(args: argparse.Namespace, seconds_per_token: float) -> list[dict[str, Any]]:
    port = free_port()
    env = process_env(
        args.weights, KOKORO_MAX_INFLIGHT=str(args.inflight), KOKORO_MAX_WAITING=str(args.inflight),
        KOKORO_MAX_QUEUED_CHUNKS=str(args.inflight * 8), KOKORO_LOG_LEVEL="warning",
    )  # fmt: skip
    command = [
        sys.executable, "-m", "scripts.bench", "frontend", "serve", "--port", str(port),
        "--workers", str(args.workers), "--limit-concurrency", str(args.inflight * 2 + 8),
        "--seconds-per-token", str(seconds_per_token),
        "--fixed-s", str(args.fixed_s), "--per-token-s", str(args.per_token_s),
    ]  # fmt: skip
    log_path = Path(tempfile.mkdtemp(prefix="kokoro-bench-frontend-")) / "server.log"
    with serving(spawn(command, log_path, port, env), SERVER_READY_TIMEOUT_S) as server:
        records = []
        for fmt in args.format:
            for clients in args.clients:
                config = load.LoadConfig(
                    url=server.url, texts=PARAGRAPHS, formats=(fmt,), requests=args.requests,
                    warmup=min(clients, args.requests), timeout=120.0,
                )  # fmt: skip
                cpu0 = process_tree_cpu(server.process.pid)
                level = load.run_level(config, clients)
                cpu = process_tree_cpu(server.process.pid) - cpu0
                records.append(server_record(fmt, level, cpu, args.workers))
                print(json.dumps({k: v for k, v in records[-1].items() if k != "ttfb_s"}), flush=True)
        return records


def server_record(fmt: str, level: load.LevelResult, cpu_s: float, workers: int) -> dict[str, Any]:
    """One load level: delivered audio, the server's CPU per audio second, cores for the target."""
    # The measured CPU covers warm-up requests too, so it is charged against all of their audio.
    cost = cpu_s / level.audio_s if level.audio_s else None
    return {
        "format": fmt,
        "workers": workers,
        **load.level_record(level),
        "server_cpu_s": round(cpu_s, 2),
        "server_cpu_s_per_audio_s": round(cost, 5) if cost else None,
        "cores_for_target": round(TARGET_AUDIO_S_PER_S * cost, 1) if cost else None,
    }


# --- driver -----------------------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("command", nargs="?", default="measure", choices=("measure", "serve"))
    parts = ("g2p", "encode", "server")
    parser.add_argument("--parts", nargs="+", default=list(parts), choices=parts)
    add_weights(parser)
    onnx = "paragraphs the ONNX engine says, to calibrate with (0: none)"
    parser.add_argument("--onnx-texts", type=int, default=0, help=onnx)
    parser.add_argument("--seconds-per-token", type=float, default=SECONDS_PER_TOKEN)
    parser.add_argument("--g2p-repeats", type=int, default=3)
    parser.add_argument("--encode-seconds", type=float, default=120.0)
    parser.add_argument("--encode-format", nargs="+", default=list(FORMATS), choices=FORMATS)
    parser.add_argument("--format", nargs="+", default=["pcm", "mp3"], choices=FORMATS, help="the server's")
    parser.add_argument("--clients", type=positive_int, nargs="+", default=[16, 64])
    parser.add_argument("--requests", type=positive_int, default=200)
    parser.add_argument("--workers", type=positive_int, default=1)
    parser.add_argument("--inflight", type=int, default=64, help="KOKORO_MAX_INFLIGHT (and MAX_WAITING)")
    parser.add_argument("--fixed-s", type=float, default=FIXED_S)
    parser.add_argument("--per-token-s", type=float, default=PER_TOKEN_S)
    parser.add_argument("--port", type=int, default=0, help="serve: its port")
    parser.add_argument("--limit-concurrency", type=int, default=None, help="serve: uvicorn's")


def run_part(part: str, args: argparse.Namespace, seconds_per_token: float, speech: np.ndarray) -> Any:
    """g2p and encode run in a child process each, so pinning to one core does not stick to this one."""
    if part == "server":
        return measure_server(args, seconds_per_token)
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=1) as pool:
        if part == "g2p":
            return pool.submit(measure_g2p, PARAGRAPHS, args.g2p_repeats, seconds_per_token).result()
        return pool.submit(measure_encoding, speech, args.encode_format, args.encode_seconds).result()


def run(args: argparse.Namespace) -> int:
    if args.command == "serve":
        serve(args)
        return 0
    report = Report(args)
    results: dict[str, Any] = {
        "target_audio_s_per_s": TARGET_AUDIO_S_PER_S,
        "simulated": "the GPU: a sleep of fixed_s + padded tokens x per_token_s per batched forward",
        "gpu_model": {"fixed_s": args.fixed_s, "per_token_s": args.per_token_s},
    }
    seconds_per_token, speech = args.seconds_per_token, speech_like(60.0)
    if args.onnx_texts:
        calibration = calibrate(PARAGRAPHS[: args.onnx_texts], args.weights)
        speech = calibration.pop("speech")
        seconds_per_token = calibration["seconds_per_token"]
        results["calibration"] = calibration
    results["seconds_per_token"] = seconds_per_token
    results["gpu_model"]["full_batch_32x150_audio_s_per_s"] = round(
        GpuModel(args.fixed_s, args.per_token_s).full_batch_rate(32, 150, seconds_per_token), 1
    )
    for part in args.parts:
        results[part] = run_part(part, args, seconds_per_token, speech)
        print(f"{part}: done", flush=True)
    results["cores_for_target"] = cores_summary(results)
    report.write(results)
    print(json.dumps(results["cores_for_target"], indent=2))
    return 0


def cores_summary(report: Mapping[str, Any]) -> dict[str, Any]:
    """Cores needed for the target by each measured part, and the whole server path per format (the
    highest concurrency measured, where batches are fullest)."""
    summary: dict[str, Any] = {}
    if "g2p" in report:
        summary["g2p"] = report["g2p"]["cores_for_target"]
    if "encode" in report:
        summary["encode"] = {fmt: part["cores_for_target"] for fmt, part in report["encode"].items()}
    if "server" in report:
        best: dict[str, Any] = {}
        for record in report["server"]:
            if record["format"] not in best or record["concurrency"] > best[record["format"]]["concurrency"]:
                best[record["format"]] = record
        summary["server"] = {fmt: record["cores_for_target"] for fmt, record in best.items()}
    return summary
