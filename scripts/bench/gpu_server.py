"""The real server on a GPU machine under closed-loop streaming load: throughput, time to first audio and
GPU utilization per concurrency level, for one or several server layouts.

For each --workers value W (and each --variant, a named set of server settings) the server is started as
deployed (`python -m api --workers W`, the torch engine on --device, every worker its own model on the one
GPU), `load`'s closed-loop client runs each --clients level for --duration seconds after a warm-up, and
`nvidia-smi` samples the GPU every 200 ms meanwhile. Per level: audio seconds per wall second, time to first
audio byte p50/p95 (streamed pcm: the first body byte is audio), latency, 503s, the GPU's mean utilization
(the share of time a kernel ran: a busy-ness, not a measure of how full the SMs are) and its peak memory.
Admission limits are raised so that the intended concurrency gets no 503 (KOKORO_MAX_INFLIGHT = the highest
level / W + 1 per worker, KOKORO_MAX_WAITING the highest level).

The client is one Python process on the same machine: its CPU (an event loop reading every stream) is
part of the figures; `client_cpu_s` per level says how much it took.

    python -m scripts.tools.random_weights /tmp/random-weights
    python -m scripts.bench gpu-server --weights /tmp/random-weights --workers 1 4 \\
        --clients 1 8 32 64 128 256 --duration 20 --out bench-results/gpu-h100/server.json
    python -m scripts.bench gpu-server --weights /tmp/random-weights --workers 4 \\
        --variant bf16 KOKORO_TORCH_PRECISION=bf16 --variant fp32 KOKORO_TORCH_PRECISION=fp32
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import resource
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scripts.bench import load
from scripts.bench.common import (
    Report,
    add_weights,
    logged_allocator,
    parse_env,
    positive_int,
    replica_memory,
    warn,
)
from scripts.harness import Deployment, ServerPlan, deployed


@dataclass
class GpuSampler:
    """`nvidia-smi` polled every `period_ms`: (monotonic time, utilization %, memory MiB) rows."""

    period_ms: int = 200
    rows: list[tuple[float, float, float]] = field(default_factory=list)
    _process: subprocess.Popen[str] | None = None
    _thread: threading.Thread | None = None

    def start(self) -> None:
        query = "--query-gpu=utilization.gpu,memory.used"
        command = ["nvidia-smi", query, "--format=csv,noheader,nounits", f"-lms={self.period_ms}"]
        try:
            self._process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
        except FileNotFoundError:
            warn("no nvidia-smi: GPU utilization not sampled")
            return
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self._process is not None
        assert self._process.stdout is not None
        for line in self._process.stdout:
            try:
                utilization, memory = (float(part) for part in line.split(",")[:2])
            except ValueError:
                continue
            self.rows.append((time.monotonic(), utilization, memory))

    def stop(self) -> None:
        if self._process is not None:
            self._process.terminate()
            self._process.wait(timeout=5)

    def summary(self, start: float, end: float) -> dict[str, Any]:
        inside = [row for row in self.rows if start <= row[0] <= end]
        if not inside:
            return {"gpu_util_mean_pct": None, "gpu_memory_max_mib": None, "gpu_samples": 0}
        return {
            "gpu_util_mean_pct": round(sum(row[1] for row in inside) / len(inside), 1),
            "gpu_memory_max_mib": max(row[2] for row in inside),
            "gpu_samples": len(inside),
        }


def client_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def server_env(args: argparse.Namespace, workers: int, settings: dict[str, str]) -> dict[str, str]:
    top = max(args.clients)
    return {
        **os.environ,
        "KOKORO_WEIGHTS_DIR": str(args.weights),
        "KOKORO_ENGINE": "torch",
        "KOKORO_DEVICE": args.device,
        "KOKORO_FETCH_WEIGHTS": "false",
        "KOKORO_MAX_INFLIGHT": str(math.ceil(top / workers) + 1),
        "KOKORO_MAX_WAITING": str(top),
        "KOKORO_MAX_WAIT_S": str(args.timeout),
        **settings,
    }


@contextmanager
def server(
    args: argparse.Namespace, workers: int, settings: dict[str, str], log_dir: Path
) -> Iterator[Deployment]:
    log_dir = log_dir / f"w{workers}-{len(list(log_dir.iterdir()))}"
    log_dir.mkdir(parents=True, exist_ok=True)
    plan = ServerPlan(server_env(args, workers, settings), None, log_dir)
    with deployed(plan, workers, args.threads) as deployment:
        yield deployment


def engine_batches(url: str) -> tuple[float, float]:
    """(engine calls, chunks in them) so far, from /metrics: every worker's, and the shared engine
    process's when there is one (prometheus-client's multiprocess files)."""
    import httpx

    text = httpx.get(f"{url}/metrics", timeout=30).text
    found = {"count": 0.0, "sum": 0.0}
    for line in text.splitlines():
        for key in found:
            if line.startswith(f"kokoro_engine_batch_size_{key} "):
                found[key] += float(line.split()[1])
    return found["count"], found["sum"]


def batch_figures(before: tuple[float, float], after: tuple[float, float]) -> dict[str, Any]:
    """Engine calls during a level (its warm-up requests included) and their mean size in chunks."""
    calls, chunks = after[0] - before[0], after[1] - before[1]
    return {"engine_calls": calls, "chunks_per_call": round(chunks / calls, 2) if calls else None}


def level_row(level: load.LevelResult, gpu: dict[str, Any], cpu_s: float) -> dict[str, Any]:
    return {**load.level_record(level), "client_cpu_s": round(cpu_s, 2), **gpu}


def run_layout(
    args: argparse.Namespace, workers: int, name: str, settings: dict[str, str], log_dir: Path
) -> dict[str, Any]:
    texts = load.builtin_texts(args.texts)
    sampler = GpuSampler()
    sampler.start()
    levels = []
    started = time.monotonic()
    try:
        with server(args, workers, settings, log_dir) as deployment:
            ready_s = time.monotonic() - started
            allocator = logged_allocator(deployment.processes[0].log())
            for fmt, concurrency in itertools.product(args.format, args.clients):
                config = load.LoadConfig(
                    url=deployment.url, texts=texts, formats=(fmt,), voice=args.voice,
                    requests=None, duration=args.duration, timeout=args.timeout,
                    warmup=max(workers, min(concurrency, args.max_warmup)), decode=fmt != "pcm",
                )  # fmt: skip
                batches_before = engine_batches(deployment.url)
                cpu_before, start = client_cpu_s(), time.monotonic()
                level = load.run_level(config, concurrency)
                end = time.monotonic()
                row = {
                    "format": fmt,
                    **level_row(level, sampler.summary(start, end), client_cpu_s() - cpu_before),
                }
                row.update(batch_figures(batches_before, engine_batches(deployment.url)))
                row["server_rss_mib"] = replica_memory(deployment.replica_pids())
                levels.append(row)
                print(table_line(name, workers, row), flush=True)
    finally:
        sampler.stop()
    return {
        "variant": name,
        "workers": workers,
        "settings": settings,
        "ready_s": round(ready_s, 1),
        "allocator": allocator,
        "levels": levels,
    }


TABLE_HEADER = (
    f"{'variant':<10} {'W':>2} {'fmt':>4} {'conc':>4} {'ok':>5} {'fail':>4} {'audio-s/s':>9} "
    f"{'TTFA p50/p95 s':>15} {'lat p50 s':>9} {'GPU %':>5} {'GPU MiB':>7} {'B':>5} {'client s':>8}"
)


def table_line(name: str, workers: int, row: dict[str, Any]) -> str:
    ttfa = f"{row['ttfb_p50_s'] or 0:.3f}/{row['ttfb_p95_s'] or 0:.3f}"
    util = "-" if row["gpu_util_mean_pct"] is None else f"{row['gpu_util_mean_pct']:.0f}"
    memory = "-" if row["gpu_memory_max_mib"] is None else f"{row['gpu_memory_max_mib']:.0f}"
    return (
        f"{name:<10} {workers:>2} {row['format']:>4} {row['concurrency']:>4} {row['ok']:>5} "
        f"{row['failed']:>4} {row['audio_s_per_s']:>9.1f} {ttfa:>15} {row['latency_p50_s'] or 0:>9.3f} "
        f"{util:>5} {memory:>7} "
        f"{row['chunks_per_call'] or 0:>5.1f} {row['client_cpu_s']:>8.1f}"
    )


def knee(levels: Sequence[dict[str, Any]], gain: float = 1.1) -> int | None:
    """The last concurrency level whose throughput is at least `gain` times the level before it: past it,
    more clients mostly add waiting."""
    best = None
    for before, after in zip(levels, levels[1:], strict=False):
        if before["audio_s_per_s"] and after["audio_s_per_s"] >= gain * before["audio_s_per_s"]:
            best = after["concurrency"]
    return best


def parse_variant(values: Sequence[str]) -> tuple[str, dict[str, str]]:
    name, *pairs = values
    try:
        return name, parse_env(pairs)
    except ValueError as exc:
        raise SystemExit(f"--variant {name}: {exc}") from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_weights(parser)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--workers", nargs="+", type=positive_int, default=[1])
    parser.add_argument(
        "--variant", nargs="+", action="append", metavar="NAME [KEY=VALUE ...]",
        help="a named set of server settings (repeatable; WORKERS=N sets its worker count); default: one "
        "variant, 'default', with none",
    )  # fmt: skip
    parser.add_argument("--threads", type=int, default=2, help="CPU threads per worker (torch, OpenMP)")
    parser.add_argument("--clients", nargs="+", type=positive_int, default=[1, 8, 32, 64, 128, 256])
    parser.add_argument("--duration", type=float, default=20.0, help="seconds per level, after warm-up")
    parser.add_argument("--max-warmup", type=int, default=16, help="most warm-up requests per level")
    parser.add_argument("--format", nargs="+", default=["pcm"], help="each measured at every level, in turn")
    parser.add_argument("--texts", default="mixed")
    parser.add_argument("--voice", default="af_heart")
    parser.add_argument("--timeout", type=float, default=300.0)


def run(args: argparse.Namespace) -> int:
    variants = [parse_variant(values) for values in args.variant] if args.variant else [("default", {})]
    log_dir = Path(tempfile.mkdtemp(prefix="kokoro-gpu-server-"))
    report = Report(args)
    results: dict[str, Any] = {"logs": str(log_dir), "layouts": []}
    print(TABLE_HEADER, flush=True)
    for name, settings in variants:
        # WORKERS=N in a variant: that variant's worker count, instead of each of --workers.
        counts = [int(settings.pop("WORKERS"))] if "WORKERS" in settings else args.workers
        for workers in counts:
            layout = run_layout(args, workers, name, settings, log_dir)
            first_format = [row for row in layout["levels"] if row["format"] == args.format[0]]
            layout["knee_concurrency"] = knee(first_format)
            results["layouts"].append(layout)
            report.write(results)
    return 0
