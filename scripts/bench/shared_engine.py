"""The shared engine's loop against a simulated GPU: does one engine process keep its device busy?

The real server (`python -m api --workers W`, every worker a `RemoteEngine`) runs over one engine process
that runs the real loop (api/engine/shared.py `serve`, the real `Scheduler`) with a simulated GPU instead of
the model, under closed-loop streaming clients (`load`'s). Two layouts by default:

- sequential: each worker one call in flight, one engine lane (the layout measured on an H100 in
  docs/journal/gpu.md, entry 13: the GPU half idle);
- pipelined: each worker KOKORO_SHARED_ENGINE_CALLS calls in flight and the engine's lanes (the defaults).

The simulated device is one queue: a call holds the GIL for LAUNCH_S (Python launching the batch's
kernels), then its batch occupies the device for FIXED_S + padded tokens x PER_TOKEN_S after whatever is on
it, and the call waits without the GIL for its batch to leave the device, as a host sync does. Launches
take turns, as they do on one GIL: a lane launches only once no other lane is launching. The constants fit
the bare engine on an H100 (`gpu-engine`, bf16 prepared kernels, 120-token chunks;
docs/journal/gpu.md, entry 27): one thread 77 / 105 / 200 ms a call at 8 / 16 / 32 chunks (the model:
95 / 129 / 198), two lanes side by side 60 / 81 / 145 ms a call (the model, launches taking turns:
55 / 74 / 143; were they to overlap, 48 / 65 / 143).
Every time is multiplied by --slowdown so that the front end on this machine's cores keeps up (the
question here is the engine loop, not how many cores feed it). Its audio is a speech-like signal of the
real model's length.

Per level: the clients' audio-s/s and first audio p50/p95; then the engine side, over the whole level and
over its steady window (from --settle seconds into the measured phase to its deadline, every client with a
request in flight; the whole level also holds the warm-up, the ramp and the drain): the device's busy share
and audio-s/s, chunks, padded tokens and padding a call, the engine process's CPU a call and share of a core,
the chunks queued in it, the launches' share of the wall and the wait for a turn, and the machine's CPU.

    python -m scripts.tools.random_weights /tmp/random-weights
    python -m scripts.bench shared-engine --weights /tmp/random-weights --workers 4 --slowdown 10 \\
        --clients 32 128 --duration 60 --settle 20 --out bench-results/<machine>/shared-simulated.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from api.engine.base import SAMPLE_RATE, BatchPolicy, ChunkAudio, ReadyCallback, SynthesisItem
from scripts.bench import load
from scripts.bench.common import ROOT, Report, add_weights, positive_int, process_tree_cpu
from scripts.bench.simulated import SECONDS_PER_TOKEN, GpuModel, speech_like
from scripts.bench.simulated import SimulatedGpuEngine as SleepingGpuEngine
from scripts.harness import launch, process_env, serving, stop_process

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
        self.tokens = 0
        self.padded_tokens = 0
        self.turn_wait_s = 0.0  # calls waiting for their turn to launch
        self.in_call_s = 0.0  # lanes inside a call (waiting for the turn, launching, on the device)
        self.audio_s = 0.0  # the audio of the calls done

    def count_call(self, turn_wait_s: float, call_s: float, audio_s: float) -> None:
        with self._lock:
            self.turn_wait_s += turn_wait_s
            self.in_call_s += call_s
            self.audio_s += audio_s

    def enqueue(self, seconds: float, tokens: Sequence[int], at: float) -> float:
        """The time the batch launched at `at` leaves the device."""
        with self._lock:
            start = max(at, self._free_at)
            self._free_at = start + seconds
            self.busy_s += seconds
            self.batches += 1
            self.chunks += len(tokens)
            self.tokens += sum(tokens)
            self.padded_tokens += len(tokens) * max(tokens)
            return self._free_at

    def stats(self) -> dict[str, float]:
        with self._lock:
            now = time.monotonic()
            return {
                # the device time run so far: what is queued on it past now is not done yet
                "busy_s": self.busy_s - max(0.0, self._free_at - now),
                "batches": self.batches,
                "chunks": self.chunks,
                "tokens": self.tokens,
                "padded_tokens": self.padded_tokens,
                "turn_wait_s": self.turn_wait_s,
                "in_call_s": self.in_call_s,
                "audio_s": self.audio_s,
                "cpu_s": time.process_time(),
                "at": now,
            }


class SimulatedGpuEngine(SleepingGpuEngine):
    """`frontend`'s simulated torch engine on CUDA (vocabulary, batch policy, audio of the real length),
    with lanes on streams of their own and a `SimulatedDevice` in place of its sleep."""

    pooled_threads = False

    def __init__(self, model: DeviceModel, lanes: int, device: SimulatedDevice) -> None:
        super().__init__(GpuModel(model.fixed_s, model.per_token_s), SECONDS_PER_TOKEN, speech_like(30.0))
        self.device_model = model
        self.lanes = lanes
        self.device = device
        self._launching = threading.Lock()  # one GIL: lanes launch their kernels in turn

    def claim_threads(self, every_thread: bool) -> None:
        return None

    def synthesize(
        self, items: Sequence[SynthesisItem], on_ready: ReadyCallback | None = None
    ) -> list[ChunkAudio]:
        model, tokens = self.device_model, [len(item.tokens) for item in items]
        called = time.monotonic()
        with self._launching:
            launched = time.monotonic()
            hold_gil_until(launched + model.launch_s * model.slowdown)
        done_at = self.device.enqueue(model.batch_seconds(tokens), tokens, time.monotonic())
        time.sleep(max(0.0, done_at - time.monotonic()))  # the host sync: the GIL is free meanwhile
        in_call = time.monotonic() - called
        results = [ChunkAudio(self._audio(len(item.tokens), item.speed)) for item in items]
        audio_s = sum(len(audio.samples) for audio in results) / SAMPLE_RATE
        self.device.count_call(launched - called, in_call, audio_s)
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
    from api.engine.scheduling.scheduler import Scheduler
    from api.engine.shared import serve_until_stopped
    from api.engine.torch_engine import gpu_batch_policy

    device = SimulatedDevice()
    model = DeviceModel(args.fixed_s, args.per_token_s, args.launch_s, args.slowdown)
    engine = SimulatedGpuEngine(model, args.lanes, device)
    engine.batch_defaults = batch_policy(gpu_batch_policy(args.lanes), args)  # TorchEngine's on a GPU
    scheduler = Scheduler(engine, max_queued=1_000_000)  # type: ignore[arg-type]
    stats = Path(args.stats)

    queued = {"queued_sum": 0.0, "queued_samples": 0}

    def report() -> None:
        while True:
            queued["queued_sum"] += scheduler.queued
            queued["queued_samples"] += 1
            partial = stats.with_suffix(".part")
            partial.write_text(json.dumps({**device.stats(), **queued}))
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
    if args.launch_tokens is not None:
        policy = replace(policy, launch_tokens=args.launch_tokens)
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
        "pipelined": Layout("pipelined", args.calls or DEFAULT_CALLS, args.engine_lanes or SHARED_GPU_LANES),
    }
    return [known[name] for name in args.layouts]


@contextlib.contextmanager
def running(layout: Layout, args: argparse.Namespace, work: Path) -> Iterator[tuple[str, int, Path]]:
    """The engine process and the server; yields the server's URL, the engine process's pid, its stats."""
    socket_path, stats = work / f"{layout.name}.sock", work / f"{layout.name}-stats.json"
    model = ["--fixed-s", str(args.fixed_s), "--per-token-s", str(args.per_token_s)]
    model += ["--launch-s", str(args.launch_s), "--slowdown", str(args.slowdown)]
    if args.busy_timeout_ms is not None and layout.lanes > 1:
        model += ["--busy-timeout-ms", str(args.busy_timeout_ms)]
    policy_flags = (
        ("--length-ratio", args.length_ratio),
        ("--max-batch-size", args.max_batch_size),
        ("--launch-tokens", args.launch_tokens),
    )
    for flag, value in policy_flags:
        if value is not None:
            model += [flag, str(value)]
    command = [sys.executable, "-m", "scripts.bench", "shared-engine", "engine", str(socket_path)]
    command += ["--stats", str(stats), "--lanes", str(layout.lanes), *model]
    engine = subprocess.Popen(command, cwd=ROOT, env=process_env())
    top = max(args.clients)
    server_env = process_env(
        args.weights,
        KOKORO_ENGINE_SOCKET=str(socket_path),
        KOKORO_SHARED_ENGINE_CALLS=str(layout.calls),
        KOKORO_MAX_INFLIGHT=str(math.ceil(top / args.workers) + 1),
        KOKORO_MAX_WAITING=str(top),
        KOKORO_MAX_QUEUED_CHUNKS=str(top * 16),
        KOKORO_LOG_LEVEL="warning",
    )
    server = launch(server_env, work / f"{layout.name}-server.log", workers=args.workers)
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
    texts = load.builtin_texts(args.texts)
    rows = []
    with running(layout, args, work) as (url, engine_pid, stats):
        for fmt in args.format:
            for concurrency in args.clients:
                config = load.LoadConfig(
                    url=url, texts=texts, formats=(fmt,), requests=None, duration=args.duration,
                    timeout=args.timeout, warmup=min(concurrency, args.max_warmup), decode=False,
                )  # fmt: skip
                with sampling(stats, engine_pid) as snapshots:
                    level = load.run_level(config, concurrency)
                    ended = time.monotonic()
                started = ended - level.wall_s  # the measured phase, after the warm-up
                steady = (started + args.settle, started + args.duration)
                rows.append(level_row(layout, fmt, level, snapshots, steady, args.launch_s * args.slowdown))
                print(json.dumps(rows[-1]), flush=True)
    return {
        "layout": layout.name,
        "calls_per_worker": layout.calls,
        "engine_lanes": layout.lanes,
        "levels": rows,
    }


@contextlib.contextmanager
def sampling(stats: Path, engine_pid: int) -> Iterator[list[dict[str, float]]]:
    """Snapshots every 0.25 s while the block runs (one at each end too): the device's counters, the engine
    process's CPU seconds, and the machine's busy and total CPU ticks."""
    snapshots: list[dict[str, float]] = []
    stop = threading.Event()

    def snapshot() -> None:
        busy, total = machine_cpu_ticks()
        snapshots.append(
            {
                **read_stats(stats),
                "engine_cpu_s": process_tree_cpu(engine_pid),
                "machine_busy_ticks": busy,
                "machine_total_ticks": total,
                "taken_at": time.monotonic(),
            }
        )

    def run() -> None:
        while not stop.wait(0.25):
            snapshot()

    snapshot()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield snapshots
    finally:
        stop.set()
        thread.join()
        snapshot()


def machine_cpu_ticks() -> tuple[int, int]:
    """Busy and total ticks of every core together, from /proc/stat (idle and iowait count as not busy)."""
    fields = [int(value) for value in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    total = sum(fields[:8])  # user nice system idle iowait irq softirq steal; guest time is inside user
    return total - fields[3] - fields[4], total


def level_row(
    layout: Layout,
    fmt: str,
    level: Any,
    snapshots: Sequence[Mapping[str, float]],
    steady: tuple[float, float],
    launch_s: float,
) -> dict[str, Any]:
    """One level: the clients' figures, and the engine side's over the whole level (warm-up, ramp and drain
    included) and over `steady` (from --settle seconds into the measured phase to its deadline, when every
    client has a request in flight)."""
    inside = [snap for snap in snapshots if steady[0] <= snap["taken_at"] <= steady[1]]
    return {
        "layout": layout.name,
        "format": fmt,
        **load.level_record(level),
        "whole_level": engine_figures(snapshots[0], snapshots[-1], launch_s),
        "steady": engine_figures(inside[0], inside[-1], launch_s) if len(inside) > 1 else None,
    }


def engine_figures(
    before: Mapping[str, float], after: Mapping[str, float], launch_s: float
) -> dict[str, Any]:
    """The engine side between two snapshots."""
    wall = after["at"] - before["at"]
    if wall <= 0:
        return {}
    batches = after["batches"] - before["batches"]

    def per_batch(key: str, scale: float = 1.0, digits: int = 1) -> float | None:
        return round(scale * (after[key] - before[key]) / batches, digits) if batches else None

    machine_ticks = after["machine_total_ticks"] - before["machine_total_ticks"]
    return {
        "seconds": round(wall, 1),
        "device_busy": round((after["busy_s"] - before["busy_s"]) / wall, 3),
        # the audio the device made, per second: the steady window's throughput, no drain in it
        "device_audio_s_per_s": round((after["audio_s"] - before["audio_s"]) / wall, 2),
        "batches": batches,
        "chunks_per_batch": per_batch("chunks", digits=2),
        "padded_tokens_per_batch": per_batch("padded_tokens"),
        # the chunks' own tokens over the padded ones: the rest is padding, device time spent on nothing
        "padding_efficiency": round(
            (after["tokens"] - before["tokens"]) / (after["padded_tokens"] - before["padded_tokens"]), 3
        )
        if after["padded_tokens"] > before["padded_tokens"]
        else None,
        "engine_cpu_ms_per_batch": per_batch("engine_cpu_s", 1000),
        "engine_cpu_share": round((after["engine_cpu_s"] - before["engine_cpu_s"]) / wall, 3),
        "engine_queued_chunks": _mean_queued(before, after),
        # launches (one at a time) over the wall: near 1.0, the launches alone keep the device from more
        "launching_share": round(batches * launch_s / wall, 3),
        "turn_wait_ms_per_batch": per_batch("turn_wait_s", 1000),
        # lanes inside a call, over the wall (at most the lanes + the first chunks' thread)
        "lanes_in_call": round((after["in_call_s"] - before["in_call_s"]) / wall, 2),
        # near 1.0, the front end has no core to spare, and the device waits on the CPU, not on the loop
        "machine_cpu_busy": round(
            (after["machine_busy_ticks"] - before["machine_busy_ticks"]) / machine_ticks, 3
        )
        if machine_ticks
        else None,
    }


def _mean_queued(before: Mapping[str, float], after: Mapping[str, float]) -> float | None:
    """Chunks waiting in the engine process's queue (not in a call), sampled every 0.2 s."""
    samples = after["queued_samples"] - before["queued_samples"]
    return round((after["queued_sum"] - before["queued_sum"]) / samples, 1) if samples else None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("command", nargs="?", default="measure", choices=("measure", "engine"))
    parser.add_argument("socket", nargs="?", help="engine: the socket to serve on")
    parser.add_argument("--stats", help="engine: where the device's counters go")
    parser.add_argument("--lanes", type=int, default=1, help="engine: its lanes")
    add_weights(parser)  # the server's voices: random weights do (scripts/tools/random_weights.py)
    parser.add_argument("--layouts", nargs="+", default=list(DEFAULT_LAYOUTS), choices=DEFAULT_LAYOUTS)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--clients", type=positive_int, nargs="+", default=[8, 32, 128])
    parser.add_argument("--format", nargs="+", default=["pcm"], choices=load.FORMATS)
    parser.add_argument("--duration", type=float, default=15.0, help="seconds per level, after warm-up")
    parser.add_argument(
        "--settle", type=float, default=5.0, help="seconds into a level before its steady window starts"
    )
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
        "--engine-lanes", type=int, help="pipelined: the engine's lanes (default: the shared GPU engine's)"
    )
    parser.add_argument(
        "--length-ratio", type=float, help="the engine's length_ratio (default: the GPU policy's)"
    )
    parser.add_argument(
        "--max-batch-size", type=int, help="the engine's max_batch_size (default: the GPU policy's)"
    )
    parser.add_argument(
        "--launch-tokens", type=int, help="the engine's launch_tokens (default: the GPU policy's for --lanes)"
    )


def run(args: argparse.Namespace) -> int:
    if args.command == "engine":
        run_engine_process(args)
        return 0
    report = Report(args)
    results: dict[str, Any] = {
        "device_model": {
            "fixed_s": args.fixed_s, "per_token_s": args.per_token_s, "launch_s": args.launch_s,
            "slowdown": args.slowdown,
        },
        "layouts": [],
    }  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="kokoro-shared-sim-") as work:
        for layout in layouts(args):
            results["layouts"].append(measure_layout(layout, args, Path(work)))
            report.write(results)
    return 0
