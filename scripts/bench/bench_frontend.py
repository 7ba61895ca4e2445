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
  returns audio of the real model's length. scripts/bench/loadtest.py drives it with closed-loop streaming
  clients; the server's processes' CPU time (from /proc) per audio second delivered is the cost, and
  2,500 x that cost is the number of cores the front end needs.

calibrate (--calibrate-texts N, needs the registry weights): the ONNX engine synthesizes the first N
paragraphs to measure seconds of audio per phoneme token; without it the recorded figure is used.

Simulated: the GPU (a sleep following the stated model). Real: everything else. The load-test client
runs on the same machine and takes CPU of its own, which is not counted as the server's.

    HF_HUB_OFFLINE=1 python scripts/bench/bench_frontend.py --out bench-results/<machine>/frontend.json
    HF_HUB_OFFLINE=1 python scripts/bench/bench_frontend.py --parts g2p encode --calibrate-texts 0
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
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a file: the repository's packages
from api.engine.base import ChunkAudio  # noqa: E402
from scripts.bench.bench_cpu import TEXTS  # noqa: E402
from scripts.benchlib import ROOT, machine_info, recorded_args, write_report  # noqa: E402
from tests.harness import free_port, serving, spawn  # noqa: E402

TARGET_AUDIO_S_PER_S = 2500.0
SAMPLE_RATE = 24000
# Seconds of audio per phoneme token from the real model (af_heart, speed 1): the ONNX engine over the
# 20 built-in paragraphs as the server chunks them (--calibrate-texts 20, 2026-11-23: 3029 tokens, 196.3 s).
SECONDS_PER_TOKEN = 0.0648
FIXED_S = 0.010
SERVER_READY_TIMEOUT_S = 120
PER_TOKEN_S = 20e-6
ENCODE_PIECE_S = 3.0
FORMATS = ("pcm", "wav", "mp3", "opus", "aac", "flac")
DEFAULT_WEIGHTS = Path.home() / ".cache" / "kokoro-openai-server" / "test-registry-weights"


# --- the simulated GPU ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuModel:
    """Batched forward time on the simulated GPU: fixed + padded tokens x per-token."""

    fixed_s: float = FIXED_S
    per_token_s: float = PER_TOKEN_S

    def batch_seconds(self, token_counts: Sequence[int]) -> float:
        if not token_counts:
            return 0.0
        return self.fixed_s + len(token_counts) * max(token_counts) * self.per_token_s

    def full_batch_rate(self, batch: int, tokens: int, seconds_per_token: float) -> float:
        """Audio seconds per second for back-to-back full batches of equal chunks."""
        return batch * tokens * seconds_per_token / self.batch_seconds([tokens] * batch)


class SimulatedGpuEngine:
    """The scheduler's view of the torch engine on CUDA (same vocabulary and batch policy), sleeping as the
    GPU model says instead of computing; its audio is slices of a speech-like signal of the real length."""

    name = "simulated-gpu"
    sample_rate = SAMPLE_RATE
    gives_durations = False

    def __init__(self, model: GpuModel, seconds_per_token: float, source: np.ndarray) -> None:
        from api.engine.torch_engine import GPU_BATCH_POLICY

        self.model = model
        self.seconds_per_token = seconds_per_token
        self.batch_defaults = GPU_BATCH_POLICY
        self._source = source
        config = json.loads((ROOT / "api" / "data" / "kokoro-82m-config.json").read_text())
        self._vocab = dict(config["vocab"])

    @property
    def vocab(self) -> Mapping[str, int]:
        return self._vocab

    def load(self) -> None:
        return None

    def synthesize(self, items: Sequence[Any], on_ready: Any = None) -> list[ChunkAudio]:
        time.sleep(self.model.batch_seconds([len(item.tokens) for item in items]))
        results = [ChunkAudio(self._audio(len(item.tokens), item.speed)) for item in items]
        if on_ready is not None:
            for index, audio in enumerate(results):
                on_ready(index, audio)
        return results

    def _audio(self, tokens: int, speed: float) -> np.ndarray:
        length = max(int(tokens * self.seconds_per_token / speed * SAMPLE_RATE), 1)
        start = (tokens * 7919) % len(self._source)
        if start + length <= len(self._source):
            return self._source[start : start + length].copy()
        return np.resize(self._source, length)  # longer than the source: repeated


def speech_like(seconds: float, seed: int = 0) -> np.ndarray:
    """Voiced-speech-like audio without the model: a gliding harmonic tone under a syllable-rate envelope
    with noise, so lossy encoders have real work (silence or a pure tone would flatter them)."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * SAMPLE_RATE)) / SAMPLE_RATE
    pitch = 140 + 40 * np.sin(2 * np.pi * 0.7 * t)
    phase = 2 * np.pi * np.cumsum(pitch) / SAMPLE_RATE
    voiced = sum(np.sin(k * phase) / k for k in range(1, 12))
    envelope = 0.5 + 0.5 * np.sin(2 * np.pi * 4.0 * t) ** 2
    signal = 0.2 * envelope * voiced + 0.02 * rng.standard_normal(len(t))
    return np.clip(signal, -1, 1).astype(np.float32)


# --- parts ------------------------------------------------------------------------------------------------


def pin_to_one_core() -> int | None:
    if not hasattr(os, "sched_setaffinity"):
        return None
    core = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {core})
    return core


def calibrate(texts: Sequence[str], weights: Path) -> dict[str, Any]:
    """Seconds of audio per token from the ONNX engine over whole paragraphs (the server's chunks)."""
    from api.engine.onnx_engine import OnnxEngine
    from api.engine.voices import VoiceStore
    from api.text.phonemize import Phonemizer
    from scripts.benchlib import server_chunks

    engine = OnnxEngine(weights, threads=len(os.sched_getaffinity(0)), warmup=False)
    engine.load()
    pack = VoiceStore(weights / "voices").resolve("af_heart")
    phonemizer = Phonemizer()
    tokens = 0
    audio: list[np.ndarray] = []
    for text in texts:
        for item in server_chunks(text, engine.vocab, pack, phonemizer).items:
            tokens += len(item.tokens)
            audio.append(engine.synthesize([item])[0].samples)
    seconds = sum(len(piece) for piece in audio) / SAMPLE_RATE
    return {
        "texts": len(texts),
        "tokens": tokens,
        "audio_s": round(seconds, 2),
        "seconds_per_token": round(seconds / tokens, 5),
        "speech": np.concatenate(audio),
    }


def measure_g2p(texts: Sequence[str], repeats: int, seconds_per_token: float) -> dict[str, Any]:
    """The server's text path on one core: normalize, phonemize, plan, as SpeechService does."""
    from api.settings import Settings
    from api.speech import chunk_limits
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


def process_tree_cpu(pid: int) -> float:
    """CPU seconds (user + system) of a process and its live children, from /proc."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    pids = [pid]
    children = Path(f"/proc/{pid}/task/{pid}/children")
    if children.exists():
        pids += [int(child) for child in children.read_text().split()]
    for each in pids:
        try:
            fields = Path(f"/proc/{each}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / ticks
    return total


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
        "scripts.bench.bench_frontend:create_simulated_app",
        factory=True,
        host="127.0.0.1",
        port=args.port,
        workers=args.workers,
        limit_concurrency=args.limit_concurrency,
        log_level="warning",
    )


def create_simulated_app() -> Any:
    from api.app import create_app
    from api.settings import Settings

    spec = json.loads(os.environ["BENCH_FRONTEND_ENGINE"])
    engine = SimulatedGpuEngine(
        GpuModel(spec["fixed_s"], spec["per_token_s"]), spec["seconds_per_token"], speech_like(30.0)
    )
    return create_app(Settings(), engine=engine)


def measure_server(args: argparse.Namespace, seconds_per_token: float) -> list[dict[str, Any]]:
    from scripts.bench.loadtest import LoadConfig, run_level

    port = free_port()
    env = {
        **os.environ,
        "KOKORO_WEIGHTS_DIR": str(args.weights_dir),
        "KOKORO_FETCH_WEIGHTS": "false",
        "KOKORO_MAX_INFLIGHT": str(args.inflight),
        "KOKORO_MAX_WAITING": str(args.inflight),
        "KOKORO_MAX_QUEUED_CHUNKS": str(args.inflight * 8),
        "KOKORO_LOG_LEVEL": "warning",
        "PYTHONPATH": str(ROOT),
    }
    command = [
        sys.executable, str(Path(__file__).resolve()), "serve", "--port", str(port),
        "--workers", str(args.workers), "--limit-concurrency", str(args.inflight * 2 + 8),
        "--seconds-per-token", str(seconds_per_token),
        "--fixed-s", str(args.fixed_s), "--per-token-s", str(args.per_token_s),
    ]  # fmt: skip
    log_path = Path(tempfile.mkdtemp(prefix="kokoro-bench-frontend-")) / "server.log"
    with serving(spawn(command, log_path, port, env), SERVER_READY_TIMEOUT_S) as server:
        records = []
        for fmt in args.server_formats:
            for concurrency in args.concurrency:
                config = LoadConfig(
                    url=server.url, texts=tuple(TEXTS), formats=(fmt,), requests=args.requests,
                    warmup=min(concurrency, args.requests), timeout=120.0,
                )  # fmt: skip
                cpu0 = process_tree_cpu(server.process.pid)
                level = run_level(config, concurrency)
                cpu = process_tree_cpu(server.process.pid) - cpu0
                records.append(server_record(fmt, concurrency, level, cpu, args.workers))
                print(json.dumps({k: v for k, v in records[-1].items() if k != "ttfb_s"}), flush=True)
        return records


def server_record(fmt: str, concurrency: int, level: Any, cpu_s: float, workers: int) -> dict[str, Any]:
    """One load level: delivered audio, the server's CPU per audio second, cores for the target."""
    # The measured CPU covers warm-up requests too, so it is charged against all of their audio.
    cost = cpu_s / level.audio_s if level.audio_s else None
    return {
        "format": fmt,
        "workers": workers,
        "concurrency": concurrency,
        "ok": level.ok,
        "failed": level.failed,
        "audio_s": round(level.audio_s, 1),
        "audio_s_per_s": round(level.audio_s_per_s, 1),
        "server_cpu_s": round(cpu_s, 2),
        "server_cpu_s_per_audio_s": round(cost, 5) if cost else None,
        "cores_for_target": round(TARGET_AUDIO_S_PER_S * cost, 1) if cost else None,
        "ttfb_p50_s": level.ttfb_s.p50 if level.ttfb_s else None,
        "ttfb_p95_s": level.ttfb_s.p95 if level.ttfb_s else None,
        "status_counts": level.status_counts,
    }


# --- driver -----------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("command", nargs="?", default="measure", choices=("measure", "serve"))
    parser.add_argument(
        "--parts", nargs="+", default=["g2p", "encode", "server"], choices=("g2p", "encode", "server")
    )
    parser.add_argument("--weights-dir", type=Path, default=DEFAULT_WEIGHTS)
    parser.add_argument("--calibrate-texts", type=int, default=0, help="paragraphs the ONNX engine runs")
    parser.add_argument("--seconds-per-token", type=float, default=SECONDS_PER_TOKEN)
    parser.add_argument("--g2p-repeats", type=int, default=3)
    parser.add_argument("--encode-seconds", type=float, default=120.0)
    parser.add_argument("--formats", nargs="+", default=list(FORMATS), choices=FORMATS)
    parser.add_argument("--server-formats", nargs="+", default=["pcm", "mp3"], choices=FORMATS)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--inflight", type=int, default=64, help="KOKORO_MAX_INFLIGHT (and MAX_WAITING)")
    parser.add_argument("--fixed-s", type=float, default=FIXED_S)
    parser.add_argument("--per-token-s", type=float, default=PER_TOKEN_S)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--limit-concurrency", type=int, default=None)
    parser.add_argument("--out", type=Path)
    return parser.parse_args(argv)


def run_part(part: str, args: argparse.Namespace, seconds_per_token: float, speech: np.ndarray) -> Any:
    """g2p and encode run in a child process each, so pinning to one core does not stick to this one."""
    if part == "server":
        return measure_server(args, seconds_per_token)
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=1) as pool:
        if part == "g2p":
            return pool.submit(measure_g2p, TEXTS, args.g2p_repeats, seconds_per_token).result()
        return pool.submit(measure_encoding, speech, args.formats, args.encode_seconds).result()


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.command == "serve":
        serve(args)
        return 0
    report: dict[str, Any] = {
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": machine_info(),
        "target_audio_s_per_s": TARGET_AUDIO_S_PER_S,
        "simulated": "the GPU: a sleep of fixed_s + padded tokens x per_token_s per batched forward",
        "gpu_model": {"fixed_s": args.fixed_s, "per_token_s": args.per_token_s},
        "arguments": recorded_args(args),
    }
    seconds_per_token, speech = args.seconds_per_token, speech_like(60.0)
    if args.calibrate_texts:
        calibration = calibrate(TEXTS[: args.calibrate_texts], args.weights_dir)
        speech = calibration.pop("speech")
        seconds_per_token = calibration["seconds_per_token"]
        report["calibration"] = calibration
    report["seconds_per_token"] = seconds_per_token
    report["gpu_model"]["full_batch_32x150_audio_s_per_s"] = round(
        GpuModel(args.fixed_s, args.per_token_s).full_batch_rate(32, 150, seconds_per_token), 1
    )
    for part in args.parts:
        report[part] = run_part(part, args, seconds_per_token, speech)
        print(f"{part}: done", flush=True)
    report["cores_for_target"] = cores_summary(report)
    if args.out:
        write_report(report, args.out)
    print(json.dumps(report["cores_for_target"], indent=2))
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


if __name__ == "__main__":
    raise SystemExit(main())
