"""Does a book job stay out of the way of interactive requests, and does it still get the idle capacity?

One server (`python -m api`, default settings over --weights-dir, its own data directory), then in one run:

1. speech alone: closed-loop streaming pcm clients (`load`'s) at 1 and at 4 clients,
   --requests each after --warmup; time to first audio (TTFB) p50 and throughput (audio-s/s);
2. a book job posted (--book-chars characters of the built-in paragraphs, repeated), and once it runs, the
   same loads again beside it;
3. the job alone for --job-window seconds: its audio-s/s from its progress (audio_seconds).

Ratios, within the run: first audio p50 with the job over without it, at 1 and 4 clients (the target is
at most 1.2), and the job's audio-s/s alone over the server's speech throughput at 4 clients (at least
0.9). The job is deleted at the end.

    python -m scripts.bench books --out bench-results/<machine>/books.json
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from scripts.bench import load
from scripts.bench.common import (
    PARAGRAPHS,
    Report,
    add_weights,
    book_text,
    non_negative_int,
    positive_int,
    ratio,
)
from scripts.harness import process_env, running

LEVELS = (1, 4)
TTFB_TARGET = 1.2
JOB_RATE_TARGET = 0.9


def speech_levels(url: str, args: argparse.Namespace) -> dict[str, Any]:
    levels = {}
    for clients in LEVELS:
        config = load.LoadConfig(
            url, PARAGRAPHS, formats=("pcm",), requests=args.requests, warmup=args.warmup, timeout=600
        )
        phase, wall_s = asyncio.run(load.measure_level(config, clients))
        level = load.summarize(clients, phase.samples, wall_s)
        levels[str(clients)] = load.level_record(level)
        print(f"  {clients} client(s): {levels[str(clients)]}", flush=True)
    return levels


def job_state(url: str, job_id: str) -> dict[str, Any]:
    job: dict[str, Any] = httpx.get(f"{url}/v1/audio/jobs/{job_id}", timeout=30).json()
    return job


def wait_running(url: str, job_id: str, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while job_state(url, job_id)["progress"]["chunks_done"] < 1:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the book job made no chunk in {timeout_s} s")
        time.sleep(0.5)


def job_rate(url: str, job_id: str, window_s: float) -> dict[str, Any]:
    """The job's audio seconds made per wall second over `window_s`, with nothing else asked of the server."""
    before, started = job_state(url, job_id), time.monotonic()
    time.sleep(window_s)
    after, ended = job_state(url, job_id), time.monotonic()
    made = after["progress"]["audio_seconds"] - before["progress"]["audio_seconds"]
    return {
        "window_s": round(ended - started, 1),
        "audio_s": round(made, 2),
        "audio_s_per_s": round(made / (ended - started), 3),
        "state_after": after["state"],
    }


def measure(args: argparse.Namespace, data_dir: Path) -> dict[str, Any]:
    env = process_env(args.weights, KOKORO_DATA_DIR=str(data_dir))
    with running(env, data_dir / "server.log") as server:
        print("speech alone:", flush=True)
        alone = speech_levels(server.url, args)
        body = {"input": book_text(args.book_chars), "response_format": "mp3", "title": "bench"}
        job = httpx.post(f"{server.url}/v1/audio/jobs", json=body, timeout=60).json()
        wait_running(server.url, job["id"])
        print("speech beside a book job:", flush=True)
        beside = speech_levels(server.url, args)
        during = job_state(server.url, job["id"])
        print("the book job alone:", flush=True)
        rate = job_rate(server.url, job["id"], args.job_window)
        print(f"  {rate}", flush=True)
        httpx.delete(f"{server.url}/v1/audio/jobs/{job['id']}", timeout=30)
    return {
        "alone": alone,
        "beside_job": beside,
        "job_progress_after_loads": during["progress"],
        "job_alone": rate,
    }


def ratios(result: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for clients in map(str, LEVELS):
        with_job, without = (
            result["beside_job"][clients]["ttfb_p50_s"],
            result["alone"][clients]["ttfb_p50_s"],
        )
        out[f"ttfb_p50_with_job_over_without_{clients}"] = (
            None if with_job is None or without is None else round(ratio(with_job, without) or 0, 3)
        )
    plain = result["alone"][str(LEVELS[-1])]["audio_s_per_s"]
    out["job_alone_over_speech_throughput"] = round(
        ratio(result["job_alone"]["audio_s_per_s"], plain) or 0, 3
    )
    out["targets"] = {"ttfb_ratio_at_most": TTFB_TARGET, "job_rate_ratio_at_least": JOB_RATE_TARGET}
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_weights(parser)
    parser.add_argument("--requests", type=positive_int, default=30, help="measured requests per level")
    parser.add_argument("--warmup", type=non_negative_int, default=2, help="requests not counted per level")
    parser.add_argument("--book-chars", type=positive_int, default=60_000, help="the book job's length")
    parser.add_argument("--job-window", type=float, default=60.0, help="seconds the job alone is watched")


def run(args: argparse.Namespace) -> int:
    report = Report(args)
    with tempfile.TemporaryDirectory(prefix="bench-books-") as folder:
        result = measure(args, Path(folder))
    report.write({**result, "ratios": ratios(result)})
    print(ratios(result))
    return 0
