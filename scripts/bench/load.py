"""Closed-loop load test of POST /v1/audio/speech: N workers, each sending its next request as soon as its
last one ends (what `hey -n 100 -c 50` did), at one or several concurrency levels in turn.

Per level: status counts, error kinds, the Retry-After values of 503s (and whether their bodies have
OpenAI's error shape), throughput in audio seconds per wall second, requests per second, time to first
body byte (TTFB) and latency percentiles of the successful requests, bytes. A table on stdout; every level,
the arguments and the machine in JSON. Its load generator is what the other server benchmarks load with.

    python -m scripts.bench load --clients 1 4 16 --requests 100 --format mp3 pcm --texts mixed \\
        --out bench-results/<machine>/load.json --label "torch engine, batch 8"
    python -m scripts.bench load --clients 32 --duration 60 --no-stream --honor-retry-after

A request succeeds when it answers 200 with a complete body holding audio. Audio seconds are exact for pcm
(bytes / 2 / 24000) and wav (the data chunk); mp3, opus, aac and flac bodies are decoded with PyAV after
the level has ended, so decoding takes no CPU while requests are timed, or not at all with --no-decode
(then only their bytes are reported and a non-empty body counts as audio). Exit status 1 when no request
of any level succeeded.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import itertools
import json
import math
import statistics
import struct
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any

import av
import httpx

from scripts.bench.common import Report, non_negative_int, positive_float, positive_int, rounded

SPEECH_PATH = "/v1/audio/speech"
FORMATS = ("mp3", "opus", "aac", "flac", "wav", "pcm")
EXACT_FORMATS = frozenset({"pcm", "wav"})  # audio seconds from the bytes, no decoding
PCM_SAMPLE_RATE = 24000
PCM_BYTES_PER_SAMPLE = 2
WAV_UNKNOWN_SIZE = 0xFFFFFFFF  # the RIFF/data size a streaming writer puts in its header
DEFAULT_RETRY_AFTER_S = 1.0  # the back-off after a 503 that names no Retry-After
DEFAULT_REQUESTS = 100

TEXTS: dict[str, tuple[str, ...]] = {
    "short": (
        "Your order has shipped and should arrive on Thursday.",
        "Turn left at the next intersection, then keep right for about two miles.",
        "The meeting has been moved to half past three this afternoon.",
        "Thanks for calling. Please hold while we connect you to the next available agent.",
        "It's going to rain later today, so you might want to take an umbrella.",
    ),
    "medium": (
        "When the storm finally arrived, it came faster than anyone in the village had expected. The "
        "fishermen pulled their boats high onto the shingle, the baker closed his shutters, and the children "
        "were called in from the fields. By nightfall the wind was howling through the streets.",
        "To reset your password, open the settings page and choose the security tab. Select the option to "
        "change your password, enter your current one, and then type the new password twice. You will "
        "receive a confirmation email within a few minutes.",
        "The museum's new exhibition brings together more than two hundred photographs from the early years "
        "of the railway. Many of them have never been shown in public before, and several were found only "
        "last spring in a box of papers donated by a retired engineer.",
    ),
    "long": (
        "Every morning, long before the first customers arrived, Maria unlocked the little bookshop on the "
        "corner and put the kettle on. She liked the quiet hour best: the smell of paper and dust, the "
        "soft light coming through the front window, the sound of the street slowly waking up outside. She "
        "would walk along the shelves with her tea, straightening a spine here and there, pulling out a "
        "book that someone had put back in the wrong place. Over the years she had come to think of the "
        "shop as a kind of map of the town. The travel section grew whenever the factory paid its bonuses. "
        "The cookbooks sold out every December. And the poetry shelf, which nobody ever seemed to touch, "
        "was always a little emptier on Monday mornings, as if someone had been reading there over the "
        "weekend while the door was locked. She never found out who it was, and after a while she decided "
        "that she did not really want to know.",
        "Good evening, and welcome to the program. Tonight we are looking at how cities are preparing for "
        "hotter summers. Over the past decade, average temperatures in many urban areas have risen faster "
        "than in the surrounding countryside, partly because concrete and asphalt store heat during the day "
        "and release it slowly at night. Some cities are responding by planting thousands of trees along "
        "their busiest streets. Others are painting roofs white, opening cooling centers in libraries and "
        "schools, or redesigning bus stops so that people waiting in the afternoon sun have somewhere to "
        "shelter. We spoke to planners, doctors and residents about what has worked, what has not, and what "
        "still needs to change before the next heat wave arrives. Their answers were not always what we "
        "expected, and several of them told us that the most important changes are also the least visible.",
    ),
}


@dataclass(frozen=True)
class LoadConfig:
    """What every request of a level sends, and how the level decides it is done."""

    url: str
    texts: tuple[str, ...]
    formats: tuple[str, ...] = ("mp3",)
    voice: str = "af_heart"
    model: str = "kokoro"
    speed: float = 1.0
    stream: bool = True
    requests: int | None = DEFAULT_REQUESTS
    duration: float | None = None
    timeout: float = 120.0
    warmup: int = 0
    decode: bool = True
    honor_retry_after: bool = False
    retry_after_cap: float = 10.0

    def __post_init__(self) -> None:
        if not self.texts or not self.formats:
            raise ValueError("texts and formats must not be empty")
        if (self.requests is None) == (self.duration is None):
            raise ValueError("give exactly one of requests and duration")

    def format_for(self, index: int) -> str:
        return self.formats[index % len(self.formats)]

    def payload(self, index: int) -> dict[str, Any]:
        return {
            "model": self.model,
            "input": self.texts[index % len(self.texts)],
            "voice": self.voice,
            "response_format": self.format_for(index),
            "speed": self.speed,
            "stream": self.stream,
        }


@dataclass
class Transfer:
    """What came back for one request, filled in as it arrives so that a failure keeps what was seen."""

    status: int | None = None
    retry_after: str | None = None
    body: bytearray = field(default_factory=bytearray)
    headers_s: float | None = None
    ttfb_s: float | None = None
    latency_s: float = 0.0
    error: str | None = None


@dataclass
class Sample:
    """The record of one request: its outcome, timings (seconds from sending it) and audio."""

    index: int
    format: str
    start_s: float  # when it was sent, from the start of the level
    status: int | None  # None when no response headers arrived
    error: str | None  # None for a success
    size_bytes: int
    headers_s: float | None
    ttfb_s: float | None
    latency_s: float
    audio_s: float | None = None
    retry_after_s: float | None = None
    error_body_ok: bool | None = None  # for non-200 answers: OpenAI's {"error": {...}} shape?

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.error is None


@dataclass(frozen=True)
class Spread:
    count: int
    min: float
    mean: float
    p50: float
    p95: float
    p99: float
    max: float


@dataclass(frozen=True)
class RetryAfterStats:
    count: int
    min: float
    median: float
    max: float


@dataclass
class LevelResult:
    """The summary of one concurrency level; `samples` holds every measured request."""

    concurrency: int
    requests: int
    ok: int
    failed: int
    wall_s: float
    requests_per_s: float
    ok_per_s: float
    audio_s: float
    audio_unmeasured: int  # successes whose audio was not decoded (--no-decode)
    audio_s_per_s: float  # throughput: audio seconds received per wall second
    status_counts: dict[str, int]
    error_kinds: dict[str, int]
    formats: dict[str, int]
    retry_after_s: RetryAfterStats | None
    missing_retry_after: int  # 503s without a usable Retry-After header
    bad_error_bodies: int  # non-200 answers whose body is not OpenAI's error shape
    ttfb_s: Spread | None
    latency_s: Spread | None
    headers_s: Spread | None
    bytes_total: int
    bytes_ok_mean: float | None
    samples: list[Sample] = field(default_factory=list, repr=False)

    def to_dict(self, *, include_samples: bool = False) -> dict[str, Any]:
        data = asdict(self)
        if not include_samples:
            del data["samples"]
        return data


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) with linear interpolation between closest ranks, as numpy's default."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"q must be within 0..100, not {q}")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def spread(values: Sequence[float]) -> Spread | None:
    if not values:
        return None
    return Spread(
        count=len(values), min=min(values), mean=statistics.fmean(values), p50=percentile(values, 50),
        p95=percentile(values, 95), p99=percentile(values, 99), max=max(values),
    )  # fmt: skip


def retry_after_stats(values: Sequence[float]) -> RetryAfterStats | None:
    if not values:
        return None
    return RetryAfterStats(len(values), min(values), statistics.median(values), max(values))


def parse_retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or an HTTP date); None when absent or unreadable."""
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return _seconds_until(value)
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


def _seconds_until(http_date: str) -> float | None:
    try:
        moment = parsedate_to_datetime(http_date)
    except (TypeError, ValueError):
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return max((moment - datetime.now(timezone.utc)).total_seconds(), 0.0)


def backoff_seconds(retry_after: float | None, cap: float, remaining: float | None) -> float:
    """How long a worker waits after a 503: Retry-After, capped, never past the end of a timed level."""
    wait = min(DEFAULT_RETRY_AFTER_S if retry_after is None else retry_after, cap)
    if remaining is not None:
        wait = min(wait, remaining)
    return max(wait, 0.0)


def is_openai_error(body: bytes) -> bool:
    """Whether a body is OpenAI's error shape: {"error": {"message", "type", "param", "code"}}."""
    try:
        document = json.loads(body)
    except ValueError:
        return False
    error = document.get("error") if isinstance(document, dict) else None
    return (
        isinstance(error, dict)
        and isinstance(error.get("message"), str)
        and isinstance(error.get("type"), str)
        and "param" in error
        and "code" in error
    )


def pcm_seconds(body: bytes) -> float | None:
    """Seconds of raw s16le 24 kHz mono; None when empty or not whole samples."""
    if not body or len(body) % PCM_BYTES_PER_SAMPLE:
        return None
    return len(body) / PCM_BYTES_PER_SAMPLE / PCM_SAMPLE_RATE


def wav_seconds(body: bytes) -> float | None:
    """Seconds in a RIFF/WAVE body's data chunk (a streamed header's unknown size means: to the end)."""
    if len(body) < 12 or body[:4] != b"RIFF" or body[8:12] != b"WAVE":
        return None
    offset = 12
    frame: tuple[int, int] | None = None
    while offset + 8 <= len(body):
        chunk_id, size = struct.unpack_from("<4sI", body, offset)
        if chunk_id == b"fmt ":
            frame = _wav_frame(body, offset + 8)
        elif chunk_id == b"data":
            return _wav_data_seconds(body, offset + 8, size, frame)
        offset += 8 + size + (size & 1)
    return None


def _wav_frame(body: bytes, start: int) -> tuple[int, int] | None:
    """(sample rate, bytes per frame) from a fmt chunk's body."""
    if start + 16 > len(body):
        return None
    _, _, rate, _, block_align, _ = struct.unpack_from("<HHIIHH", body, start)
    return (rate, block_align) if rate and block_align else None


def _wav_data_seconds(body: bytes, start: int, size: int, frame: tuple[int, int] | None) -> float | None:
    if frame is None:
        return None
    available = len(body) - start
    data = available if size in (0, WAV_UNKNOWN_SIZE) else min(size, available)
    rate, block_align = frame
    seconds = data // block_align / rate
    return seconds or None


def decoded_seconds(body: bytes) -> float | None:
    """Seconds of audio PyAV decodes from a compressed body; None when it holds none or does not decode."""
    try:
        with av.open(io.BytesIO(body)) as container:
            return _decode_duration(container)
    except (av.FFmpegError, IndexError, ValueError, OSError, EOFError):
        return None


def _decode_duration(container: Any) -> float | None:
    if not container.streams.audio:
        return None
    seconds = 0.0
    for frame in container.decode(audio=0):
        seconds += frame.samples / frame.sample_rate
    return seconds or None


def measure_audio(fmt: str, body: bytes) -> float | None:
    if fmt == "pcm":
        return pcm_seconds(body)
    if fmt == "wav":
        return wav_seconds(body)
    return decoded_seconds(body)


def transport_error_kind(exc: httpx.HTTPError) -> str:
    if isinstance(exc, httpx.TimeoutException):
        return "timeout"
    if isinstance(exc, httpx.RemoteProtocolError):
        return "incomplete"  # e.g. the peer closed the connection before the end of the chunked body
    if isinstance(exc, httpx.ConnectError):
        return "connect_error"
    if isinstance(exc, httpx.ReadError):
        return "read_error"
    if isinstance(exc, httpx.WriteError):
        return "write_error"
    return type(exc).__name__.lower()


async def receive(
    client: httpx.AsyncClient, payload: dict[str, Any], transfer: Transfer, started: float
) -> None:
    async with client.stream("POST", SPEECH_PATH, json=payload) as response:
        transfer.headers_s = time.perf_counter() - started
        transfer.status = response.status_code
        transfer.retry_after = response.headers.get("retry-after")
        async for chunk in response.aiter_bytes():
            if chunk and transfer.ttfb_s is None:
                transfer.ttfb_s = time.perf_counter() - started
            transfer.body += chunk


async def fetch(client: httpx.AsyncClient, config: LoadConfig, index: int) -> Transfer:
    """One timed request, its body read to the end; failures are recorded in the result, never raised."""
    transfer = Transfer()
    started = time.perf_counter()
    try:
        await asyncio.wait_for(receive(client, config.payload(index), transfer, started), config.timeout)
    except asyncio.TimeoutError:
        transfer.error = "timeout"
    except httpx.HTTPError as exc:
        transfer.error = transport_error_kind(exc)
    transfer.latency_s = time.perf_counter() - started
    return transfer


def to_sample(
    index: int, fmt: str, start_s: float, transfer: Transfer, decode: bool
) -> tuple[Sample, bytes | None]:
    """The sample of a finished transfer, and its body when the audio is still to be decoded."""
    body = bytes(transfer.body)
    sample = Sample(
        index=index, format=fmt, start_s=start_s, status=transfer.status, error=transfer.error,
        size_bytes=len(body), headers_s=transfer.headers_s, ttfb_s=transfer.ttfb_s,
        latency_s=transfer.latency_s, retry_after_s=parse_retry_after(transfer.retry_after),
    )  # fmt: skip
    if transfer.error is not None:
        return sample, None
    if transfer.status != 200:
        sample.error = f"http_{transfer.status}"
        sample.error_body_ok = is_openai_error(body)
        return sample, None
    return judge_audio(sample, body, decode)


def judge_audio(sample: Sample, body: bytes, decode: bool) -> tuple[Sample, bytes | None]:
    if sample.format in EXACT_FORMATS:
        set_audio(sample, measure_audio(sample.format, body))
    elif not body:
        sample.error = "bad_audio"
    elif decode:
        return sample, body
    return sample, None


def set_audio(sample: Sample, seconds: float | None) -> None:
    sample.audio_s = seconds
    if seconds is None:
        sample.error = "bad_audio"


class Dispatcher:
    """Hands out request indices: a fixed number of them, or as many as start before a deadline."""

    def __init__(self, total: int | None, deadline: float | None) -> None:
        self._total = total
        self._deadline = deadline
        self._issued = 0

    def next_index(self) -> int | None:
        if self._total is not None and self._issued >= self._total:
            return None
        if self._deadline is not None and time.perf_counter() >= self._deadline:
            return None
        self._issued += 1
        return self._issued - 1

    def remaining_s(self) -> float | None:
        return None if self._deadline is None else self._deadline - time.perf_counter()


@dataclass
class Phase:
    """The requests of one phase of a level (warm-up or measured) as its workers record them."""

    client: httpx.AsyncClient
    config: LoadConfig
    dispatcher: Dispatcher
    started: float = field(default_factory=time.perf_counter)
    samples: list[Sample] = field(default_factory=list)
    undecoded: list[tuple[Sample, bytes]] = field(default_factory=list)


async def worker(phase: Phase) -> None:
    config = phase.config
    while (index := phase.dispatcher.next_index()) is not None:
        sent = time.perf_counter()
        transfer = await fetch(phase.client, config, index)
        sample, body = to_sample(
            index, config.format_for(index), sent - phase.started, transfer, config.decode
        )
        phase.samples.append(sample)
        if body is not None:
            phase.undecoded.append((sample, body))
        if config.honor_retry_after and sample.status == 503:
            remaining = phase.dispatcher.remaining_s()
            await asyncio.sleep(backoff_seconds(sample.retry_after_s, config.retry_after_cap, remaining))


async def run_phase(
    client: httpx.AsyncClient, config: LoadConfig, concurrency: int, dispatcher: Dispatcher
) -> Phase:
    phase = Phase(client, config, dispatcher)
    await asyncio.gather(*(worker(phase) for _ in range(concurrency)))
    return phase


async def measure_level(config: LoadConfig, concurrency: int) -> tuple[Phase, float]:
    """Warm-up (discarded), then the measured phase; returns it with its wall time."""
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=config.url, limits=limits, timeout=config.timeout) as client:
        if config.warmup:
            await run_phase(client, config, concurrency, Dispatcher(config.warmup, None))
        started = time.perf_counter()
        deadline = None if config.duration is None else started + config.duration
        phase = await run_phase(client, config, concurrency, Dispatcher(config.requests, deadline))
        return phase, time.perf_counter() - started


def run_level(config: LoadConfig, concurrency: int) -> LevelResult:
    """One concurrency level in its own event loop; compressed audio is decoded once the clock stopped."""
    if concurrency < 1:
        raise ValueError("concurrency must be at least 1")
    phase, wall_s = asyncio.run(measure_level(config, concurrency))
    for sample, body in phase.undecoded:
        set_audio(sample, decoded_seconds(body))
    return summarize(concurrency, phase.samples, wall_s)


def summarize(concurrency: int, samples: Sequence[Sample], wall_s: float) -> LevelResult:
    ok = [s for s in samples if s.ok]
    audio = sum((s.audio_s for s in ok if s.audio_s is not None), 0.0)
    retry_afters = [s.retry_after_s for s in samples if s.status == 503 and s.retry_after_s is not None]
    per_s = 1 / wall_s if wall_s > 0 else 0.0
    return LevelResult(
        concurrency=concurrency, requests=len(samples), ok=len(ok), failed=len(samples) - len(ok),
        wall_s=wall_s, requests_per_s=len(samples) * per_s, ok_per_s=len(ok) * per_s, audio_s=audio,
        audio_unmeasured=sum(s.audio_s is None for s in ok), audio_s_per_s=audio * per_s,
        status_counts=count(str(s.status) if s.status is not None else "none" for s in samples),
        error_kinds=count(s.error for s in samples if s.error is not None),
        formats=count(s.format for s in samples),
        retry_after_s=retry_after_stats(retry_afters),
        missing_retry_after=sum(s.status == 503 and s.retry_after_s is None for s in samples),
        bad_error_bodies=sum(s.error_body_ok is False for s in samples),
        ttfb_s=spread([s.ttfb_s for s in ok if s.ttfb_s is not None]),
        latency_s=spread([s.latency_s for s in ok]),
        headers_s=spread([s.headers_s for s in ok if s.headers_s is not None]),
        bytes_total=sum(s.size_bytes for s in samples),
        bytes_ok_mean=statistics.fmean(s.size_bytes for s in ok) if ok else None,
        samples=list(samples),
    )  # fmt: skip


def level_record(level: LevelResult) -> dict[str, Any]:
    """The figures of a level that every server benchmark reports the same way (its samples left out)."""
    return {
        "concurrency": level.concurrency,
        "requests": level.requests,
        "ok": level.ok,
        "failed": level.failed,
        "status_counts": level.status_counts,
        "error_kinds": level.error_kinds,
        "wall_s": round(level.wall_s, 3),
        "audio_s": round(level.audio_s, 3),
        "audio_s_per_s": round(level.audio_s_per_s, 4),
        "requests_per_s": round(level.requests_per_s, 4),
        "ttfb_p50_s": rounded(level.ttfb_s, "p50"),
        "ttfb_p95_s": rounded(level.ttfb_s, "p95"),
        "latency_p50_s": rounded(level.latency_s, "p50"),
        "latency_p95_s": rounded(level.latency_s, "p95"),
    }


def count(keys: Any) -> dict[str, int]:
    return dict(sorted(Counter(keys).items()))


TABLE_HEADER = (
    f"{'conc':>5} {'reqs':>6} {'ok':>6} {'503':>5} {'fail':>5} {'req/s':>7} {'audio/s':>8} "
    f"{'ttfb p50/p95/max s':>20} {'latency p50/p95/max s':>23} {'retry-after min/med/max':>24} {'MB':>7}"
)


def _spread_cell(values: Spread | None) -> str:
    return "-" if values is None else f"{values.p50:.2f}/{values.p95:.2f}/{values.max:.2f}"


def _retry_after_cell(values: RetryAfterStats | None) -> str:
    return "-" if values is None else f"{values.min:g}/{values.median:g}/{values.max:g}"


def table_row(level: LevelResult) -> str:
    row = (
        f"{level.concurrency:>5} {level.requests:>6} {level.ok:>6} {level.status_counts.get('503', 0):>5} "
        f"{level.failed:>5} {level.requests_per_s:>7.2f} {level.audio_s_per_s:>8.2f} "
        f"{_spread_cell(level.ttfb_s):>20} {_spread_cell(level.latency_s):>23} "
        f"{_retry_after_cell(level.retry_after_s):>24} {level.bytes_total / 1e6:>7.2f}"
    )
    if level.error_kinds:
        row += "\n      errors: " + " ".join(f"{kind}={n}" for kind, n in level.error_kinds.items())
    return row


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", default="http://127.0.0.1:8880", help="the server's base URL")
    parser.add_argument("--clients", nargs="+", type=positive_int, default=[4], help="levels, in turn")
    amount = parser.add_mutually_exclusive_group()
    amount.add_argument("--requests", type=positive_int, help=f"requests per level ({DEFAULT_REQUESTS})")
    amount.add_argument("--duration", type=positive_float, help="seconds per level, instead of --requests")
    parser.add_argument("--warmup", type=non_negative_int, default=0, help="requests per level not counted")
    parser.add_argument("--stream", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--format", nargs="+", choices=FORMATS, default=["mp3"], help="rotated per request")
    parser.add_argument("--voice", default="af_heart")
    parser.add_argument("--model", default="kokoro")
    parser.add_argument("--speed", type=positive_float, default=1.0)
    texts = parser.add_mutually_exclusive_group()
    texts.add_argument("--texts", choices=[*TEXTS, "mixed"], default="medium", help="built-in texts")
    texts.add_argument("--text-file", type=Path, help="texts separated by blank lines, rotated per request")
    parser.add_argument("--timeout", type=positive_float, default=120.0, help="seconds per whole request")
    decode_help = "decode mp3/opus/aac/flac with PyAV after each level to count their audio seconds"
    parser.add_argument("--decode", action=argparse.BooleanOptionalAction, default=True, help=decode_help)
    parser.add_argument("--honor-retry-after", action="store_true", help="a worker sleeps after a 503")
    parser.add_argument("--retry-after-cap", type=float, default=10.0, help="longest such sleep, seconds")
    parser.add_argument("--samples", action="store_true", help="put every request's record in the JSON")


def prepare(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.requests is None and args.duration is None:
        args.requests = DEFAULT_REQUESTS


def builtin_texts(kind: str) -> tuple[str, ...]:
    if kind != "mixed":
        return TEXTS[kind]
    interleaved = itertools.chain.from_iterable(itertools.zip_longest(*TEXTS.values()))
    return tuple(text for text in interleaved if text is not None)


def read_texts(path: Path) -> tuple[str, ...]:
    blocks = (" ".join(block.split()) for block in path.read_text(encoding="utf-8").split("\n\n"))
    texts = tuple(block for block in blocks if block)
    if not texts:
        raise ValueError(f"{path} holds no text")
    return texts


def config_from_args(args: argparse.Namespace) -> LoadConfig:
    return LoadConfig(
        url=args.url, texts=read_texts(args.text_file) if args.text_file else builtin_texts(args.texts),
        formats=tuple(args.format), voice=args.voice, model=args.model, speed=args.speed, stream=args.stream,
        requests=None if args.duration is not None else args.requests, duration=args.duration,
        timeout=args.timeout, warmup=args.warmup, decode=args.decode,
        honor_retry_after=args.honor_retry_after, retry_after_cap=args.retry_after_cap,
    )  # fmt: skip


def run(args: argparse.Namespace) -> int:
    report = Report(args)
    config = config_from_args(args)
    print(TABLE_HEADER, flush=True)
    levels = []
    for clients in args.clients:
        levels.append(run_level(config, clients))
        print(table_row(levels[-1]), flush=True)
    client = {"httpx": httpx.__version__, "pyav": av.__version__}
    records = [level.to_dict(include_samples=args.samples) for level in levels]
    report.write({"client": client, "levels": records})
    return 0 if any(level.ok for level in levels) else 1
