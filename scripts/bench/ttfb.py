"""Time to first audio byte of a streaming request, with a small first chunk vs a large one.

Starts the real server once per first-chunk budget (KOKORO_FIRST_CHUNK_TOKENS), sends the same paragraph
several times as a streaming request and records the time to the first body byte and to the last. JSON
out. The large budget (175 tokens) is what Kokoro-FastAPI's first chunk holds at least.

    python -m scripts.bench ttfb --weights DIR --budgets 175 40 --runs 5 \\
        --out bench-results/<machine>/ttfb.json
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from scripts.bench.common import ENGINES, Report, add_weights, positive_int
from scripts.harness import Server, launch, process_env, serving

PARAGRAPH = (
    "When the storm finally arrived, it came faster than anyone in the village had expected. The "
    "fishermen pulled their boats high onto the shingle, the baker closed his shutters, and the children "
    "were called in from the fields. By nightfall the wind was howling through the streets, rattling every "
    "loose tile and sending spray over the harbour wall."
)


def start(budget: int, weights: Path, engine: str, log_dir: Path) -> Server:
    """The server with a first-chunk budget of `budget` tokens, not yet ready."""
    env = process_env(weights, KOKORO_FIRST_CHUNK_TOKENS=str(budget), KOKORO_ENGINE=engine)
    return launch(env, log_dir / f"server-{budget}.log")


def one_request(url: str) -> dict[str, float]:
    body = {"input": PARAGRAPH, "voice": "af_heart", "response_format": "pcm", "stream": True}
    started = time.perf_counter()
    first = None
    size = 0
    with httpx.stream("POST", f"{url}/v1/audio/speech", json=body, timeout=300) as response:
        response.raise_for_status()
        for data in response.iter_bytes():
            if first is None and data:
                first = time.perf_counter() - started
            size += len(data)
    total = time.perf_counter() - started
    return {"ttfb_s": round(first or total, 3), "total_s": round(total, 3), "audio_s": round(size / 48000, 3)}


def measure(budget: int, weights: Path, engine: str, runs: int, log_dir: Path) -> dict[str, Any]:
    with serving(start(budget, weights, engine, log_dir)) as server:
        one_request(server.url)  # warm-up
        samples = [one_request(server.url) for _ in range(runs)]
    ttfb = [s["ttfb_s"] for s in samples]
    return {
        "first_chunk_tokens": budget,
        "engine": engine,
        "runs": samples,
        "ttfb_median_s": statistics.median(ttfb),
        "total_median_s": statistics.median(s["total_s"] for s in samples),
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_weights(parser)
    parser.add_argument("--budgets", nargs="+", type=positive_int, default=[175, 40])
    parser.add_argument("--engine", default="torch", choices=ENGINES)
    parser.add_argument("--runs", type=positive_int, default=5)


def run(args: argparse.Namespace) -> int:
    report = Report(args)
    log_dir = Path(tempfile.mkdtemp(prefix="kokoro-bench-ttfb-"))
    budgets = [measure(budget, args.weights, args.engine, args.runs, log_dir) for budget in args.budgets]
    for result in budgets:
        print(
            f"first chunk {result['first_chunk_tokens']:>3} tokens: TTFB median {result['ttfb_median_s']} s,"
            f" whole paragraph {result['total_median_s']} s"
        )
    report.write({"paragraph_chars": len(PARAGRAPH), "budgets": budgets})
    return 0
