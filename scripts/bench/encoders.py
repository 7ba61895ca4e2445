"""What mp3 (and opus, aac) cost per audio second on one core, and how far each setting's audio moves.

The API's default format is mp3, and libmp3lame is the most expensive encoder the server runs (docs/journal/
gpu.md, entry 8). This script measures the settings that could make it cheaper, each through
the server's own encoders (`api.audio.encoder.PyAVEncoder`, and `LameEncoder` for the options named
"lameenc", the server's streamed mp3), in five parts, and writes JSON:

- speed: each option's streaming encoder fed --speed-seconds of audio in 3 s pieces (as the server feeds
  it), in a child process pinned to one core; the best of --runs rounds, the options interleaved in
  each round so that a neighbour's load falls on all of them alike: audio seconds per CPU second.
- fidelity: each option's whole-file encoding of the speech, decoded with PyAV (back to 24 kHz), aligned
  by cross-correlation and compared with the source by `api.weights.convert.spectral_distance` (the
  log-mel distance in dB that the converter's and the encoder's tests use); also the bit rate it made.
- pieces: the default mp3 encoder fed the same audio in pieces of different sizes (one core).
- setup: what one request costs before any audio: create the encoder and finish it (ms, one core).
- threads: whether an mp3 encoder lets two threads encode at once (PyAV releases the GIL around
  avcodec_send_frame / avcodec_receive_packet, lameenc around LAME's encode): two mp3 streams on two
  threads of one process, as the server's encode pool runs them, against one thread and against two
  processes (wall-clock speed-up); for PyAV's default mp3 and for each lameenc option measured.

The speech: with --onnx-texts N (and the registry weights in --weights) the ONNX engine speaks the first N
built-in paragraphs; the real model's audio is what fidelity should be judged on. Without, the
speech-like signal of scripts/bench/simulated.py (good enough for speed, not for fidelity).

    python -m scripts.bench encoders --onnx-texts 6 --out bench-results/cpu-intel-amx/encoders.json
    python -m scripts.bench encoders --parts speed threads --speed-seconds 20
"""

from __future__ import annotations

import argparse
import io
import os
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Literal

import av
import numpy as np

from api.audio.encoder import (
    CODEC_SPECS,
    DEFAULT_MP3_KBPS,
    DEFAULT_MP3_QUALITY,
    AudioEncoder,
    CodecSpec,
    LameEncoder,
    PyAVEncoder,
)
from api.audio.formats import AudioFormat
from scripts.bench.common import PARAGRAPHS, Report, add_weights, positive_int
from scripts.bench.simulated import ENCODE_PIECE_S, calibrate, pin_to_one_core, speech_like

SAMPLE_RATE = 24000
MAX_LAG = 4096  # samples of codec delay searched when aligning decoded audio with the source
PARTS = ("speed", "fidelity", "pieces", "setup", "threads")
PIECE_SECONDS = (0.05, 0.25, 1.0, 3.0, 12.0)


@dataclass(frozen=True)
class Option:
    """One encoder setting to measure: a format, the codec options that differ from the server's, and the
    library that encodes it (lameenc: mp3 only, its bit rate and `compression_level` as LAME's -q)."""

    label: str
    fmt: AudioFormat
    bit_rate: int | None = None
    codec_options: Mapping[str, str] = field(default_factory=dict)
    library: Literal["pyav", "lameenc"] = "pyav"

    def spec(self) -> CodecSpec:
        base = CODEC_SPECS[self.fmt]
        return CodecSpec(
            container=base.container,
            codec=base.codec,
            sample_format=base.sample_format,
            bit_rate=self.bit_rate if self.bit_rate is not None else base.bit_rate,
            needs_audio=base.needs_audio,
            streaming_options=base.streaming_options,
            codec_options={**base.codec_options, **self.codec_options},
        )

    def encoder(self, *, streaming: bool) -> AudioEncoder:
        if self.library == "pyav":
            return PyAVEncoder(self.spec(), SAMPLE_RATE, streaming=streaming)
        kbps = self.bit_rate // 1000 if self.bit_rate is not None else DEFAULT_MP3_KBPS
        quality = int(self.codec_options.get("compression_level", DEFAULT_MP3_QUALITY))
        return LameEncoder(SAMPLE_RATE, kbps=kbps, quality=quality)  # the same bytes either way


def _vbr(quality: int) -> dict[str, str]:
    # ffmpeg's -q:a N for libmp3lame: global_quality N x FF_QP2LAMBDA (118) with the qscale flag.
    return {"flags": "+qscale", "global_quality": str(quality * 118)}


OPTIONS: tuple[Option, ...] = (
    Option("mp3 server default", AudioFormat.MP3),
    Option("mp3 32k q3 (LAME's own choice)", AudioFormat.MP3, 32_000, {"compression_level": "3"}),
    Option("mp3 48k q3", AudioFormat.MP3, 48_000, {"compression_level": "3"}),
    Option("mp3 64k q3", AudioFormat.MP3, 64_000, {"compression_level": "3"}),
    Option("mp3 96k q3", AudioFormat.MP3, 96_000, {"compression_level": "3"}),
    Option("mp3 128k q3", AudioFormat.MP3, 128_000, {"compression_level": "3"}),
    Option("mp3 32k q7", AudioFormat.MP3, 32_000, {"compression_level": "7"}),
    Option("mp3 64k q2", AudioFormat.MP3, 64_000, {"compression_level": "2"}),
    Option("mp3 64k q5", AudioFormat.MP3, 64_000, {"compression_level": "5"}),
    Option("mp3 64k q7", AudioFormat.MP3, 64_000, {"compression_level": "7"}),
    Option("mp3 64k q9", AudioFormat.MP3, 64_000, {"compression_level": "9"}),
    Option("mp3 96k q5", AudioFormat.MP3, 96_000, {"compression_level": "5"}),
    Option("mp3 96k q7", AudioFormat.MP3, 96_000, {"compression_level": "7"}),
    Option("mp3 128k q5", AudioFormat.MP3, 128_000, {"compression_level": "5"}),
    Option("mp3 128k q7", AudioFormat.MP3, 128_000, {"compression_level": "7"}),
    Option("mp3 64k q3 abr", AudioFormat.MP3, 64_000, {"compression_level": "3", "abr": "1"}),
    Option("mp3 64k q3 no reservoir", AudioFormat.MP3, 64_000, {"compression_level": "3", "reservoir": "0"}),
    Option("mp3 vbr V2 q3", AudioFormat.MP3, codec_options={**_vbr(2), "compression_level": "3"}),
    Option("mp3 vbr V4 q3", AudioFormat.MP3, codec_options={**_vbr(4), "compression_level": "3"}),
    Option("mp3 vbr V6 q3", AudioFormat.MP3, codec_options={**_vbr(6), "compression_level": "3"}),
    Option("mp3 vbr V4 q7", AudioFormat.MP3, codec_options={**_vbr(4), "compression_level": "7"}),
    # The server's streamed mp3 (the same settings as "mp3 server default", which stays its whole files).
    Option("mp3 lameenc 96k q7", AudioFormat.MP3, library="lameenc"),
    Option("mp3 lameenc 96k q3", AudioFormat.MP3, 96_000, {"compression_level": "3"}, library="lameenc"),
    Option("mp3 lameenc 64k q7", AudioFormat.MP3, 64_000, library="lameenc"),
    Option("opus server default", AudioFormat.OPUS),
    Option("opus 32k", AudioFormat.OPUS, 32_000),
    Option("opus 96k", AudioFormat.OPUS, 96_000),
    Option("opus complexity 5", AudioFormat.OPUS, codec_options={"compression_level": "5"}),
    Option("opus 60 ms frames", AudioFormat.OPUS, codec_options={"frame_duration": "60"}),
    Option("aac server default", AudioFormat.AAC),
    Option("aac 64k", AudioFormat.AAC, 64_000),
    Option("aac 96k", AudioFormat.AAC, 96_000),
)
DEFAULTS = {option.fmt: option for option in OPTIONS if option.label.endswith("server default")}
LAMEENC = tuple(option for option in OPTIONS if option.library == "lameenc")


# --- encoding and decoding --------------------------------------------------------------------------------


def encode(option: Option, audio: np.ndarray, piece_s: float = ENCODE_PIECE_S, *, streaming: bool) -> bytes:
    encoder = option.encoder(streaming=streaming)
    piece = max(int(piece_s * SAMPLE_RATE), 1)
    data = b"".join(encoder.encode(audio[i : i + piece]) for i in range(0, len(audio), piece))
    return data + encoder.finish()


def decode(data: bytes) -> np.ndarray:
    """Mono float32 at 24 kHz (ffmpeg's Opus decoder gives 48 kHz, resampled back here)."""
    resampler = av.AudioResampler(format="flt", layout="mono", rate=SAMPLE_RATE)
    with av.open(io.BytesIO(data)) as container:
        frames = [out for frame in container.decode(audio=0) for out in resampler.resample(frame)]
    frames += resampler.resample(None)
    return np.concatenate([frame.to_ndarray().reshape(-1) for frame in frames])


def aligned(source: np.ndarray, decoded: np.ndarray) -> np.ndarray:
    """The decoded samples that stand for the source's: the codec's leading delay found by correlation."""
    probe = source[: min(len(source), 10 * SAMPLE_RATE)].astype(np.float64)
    window = decoded[: len(probe) + MAX_LAG].astype(np.float64)
    scores = np.correlate(window, probe, mode="valid")[: MAX_LAG + 1]
    lag = int(np.argmax(scores))
    return decoded[lag : lag + len(source)]


def distance_db(source: np.ndarray, candidate: np.ndarray) -> float:
    from api.weights.convert import spectral_distance

    length = min(len(source), len(candidate))
    result = spectral_distance(source[:length].astype(np.float64), candidate[:length].astype(np.float64))
    return round(result.mel_db, 3)


# --- parts ------------------------------------------------------------------------------------------------


def cpu_seconds(work: Callable[[], object]) -> float:
    start = time.process_time()
    work()
    return time.process_time() - start


def measure_speed(options: Sequence[Option], audio: np.ndarray, rounds: int) -> dict[str, Any]:
    """Best-of-rounds CPU seconds per option on one core, the options interleaved within each round."""
    pin_to_one_core()
    seconds = len(audio) / SAMPLE_RATE
    best: dict[str, float] = {}
    for _ in range(rounds):
        for option in options:
            cpu = cpu_seconds(partial(encode, option, audio, streaming=True))
            best[option.label] = min(cpu, best.get(option.label, cpu))
    results: dict[str, Any] = {}
    for option in options:
        results[option.label] = {"audio_s_per_cpu_s": round(seconds / best[option.label], 1)}
        default = best.get(DEFAULTS[option.fmt].label)
        if default is not None:
            results[option.label]["speed_vs_format_default"] = round(default / best[option.label], 3)
    return {"audio_s": seconds, "rounds": rounds, "options": results}


def measure_fidelity(options: Sequence[Option], speech: np.ndarray) -> dict[str, Any]:
    results: dict[str, Any] = {}
    seconds = len(speech) / SAMPLE_RATE
    for option in options:
        data = encode(option, speech, streaming=False)
        results[option.label] = {
            "mel_db": distance_db(speech, aligned(speech, decode(data))),
            "kbit_s": round(8 * len(data) / seconds / 1000, 1),
        }
    return results


def measure_pieces(audio: np.ndarray, rounds: int) -> dict[str, Any]:
    pin_to_one_core()
    option, seconds = DEFAULTS[AudioFormat.MP3], len(audio) / SAMPLE_RATE
    best: dict[float, float] = {}
    for _ in range(rounds):
        for piece in PIECE_SECONDS:
            cpu = cpu_seconds(partial(encode, option, audio, piece, streaming=True))
            best[piece] = min(cpu, best.get(piece, cpu))
    return {f"{piece:g} s": round(seconds / cpu, 1) for piece, cpu in best.items()}


def measure_setup(options: Sequence[Option], requests: int) -> dict[str, Any]:
    """CPU per request for an encoder created and finished with one sample: the cost before any audio."""
    pin_to_one_core()
    one = np.zeros(1, dtype=np.float32)
    results: dict[str, Any] = {}
    for option in (*DEFAULTS.values(), *LAMEENC):
        if option not in options:
            continue
        cpu = cpu_seconds(partial(_encode_times, option, one, requests))
        results[option.label] = {"ms_per_request": round(1000 * cpu / requests, 3)}
    return results


def _encode_times(option: Option, audio: np.ndarray, times: int) -> None:
    for _ in range(times):
        encode(option, audio, streaming=True)


def _encode_streamed(option: Option, audio: np.ndarray) -> int:
    return len(encode(option, audio, streaming=True))


def measure_threads(options: Sequence[Option], audio: np.ndarray, rounds: int) -> dict[str, Any]:
    """`measure_two_streams` for PyAV's default mp3 and each lameenc option, by label."""
    mp3 = [option for option in (DEFAULTS[AudioFormat.MP3], *LAMEENC) if option in options]
    return {option.label: measure_two_streams(option, audio, rounds) for option in mp3}


def measure_two_streams(option: Option, audio: np.ndarray, rounds: int) -> dict[str, Any]:
    """Wall-clock speed-up of two streams at once: on two threads of one process (the server's encode
    pool) and on two processes, each against one stream alone. A speed-up near the processes' means the
    encoder runs without the GIL; near 1.0 means one worker process encodes on one core. The threads'
    CPU seconds per wall second say the same where the machine is busy: above 1.0 only if they overlapped."""
    cores = len(os.sched_getaffinity(0))
    alone = threads = processes = float("inf")
    overlap = 0.0
    one = partial(_encode_streamed, option)
    with ThreadPoolExecutor(max_workers=2) as pool, ProcessPoolExecutor(max_workers=2) as children:
        list(children.map(one, [audio[:SAMPLE_RATE]] * 2))  # start both children first
        for _ in range(rounds):
            alone = min(alone, _wall(partial(one, audio)))
            cpu, wall = time.process_time(), time.perf_counter()
            _encode_two(pool, one, audio)
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
            threads, overlap = min(threads, wall), max(overlap, cpu / wall)
            processes = min(processes, _wall(partial(_encode_two, children, one, audio)))
    return {
        "cores": cores,
        "one_stream_s": round(alone, 3),
        "two_threads_s": round(threads, 3),
        "two_processes_s": round(processes, 3),
        "speed_up_two_threads": round(2 * alone / threads, 3),
        "speed_up_two_processes": round(2 * alone / processes, 3),
        "two_threads_cpu_s_per_wall_s": round(overlap, 3),
    }


def _wall(work: Callable[[], object]) -> float:
    start = time.perf_counter()
    work()
    return time.perf_counter() - start


def _encode_two(executor: Executor, one: Callable[[np.ndarray], int], audio: np.ndarray) -> None:
    list(executor.map(one, [audio, audio]))


# --- the speech -------------------------------------------------------------------------------------------


def real_speech(texts: Sequence[str], weights: Path) -> np.ndarray:
    """The ONNX engine's speech for `texts` (af_heart, as the server chunks them)."""
    speech: np.ndarray = calibrate(texts, weights)["speech"]
    return speech


def run_part(part: str, args: argparse.Namespace, options: Sequence[Option], speech: np.ndarray) -> Any:
    """Parts that pin themselves to one core run in a child process, so the pinning ends with them."""
    timed = np.tile(speech, int(np.ceil(args.speed_seconds * SAMPLE_RATE / len(speech))))
    timed = timed[: int(args.speed_seconds * SAMPLE_RATE)]
    if part == "fidelity":
        return measure_fidelity(options, speech)
    if part == "threads":
        return measure_threads(options, timed, args.runs)
    with ProcessPoolExecutor(max_workers=1) as pool:
        if part == "speed":
            return pool.submit(measure_speed, options, timed, args.runs).result()
        if part == "pieces":
            return pool.submit(measure_pieces, timed, args.runs).result()
        return pool.submit(measure_setup, options, args.setup_requests).result()


def summary(report: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row per option: speed on one core and distance from the source, where both were measured."""
    speed = report.get("speed", {}).get("options", {})
    fidelity = report.get("fidelity", {})
    return [
        {"option": label, **speed.get(label, {}), **fidelity.get(label, {})}
        for label in dict.fromkeys([*speed, *fidelity])
    ]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--parts", nargs="+", default=list(PARTS), choices=PARTS)
    parser.add_argument("--options", nargs="+", help="labels to measure (default: all)")
    onnx = "paragraphs the ONNX engine says, the speech measured (0: a speech-like signal)"
    parser.add_argument("--onnx-texts", type=int, default=0, help=onnx)
    add_weights(parser)
    parser.add_argument("--speed-seconds", type=float, default=30.0)
    parser.add_argument("--runs", type=positive_int, default=3, help="rounds of speed, pieces and threads")
    parser.add_argument("--setup-requests", type=int, default=200)


def run(args: argparse.Namespace) -> int:
    report = Report(args)
    options = [option for option in OPTIONS if not args.options or option.label in args.options]
    results: dict[str, Any] = {"pyav": av.__version__, "speech": "speech_like (synthetic)"}
    speech = speech_like(60.0)
    if args.onnx_texts:
        speech = real_speech(PARAGRAPHS[: args.onnx_texts], args.weights)
        results["speech"] = f"the ONNX engine (registry weights, af_heart), {args.onnx_texts} paragraphs"
    results["speech_s"] = round(len(speech) / SAMPLE_RATE, 2)
    for part in args.parts:
        results[part] = run_part(part, args, options, speech)
        print(f"{part}: done", flush=True)
    results["summary"] = summary(results)
    report.write(results)
    return 0
