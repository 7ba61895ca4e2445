"""How each engine's speed scales with its thread count: one fresh process per (engine, threads).

OMP_NUM_THREADS and the engine's own setting (KOKORO_TORCH_THREADS / KOKORO_ONNX_THREADS) are set before
torch or onnxruntime is imported, so each thread count runs in its own subprocess (scripts/bench/measure.py).
There the bare engine (no server) synthesizes each text: one warm-up, then `--runs` timed runs. A text is
cut into chunks as the server cuts it (`--chunking server`: normalized, a short first chunk, then chunks of
the settings' sizes: 100-150 tokens since 2026-11-23, 175-250 before), or kept as one chunk of up to 450
tokens (`--chunking whole`, as `engine` does); chunks go to the engine one at a time, in order.
The texts are `engine`'s short (28 tokens), medium (142) and long (427) ones; voice af_heart;
torch is fp32, onnx the int8 model.

Per engine, thread count and text: mean and median latency of a run, real-time factor (median wall /
audio seconds; below 1 is faster than real time), audio seconds per second, and the speed-up over the
smallest thread count measured (1 by default) for the same engine and text. A table on stdout; JSON with
the arguments and the machine (CPU model and flags, cores, versions).

    python -m scripts.bench threads --weights ~/.cache/kokoro-openai-server/test-registry-weights \\
        --threads 1 2 4 8 --runs 10 --out bench-results/<machine>/threads.json
    python -m scripts.bench threads --threads 1 --runs 1 --texts short --engine onnx --out /tmp/t.json
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from scripts.bench.common import ENGINES, Report, add_weights, latency_stats, positive_int, ratio
from scripts.bench.measure import CHUNKINGS, ENGINE_TEXTS, VOICE, BareSpec, run_bare


def run_walls(timings: Sequence[dict[str, Any]]) -> list[float]:
    """The wall time of each run over a group of texts: run i is text 1's i-th wall + text 2's + ..."""
    return [sum(walls) for walls in zip(*(timing["wall_s"] for timing in timings), strict=True)]


def result_row(engine: str, threads: int, text: str, timings: Sequence[dict[str, Any]]) -> dict[str, Any]:
    walls = run_walls(timings)
    stats = latency_stats(walls)
    audio_s = sum(timing["audio_s"] for timing in timings)
    rtf = ratio(stats["median_s"], audio_s)
    speed = ratio(audio_s, stats["median_s"])
    return {
        "engine": engine,
        "threads": threads,
        "text": text,
        "tokens": sum(timing["tokens"] for timing in timings),
        "chunks": sum(timing["chunks"] for timing in timings),
        "audio_s": round(audio_s, 3),
        "wall_s": [round(wall, 4) for wall in walls],
        **stats,
        "rtf": None if rtf is None else round(rtf, 4),
        "audio_s_per_s": None if speed is None else round(speed, 3),
    }


def add_speedups(rows: list[dict[str, Any]]) -> None:
    """Each row's speed-up: median latency at the smallest thread count of its engine and text / its own."""
    for row in rows:
        peers = [peer for peer in rows if (peer["engine"], peer["text"]) == (row["engine"], row["text"])]
        baseline = min(peers, key=lambda peer: peer["threads"])
        speedup = ratio(baseline["median_s"], row["median_s"])
        row["speedup"] = None if speedup is None else round(speedup, 3)
        row["speedup_baseline_threads"] = baseline["threads"]


def rows_of(measured: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for text, timings in measured["groups"].items():
        row = result_row(measured["engine"], measured["threads"], text, timings)
        row["threads_effective"] = measured["threads_effective"]
        rows.append(row)
    return rows


TABLE_HEADER = (
    f"{'engine':<6} {'thr':>3} {'text':<7} {'tokens':>6} {'chunks':>6} {'audio s':>8} {'mean s':>8} "
    f"{'median s':>8} {'RTF':>7} {'audio/s':>8} {'speed-up':>8}"
)


def table_row(row: dict[str, Any]) -> str:
    speedup = "-" if row.get("speedup") is None else f"{row['speedup']:.2f}x"
    return (
        f"{row['engine']:<6} {row['threads']:>3} {row['text']:<7} {row['tokens']:>6} {row['chunks']:>6} "
        f"{row['audio_s']:>8.2f} {row['mean_s']:>8.3f} {row['median_s']:>8.3f} {row['rtf']:>7.3f} "
        f"{row['audio_s_per_s']:>8.2f} {speedup:>8}"
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_weights(parser)
    parser.add_argument("--engine", nargs="+", choices=ENGINES, default=list(ENGINES))
    parser.add_argument("--threads", nargs="+", type=positive_int, default=[1, 2, 4, 8])
    parser.add_argument("--runs", type=positive_int, default=10, help="timed runs per text, after 1 warm-up")
    parser.add_argument("--texts", nargs="+", choices=list(ENGINE_TEXTS), default=list(ENGINE_TEXTS))
    parser.add_argument("--chunking", choices=CHUNKINGS, default="server", help="see above (default server)")


def measure_all(args: argparse.Namespace) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Rows (engine, threads, text) and one record per measuring process."""
    rows, processes = [], []
    texts = {label: [ENGINE_TEXTS[label]] for label in args.texts}
    for engine in args.engine:
        for threads in sorted(set(args.threads)):
            spec = BareSpec(engine, threads, str(args.weights), texts, args.runs, args.chunking)
            measured = run_bare(spec)
            processes.append({key: measured[key] for key in PROCESS_KEYS})
            for row in rows_of(measured):
                rows.append(row)
                print(
                    f"  {engine} {threads} thread(s) {row['text']}: median {row['median_s']:.3f} s",
                    flush=True,
                )
    add_speedups(rows)
    return rows, processes


PROCESS_KEYS = ("engine", "threads", "threads_effective", "omp_num_threads", "peak_rss_mib")


def run(args: argparse.Namespace) -> int:
    report = Report(args)  # its load average is the one before the measurements
    rows, processes = measure_all(args)
    print(TABLE_HEADER)
    for row in rows:
        print(table_row(row))
    texts = {label: ENGINE_TEXTS[label] for label in args.texts}
    report.write({"voice": VOICE, "texts": texts, "rows": rows, "processes": processes})
    return 0
