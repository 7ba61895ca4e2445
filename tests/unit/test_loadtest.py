"""`python -m scripts.bench load` (scripts/bench/load.py) against a fake speech server in a thread: counts,
Retry-After, audio seconds, JSON."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import datetime, timedelta, timezone
from email.utils import format_datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from api.audio.encoder import WAV_UNKNOWN_SIZE, create_encoder, wav_header
from api.audio.formats import AudioFormat
from scripts.bench import __main__ as bench
from scripts.bench import load as loadtest

SAMPLE_RATE = 24000
PIECES = 3
PIECE_SAMPLES = 2400  # 0.1 s
PIECE_DELAY_S = 0.02
OK_AUDIO_S = PIECES * PIECE_SAMPLES / SAMPLE_RATE


# The fake server: what it answers depends on the request's input text.


def pcm_piece() -> bytes:
    return (np.sin(np.arange(PIECE_SAMPLES) / 10) * 8000).astype("<i2").tobytes()


def audio_pieces(fmt: str, pieces: int) -> list[bytes]:
    header = [wav_header(SAMPLE_RATE, WAV_UNKNOWN_SIZE)] if fmt == "wav" else []
    return header + [pcm_piece() for _ in range(pieces)]


async def slow(pieces: list[bytes], fail_after: int | None = None) -> AsyncIterator[bytes]:
    for number, piece in enumerate(pieces):
        if number == fail_after:
            raise RuntimeError("synthesis failed mid-stream")
        await asyncio.sleep(PIECE_DELAY_S)
        yield piece


def answer_ok(payload: dict[str, Any]) -> Response:
    pieces = audio_pieces(payload["response_format"], PIECES)
    if payload["stream"]:
        return StreamingResponse(slow(pieces))
    if payload["response_format"] == "wav":
        pieces[0] = wav_header(SAMPLE_RATE, PIECES * PIECE_SAMPLES * 2)
    return Response(b"".join(pieces))


def answer_busy(payload: dict[str, Any]) -> Response:
    error = {"message": "Too many requests queued", "type": "server_error", "param": None, "code": "busy"}
    return JSONResponse({"error": error}, status_code=503, headers={"Retry-After": "2"})


def answer_busy_plain(payload: dict[str, Any]) -> Response:
    return PlainTextResponse("busy", status_code=503, headers={"Retry-After": "5"})


def answer_break(payload: dict[str, Any]) -> Response:
    return StreamingResponse(slow(audio_pieces(payload["response_format"], PIECES), fail_after=2))


def answer_empty(payload: dict[str, Any]) -> Response:
    return Response(b"")


ANSWERS: dict[str, Callable[[dict[str, Any]], Response]] = {
    "ok": answer_ok,
    "busy": answer_busy,
    "busy-plain": answer_busy_plain,
    "break": answer_break,
    "empty": answer_empty,
}


async def speech(request: Request) -> Response:
    payload = await request.json()
    return ANSWERS[payload["input"]](payload)


def free_socket() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    return sock


@pytest.fixture(scope="module")
def server_url() -> Iterator[str]:
    app = Starlette(routes=[Route("/v1/audio/speech", speech, methods=["POST"])])
    server = uvicorn.Server(uvicorn.Config(app, log_level="critical", lifespan="off"))
    sock = free_socket()
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.started
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    server.should_exit = True
    thread.join(5)
    sock.close()


def config(url: str, texts: tuple[str, ...], **options: Any) -> Any:
    return loadtest.LoadConfig(url=url, texts=texts, formats=("pcm", "wav"), timeout=5.0, **options)


# Against the fake server.

MIXED = ("ok", "ok", "busy", "ok", "busy", "break", "empty", "busy-plain")


@pytest.fixture(scope="module")
def mixed_level(server_url: str) -> Any:
    return loadtest.run_level(config(server_url, MIXED, requests=len(MIXED)), 3)


def test_counts_statuses_and_error_kinds(mixed_level: Any) -> None:
    assert mixed_level.requests == 8
    assert mixed_level.ok == 3
    assert mixed_level.failed == 5
    # the broken stream and the empty body did answer 200 before failing
    assert mixed_level.status_counts == {"200": 5, "503": 3}
    assert mixed_level.error_kinds == {"bad_audio": 1, "http_503": 3, "incomplete": 1}
    assert mixed_level.formats == {"pcm": 4, "wav": 4}


def test_retry_after_values_and_error_bodies(mixed_level: Any) -> None:
    assert mixed_level.retry_after_s == loadtest.RetryAfterStats(count=3, min=2.0, median=2.0, max=5.0)
    assert mixed_level.missing_retry_after == 0
    assert mixed_level.bad_error_bodies == 1
    by_index = {sample.index: sample for sample in mixed_level.samples}
    assert by_index[2].error_body_ok is True
    assert by_index[7].error_body_ok is False


def test_audio_seconds_of_pcm_and_wav(mixed_level: Any) -> None:
    ok = [sample for sample in mixed_level.samples if sample.ok]
    assert sorted(sample.format for sample in ok) == ["pcm", "wav", "wav"]
    assert [sample.audio_s for sample in ok] == pytest.approx([OK_AUDIO_S] * 3)
    assert mixed_level.audio_s == pytest.approx(3 * OK_AUDIO_S)
    assert mixed_level.audio_s_per_s == pytest.approx(mixed_level.audio_s / mixed_level.wall_s)
    assert mixed_level.requests_per_s == pytest.approx(8 / mixed_level.wall_s)


def test_ttfb_comes_before_the_end_of_the_body(mixed_level: Any) -> None:
    ok = [sample for sample in mixed_level.samples if sample.ok]
    for sample in ok:
        assert sample.headers_s <= sample.ttfb_s < sample.latency_s
    assert mixed_level.ttfb_s.count == mixed_level.latency_s.count == 3
    assert mixed_level.ttfb_s.max < mixed_level.latency_s.max


def test_bytes_are_counted_for_every_request(mixed_level: Any) -> None:
    pcm_bytes = PIECES * PIECE_SAMPLES * 2
    assert mixed_level.bytes_ok_mean == pytest.approx((pcm_bytes + 2 * (pcm_bytes + 44)) / 3)
    assert mixed_level.bytes_total == sum(sample.size_bytes for sample in mixed_level.samples)


def test_whole_bodies_without_streaming(server_url: str) -> None:
    level = loadtest.run_level(config(server_url, ("ok",), requests=4, stream=False, warmup=1), 2)
    assert level.status_counts == {"200": 4}
    assert level.audio_s == pytest.approx(4 * OK_AUDIO_S)
    assert all(sample.ttfb_s < sample.latency_s for sample in level.samples)


def test_a_timed_level_ends_after_its_duration(server_url: str) -> None:
    level = loadtest.run_level(config(server_url, ("ok",), requests=None, duration=0.3), 2)
    assert level.requests >= 2
    assert level.ok == level.requests
    assert level.wall_s >= 0.3


def test_honoring_retry_after_sleeps_the_capped_value(server_url: str) -> None:
    options = {"requests": 3, "honor_retry_after": True, "retry_after_cap": 0.1}
    level = loadtest.run_level(config(server_url, ("busy",), **options), 1)
    assert level.status_counts == {"503": 3}
    assert level.wall_s >= 3 * 0.09


def test_connection_refused_counts_as_connect_error() -> None:
    sock = free_socket()  # bound, never listening: connections are refused
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    level = loadtest.run_level(config(url, ("ok",), requests=2), 1)
    sock.close()
    assert level.status_counts == {"none": 2}
    assert level.error_kinds == {"connect_error": 2}
    assert level.latency_s is None


def test_main_writes_every_level_to_json(
    server_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    texts = tmp_path / "texts.txt"
    texts.write_text("ok\n\nbusy\n")
    out = tmp_path / "load.json"
    argv = [
        "load", "--url", server_url, "--clients", "1", "2", "--requests", "4", "--format", "pcm", "wav",
        "--text-file", str(texts), "--out", str(out), "--label", "fake server", "--samples",
    ]  # fmt: skip
    assert bench.main(argv) == 0
    report = json.loads(out.read_text())
    assert report["label"] == "fake server"
    assert report["args"]["clients"] == [1, 2]
    assert report["machine"]["logical_cores"] >= 1
    assert [level["concurrency"] for level in report["results"]["levels"]] == [1, 2]
    level = report["results"]["levels"][1]
    assert level["status_counts"] == {"200": 2, "503": 2}
    assert level["retry_after_s"] == {"count": 2, "min": 2.0, "median": 2.0, "max": 2.0}
    assert level["audio_s"] == pytest.approx(2 * OK_AUDIO_S)
    assert set(level["latency_s"]) == {"count", "min", "mean", "p50", "p95", "p99", "max"}
    assert len(level["samples"]) == 4
    assert "http_503=2" in capsys.readouterr().out


def test_main_fails_when_nothing_succeeds(tmp_path: Path) -> None:
    sock = free_socket()
    argv = ["load", "--url", f"http://127.0.0.1:{sock.getsockname()[1]}", "--requests", "1"]
    assert bench.main(argv) == 1
    sock.close()


# Pure parts.


@pytest.mark.parametrize("q", [0, 10, 25, 50, 90, 95, 99, 100])
def test_percentile_matches_numpy_linear_interpolation(q: float) -> None:
    values = list(np.random.default_rng(7).exponential(size=37))
    assert loadtest.percentile(values, q) == pytest.approx(float(np.percentile(values, q)))


def test_percentile_edges() -> None:
    assert loadtest.percentile([3.0], 95) == 3.0
    assert loadtest.percentile([4.0, 1.0, 3.0, 2.0], 50) == 2.5
    assert loadtest.percentile([1.0, 2.0], 95) == pytest.approx(1.95)
    with pytest.raises(ValueError, match="no values"):
        loadtest.percentile([], 50)
    with pytest.raises(ValueError, match="within"):
        loadtest.percentile([1.0], 101)


def test_wav_seconds_reads_streamed_and_exact_headers() -> None:
    data = pcm_piece()
    assert loadtest.wav_seconds(wav_header(SAMPLE_RATE, WAV_UNKNOWN_SIZE) + data) == pytest.approx(0.1)
    assert loadtest.wav_seconds(wav_header(SAMPLE_RATE, len(data)) + data + b"junk") == pytest.approx(0.1)
    assert loadtest.wav_seconds(wav_header(SAMPLE_RATE, WAV_UNKNOWN_SIZE)) is None
    assert loadtest.wav_seconds(b"RIFF") is None
    assert loadtest.wav_seconds(data) is None


def test_pcm_seconds() -> None:
    assert loadtest.pcm_seconds(bytes(48000)) == 1.0
    assert loadtest.pcm_seconds(b"") is None
    assert loadtest.pcm_seconds(b"\x00\x01\x02") is None


@pytest.mark.parametrize("fmt", [AudioFormat.FLAC, AudioFormat.MP3])
def test_decoded_seconds_of_compressed_audio(fmt: AudioFormat) -> None:
    encoder = create_encoder(fmt, SAMPLE_RATE, streaming=True)
    samples = np.sin(np.arange(SAMPLE_RATE // 2, dtype=np.float32) / 10) * 0.5
    body = encoder.encode(samples) + encoder.finish()
    assert loadtest.decoded_seconds(body) == pytest.approx(0.5, abs=0.06)  # within one codec frame
    assert loadtest.decoded_seconds(b"not audio at all" * 10) is None
    assert loadtest.decoded_seconds(b"") is None


def test_parse_retry_after() -> None:
    assert loadtest.parse_retry_after("2") == 2.0
    assert loadtest.parse_retry_after("0.5") == 0.5
    assert loadtest.parse_retry_after(None) is None
    assert loadtest.parse_retry_after("soon") is None
    assert loadtest.parse_retry_after("-1") is None
    later = format_datetime(datetime.now(timezone.utc) + timedelta(seconds=30), usegmt=True)
    assert loadtest.parse_retry_after(later) == pytest.approx(30, abs=2)


def test_backoff_seconds_is_capped_and_ends_with_the_level() -> None:
    assert loadtest.backoff_seconds(2.0, 10.0, None) == 2.0
    assert loadtest.backoff_seconds(30.0, 10.0, None) == 10.0
    assert loadtest.backoff_seconds(None, 10.0, None) == loadtest.DEFAULT_RETRY_AFTER_S
    assert loadtest.backoff_seconds(2.0, 10.0, 0.5) == 0.5
    assert loadtest.backoff_seconds(2.0, 10.0, -1.0) == 0.0


def test_openai_error_shape() -> None:
    good = {"error": {"message": "m", "type": "server_error", "param": None, "code": None}}
    assert loadtest.is_openai_error(json.dumps(good).encode())
    assert not loadtest.is_openai_error(json.dumps({"error": {"message": "m"}}).encode())
    assert not loadtest.is_openai_error(json.dumps({"detail": "busy"}).encode())
    assert not loadtest.is_openai_error(b"busy")
    assert not loadtest.is_openai_error(b"\xff\xfe")


def test_config_rotates_formats_and_texts() -> None:
    cfg = loadtest.LoadConfig(url="http://x", texts=("a", "b", "c"), formats=("mp3", "pcm"))
    assert [cfg.format_for(i) for i in range(3)] == ["mp3", "pcm", "mp3"]
    assert [cfg.payload(i)["input"] for i in range(4)] == ["a", "b", "c", "a"]
    with pytest.raises(ValueError, match="exactly one"):
        loadtest.LoadConfig(url="http://x", texts=("a",), requests=None)


def test_mixed_texts_interleave_lengths() -> None:
    texts = loadtest.builtin_texts("mixed")
    assert texts[:3] == (loadtest.TEXTS["short"][0], loadtest.TEXTS["medium"][0], loadtest.TEXTS["long"][0])
    assert len(texts) == sum(len(group) for group in loadtest.TEXTS.values())
