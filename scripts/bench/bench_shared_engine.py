"""The shared engine's loop against a simulated GPU: does one engine process keep its device busy?

The real server (`python -m api --workers W`, every worker a `RemoteEngine`) runs over one engine process
that runs the real loop (api/engine/shared.py `serve`, the real `Scheduler`) with a simulated GPU instead of
the model, under closed-loop streaming clients (scripts/bench/loadtest.py). Two layouts by default:

- sequential: each worker one call in flight, one engine lane (the layout measured on an H100 in
  docs/journal/gpu.md, entry 13: the GPU half idle);
- pipelined: each worker KOKORO_SHARED_ENGINE_CALLS calls in flight and the engine's lanes (the defaults).

The simulated device is one queue: a call holds the GIL for LAUNCH_S (Python launching the batch's
kernels), then its batch occupies the device for FIXED_S + padded tokens x PER_TOKEN_S after whatever is on
it, and the call waits without the GIL for its batch to leave the device, as a host sync does. The
constants fit the bare engine on an H100 (scripts/gpu/bench_gpu_engine.py, bf16 prepared kernels, 120-token
chunks; docs/journal/gpu.md, entry 27): one thread 77 / 105 / 200 ms a call at 8 / 16 / 32 chunks (the
model: 95 / 129 / 198), two lanes side by side 60 / 81 / 145 ms a call (the model: 55 / 74 / 143).
Every time is multiplied by --slowdown so that the front end on this machine's cores keeps up (the
question here is the engine loop, not how many cores feed it). Its audio is a speech-like signal of the
real model's length.

Per level: audio-s/s, first audio p50/p95, the device's busy share, batches and chunks per batch, and the
engine process's CPU per batch.

    python scripts/tools/random_weights.py /tmp/random-weights
    python scripts/bench/bench_shared_engine.py --weights-dir /tmp/random-weights --workers 4 \\
        --concurrency 8 32 128 --out bench-results/<machine>/shared-engine-simulated.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a file: the repository's packages
from api.engine.base import BatchPolicy, ChunkAudio, ReadyCallback, SynthesisItem
from scripts.bench import bench_frontend, loadtest
from scripts.bench.bench_frontend import SECONDS_PER_TOKEN, process_tree_cpu, speech_like
from scripts.benchlib import ROOT, machine_info, recorded_args, write_report
from tests.harness import free_port, server_command, serving, spawn, stop_process

# The bare engine on an H100 (see above): the device's time per call, and Python's share of a call
# (launching a few thousand kernels at a few microseconds each, the GIL held).
FIXED_S = 0.005
PER_TOKEN_S = 36e-6
LAUNCH_S = 0.055
DEFAULT_LAYOUTS = ("sequential", "pipelined")
SERVER_READY_TIMEOUT_S = 180


@dataclass(frozen=True)
class DeviceModel:
    fixed_s: float = FIXED_S
    per_token_s: float = PER_TOKEN_S
    launch_s: float = LAUNCH_S
    slowdown: float = 1.0

    def batch_seconds(self, token_counts: Sequence[int]) -> float:
        padded = len(token_counts) * max(token_counts)
        return (self.fixed_s + padded * self.per_token_s) * self.slowdown


class SimulatedDevice:
    """One GPU's queue: batches run on it one after another, whichever lane launched them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._free_at = 0.0
        self.busy_s = 0.0
        self.batches = 0
        self.chunks = 0
        self.padded_tokens = 0

    def enqueue(self, seconds: float, chunks: int, padded_tokens: int, at: float) -> float:
        """The time the batch launched at `at` leaves the device."""
        with self._lock:
            start = max(at, self._free_at)
            self._free_at = start + seconds
            self.busy_s += seconds
            self.batches += 1
            self.chunks += chunks
            self.padded_tokens += padded_tokens
            return self._free_at

    def stats(self) -> dict[str, float]:
        with self._lock:
            return {
                "busy_s": self.busy_s,
                "batches": self.batches,
                "chunks": self.chunks,
                "padded_tokens": self.padded_tokens,
                "cpu_s": time.process_time(),
                "at": time.monotonic(),
            }


class SimulatedGpuEngine(bench_frontend.SimulatedGpuEngine):
    """bench_frontend's simulated torch engine on CUDA (vocabulary, batch policy, audio of the real length),
    with lanes on streams of their own and a `SimulatedDevice` in place of its sleep."""

    pooled_threads = False

    def __init__(self, model: DeviceModel, lanes: int, device: SimulatedDevice) -> None:
        super().__init__(
            bench_frontend.GpuModel(model.fixed_s, model.per_token_s), SECONDS_PER_TOKEN, speech_like(30.0)
        )
        self.device_model = model
        self.lanes = lanes
        self.device = device

    def claim_threads(self, every_thread: bool) -> None:
        return None

    def synthesize(
        self, items: Sequence[SynthesisItem], on_ready: ReadyCallback | None = None
    ) -> list[ChunkAudio]:
        model, tokens = self.device_model, [len(item.tokens) for item in items]
        hold_gil_until(time.monotonic() + model.launch_s * model.slowdown)
        done_at = self.device.enqueue(
            model.batch_seconds(tokens), len(items), len(items) * max(tokens), time.monotonic()
        )
        time.sleep(max(0.0, done_at - time.monotonic()))  # the host sync: the GIL is free meanwhile
        results = [ChunkAudio(self._audio(len(item.tokens), item.speed)) for item in items]
        if on_ready is not None:
            for index, audio in enumerate(results):
                on_ready(index, audio)
        return results


def hold_gil_until(deadline: float) -> None:
    """Busy Python work (it holds the GIL but for the interpreter's switch interval) until `deadline`."""
    while time.monotonic() < deadline:
        sum(range(200))


# --- the engine process --------------------------------------------------------------------------------


def run_engine_process(args: argparse.Namespace) -> None:
    """`engine SOCKET`: the real `serve` loop and `Scheduler` over the simulated GPU; its device's counters
    go to --stats every 0.2 s."""
    from api.engine.scheduler import Scheduler
    from api.engine.shared import serve_until_stopped

    device = SimulatedDevice()
    model = DeviceModel(args.fixed_s, args.per_token_s, args.launch_s, args.slowdown)
    engine = SimulatedGpuEngine(model, args.lanes, device)
    engine.batch_defaults = batch_policy(engine.batch_defaults, args)
    scheduler = Scheduler(engine, max_queued=1_000_000)  # type: ignore[arg-type]
    stats = Path(args.stats)

    def report() -> None:
        while True:
            partial = stats.with_suffix(".part")
            partial.write_text(json.dumps(device.stats()))
            partial.replace(stats)
            time.sleep(0.2)

    threading.Thread(target=report, daemon=True).start()
    serve_until_stopped(scheduler, Path(args.socket))


def batch_policy(policy: BatchPolicy, args: argparse.Namespace) -> BatchPolicy:
    """The GPU policy with --busy-timeout-ms, --length-ratio and --max-batch-size where given."""
    if args.busy_timeout_ms is not None:
        policy = replace(policy, busy_timeout=args.busy_timeout_ms / 1000)
    if args.length_ratio is not None:
        policy = replace(policy, length_ratio=args.length_ratio)
    if args.max_batch_size is not None:
        policy = replace(policy, max_batch_size=args.max_batch_size)
    return policy


# --- one layout --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Layout:
    name: str
    calls: int  # per worker
    lanes: int  # the engine's


def layouts(args: argparse.Namespace) -> list[Layout]:
    from api.engine.shared import DEFAULT_CALLS
    from api.engine.torch_engine import SHARED_GPU_LANES

    known = {
        "sequential": Layout("sequential", 1, 1),
        "pipelined": Layout("pipelined", args.calls or DEFAULT_CALLS, SHARED_GPU_LANES),
    }
    return [known[name] for name in args.layouts]


@contextlib.contextmanager
def running(layout: Layout, args: argparse.Namespace, work: Path) -> Iterator[tuple[str, int, Path]]:
    """The engine process and the server; yields the server's URL, the engine process's pid, its stats."""
    socket_path, stats = work / f"{layout.name}.sock", work / f"{layout.name}-stats.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    model = ["--fixed-s", str(args.fixed_s), "--per-token-s", str(args.per_token_s)]
    model += ["--launch-s", str(args.launch_s), "--slowdown", str(args.slowdown)]
    if args.busy_timeout_ms is not None and layout.lanes > 1:
        model += ["--busy-timeout-ms", str(args.busy_timeout_ms)]
    for flag, value in (("--length-ratio", args.length_ratio), ("--max-batch-size", args.max_batch_size)):
        if value is not None:
            model += [flag, str(value)]
    engine = subprocess.Popen(
        [
            sys.executable,
            __file__,
            "engine",
            str(socket_path),
            "--stats",
            str(stats),
            "--lanes",
            str(layout.lanes),
        ]
        + model,
        env=env,
    )
    port = free_port()
    top = max(args.concurrency)
    server_env = {
        **env,
        "KOKORO_ENGINE_SOCKET": str(socket_path),
        "KOKORO_SHARED_ENGINE_CALLS": str(layout.calls),
        "KOKORO_WEIGHTS_DIR": str(args.weights_dir),
        "KOKORO_FETCH_WEIGHTS": "false",
        "KOKORO_MAX_INFLIGHT": str(math.ceil(top / args.workers) + 1),
        "KOKORO_MAX_WAITING": str(top),
        "KOKORO_MAX_QUEUED_CHUNKS": str(top * 16),
        "KOKORO_LOG_LEVEL": "warning",
    }
    log_path = work / f"{layout.name}-server.log"
    server = spawn(server_command(port, workers=args.workers), log_path, port, server_env)
    try:
        with serving(server, SERVER_READY_TIMEOUT_S):  # /ready says 200 once every worker is ready
            yield server.url, engine.pid, stats
    finally:
        stop_process(engine)


def read_stats(path: Path) -> dict[str, float]:
    for _ in range(50):
        with contextlib.suppress(OSError, ValueError):
            return json.loads(path.read_text())  # type: ignore[no-any-return]
        time.sleep(0.1)
    raise RuntimeError(f"no device stats at {path}")


def measure_layout(layout: Layout, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    texts = loadtest.builtin_texts(args.texts)
    rows = []
    with running(layout, args, work) as (url, engine_pid, stats):
        for fmt in args.formats:
            for concurrency in args.concurrency:
                config = loadtest.LoadConfig(
                    url=url, texts=texts, formats=(fmt,), requests=None, duration=args.duration,
                    timeout=args.timeout, warmup=min(concurrency, args.max_warmup), decode=False,
                )  # fmt: skip
                before, cpu_before = read_stats(stats), process_tree_cpu(engine_pid)
                level = loadtest.run_level(config, concurrency)
                after, cpu_after = read_stats(stats), process_tree_cpu(engine_pid)
                rows.append(level_row(layout, fmt, level, before, after, cpu_after - cpu_before))
                print(json.dumps(rows[-1]), flush=True)
    return {
        "layout": layout.name,
        "calls_per_worker": layout.calls,
        "engine_lanes": layout.lanes,
        "levels": rows,
    }


def level_row(
    layout: Layout,
    fmt: str,
    level: Any,
    before: Mapping[str, float],
    after: Mapping[str, float],
    cpu_s: float,
) -> dict[str, Any]:
    """One level; the device's figures cover the warm-up requests too (the stats are read around both)."""
    wall = after["at"] - before["at"]
    batches = after["batches"] - before["batches"]
    chunks = after["chunks"] - before["chunks"]
    return {
        "layout": layout.name,
        "format": fmt,
        "concurrency": level.concurrency,
        "ok": level.ok,
        "failed": level.failed,
        "status_counts": level.status_counts,
        "audio_s_per_s": round(level.audio_s_per_s, 2),
        "ttfa_p50_s": level.ttfb_s.p50 if level.ttfb_s else None,
        "ttfa_p95_s": level.ttfb_s.p95 if level.ttfb_s else None,
        "device_busy": round((after["busy_s"] - before["busy_s"]) / wall, 3) if wall > 0 else None,
        "batches": batches,
        "chunks_per_batch": round(chunks / batches, 2) if batches else None,
        "padded_tokens_per_batch": round((after["padded_tokens"] - before["padded_tokens"]) / batches, 1)
        if batches
        else None,
        "engine_cpu_ms_per_batch": round(1000 * cpu_s / batches, 2) if batches else None,
        "engine_cpu_share": round(cpu_s / wall, 3) if wall > 0 else None,
    }


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("command", nargs="?", default="measure", choices=("measure", "engine"))
    parser.add_argument("socket", nargs="?", help="engine: the socket to serve on")
    parser.add_argument("--stats", help="engine: where the device's counters go")
    parser.add_argument("--lanes", type=int, default=1, help="engine: its lanes")
    parser.add_argument(
        "--weights-dir", type=Path, help="voices for the server (scripts/tools/random_weights.py)"
    )
    parser.add_argument("--layouts", nargs="+", default=list(DEFAULT_LAYOUTS), choices=DEFAULT_LAYOUTS)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[8, 32, 128])
    parser.add_argument("--formats", nargs="+", default=["pcm"])
    parser.add_argument("--duration", type=float, default=15.0, help="seconds per level, after warm-up")
    parser.add_argument("--max-warmup", type=int, default=16)
    parser.add_argument("--texts", default="mixed")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--fixed-s", type=float, default=FIXED_S)
    parser.add_argument("--per-token-s", type=float, default=PER_TOKEN_S)
    parser.add_argument("--launch-s", type=float, default=LAUNCH_S)
    parser.add_argument("--slowdown", type=float, default=1.0, help="the device's times x this")
    parser.add_argument(
        "--busy-timeout-ms", type=float, help="the engine's busy_timeout (default: the GPU policy's own)"
    )
    parser.add_argument("--calls", type=int, help="pipelined: calls per worker (default: the server's)")
    parser.add_argument(
        "--length-ratio", type=float, help="the engine's length_ratio (default: the GPU policy's)"
    )
    parser.add_argument(
        "--max-batch-size", type=int, help="the engine's max_batch_size (default: the GPU policy's)"
    )
    parser.add_argument("--out", type=Path)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.command == "engine":
        run_engine_process(args)
        return 0
    if args.weights_dir is None:
        raise SystemExit("--weights-dir is required (python scripts/tools/random_weights.py DIR makes one)")
    report: dict[str, Any] = {
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "args": recorded_args(args),
        "device_model": {
            "fixed_s": args.fixed_s,
            "per_token_s": args.per_token_s,
            "launch_s": args.launch_s,
            "slowdown": args.slowdown,
        },
        "machine": machine_info(),
        "layouts": [],
    }
    with tempfile.TemporaryDirectory(prefix="kokoro-shared-sim-") as work:
        for layout in layouts(args):
            report["layouts"].append(measure_layout(layout, args, Path(work)))
            if args.out:
                write_report(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
