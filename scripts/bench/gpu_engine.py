"""The bare engine on a GPU, as the server runs it but with no server: batches of B chunks through
`TorchEngine.synthesize` (prepared kernels, the server's precision, compiled), from one thread and from
`--lanes` threads at once (each on its own CUDA stream, as the scheduler's lanes run them).

The figure the server is held to: its audio-s/s against this one's at the batch sizes it forms. Items are
--tokens long with the af_heart-like zero style; a point is --calls calls per thread after one warm-up call.

    python -m scripts.tools.random_weights /tmp/random-weights
    python -m scripts.bench gpu-engine --weights /tmp/random-weights --batch-sizes 8 16 32 64 \\
        --out bench-results/gpu-h100/engine.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import threading
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from scripts.bench.common import Report, add_weights, positive_int

if TYPE_CHECKING:
    from api.engine.base import SynthesisItem
    from api.engine.torch_engine import TorchEngine


def items_for(engine: TorchEngine, size: int, tokens: int, seed: int) -> list[SynthesisItem]:
    from api.engine.base import SynthesisItem

    rng = np.random.default_rng(seed)
    ids = sorted(set(engine.vocab.values()) - {0})
    return [
        SynthesisItem(
            tokens=tuple(int(t) for t in rng.choice(ids, tokens)), style=np.zeros(256, np.float32), speed=1.0
        )
        for _ in range(size)
    ]


def run_point(
    engine: TorchEngine,
    size: int,
    tokens: int,
    threads: int,
    calls: int,
    outputs: dict[int, list[np.ndarray]],
) -> dict[str, Any]:
    """`threads` threads, each `calls` calls of `size` chunks after one warm-up call; audio-s/s over all.
    The first thread's last audio goes to `outputs[threads]` (its batch is the same whatever `threads`)."""
    audio_s = [0.0] * threads
    last: dict[int, list[np.ndarray]] = {}
    barrier = threading.Barrier(threads + 1)

    def lane(index: int) -> None:
        engine.claim_threads(every_thread=False)
        batch = items_for(engine, size, tokens, seed=index)
        engine.synthesize(batch)  # warm-up: this shape, this stream
        barrier.wait()
        for _ in range(calls):
            chunks = engine.synthesize(batch)
            audio_s[index] += sum(len(chunk.samples) for chunk in chunks) / engine.sample_rate
        last[index] = [chunk.samples for chunk in chunks]
        barrier.wait()

    workers = [threading.Thread(target=lane, args=(index,)) for index in range(threads)]
    for worker in workers:
        worker.start()
    barrier.wait()
    started = time.perf_counter()
    barrier.wait()
    wall = time.perf_counter() - started
    for worker in workers:
        worker.join()
    outputs[threads] = last[0]
    return {
        "batch_size": size,
        "tokens": tokens,
        "threads": threads,
        "calls_per_thread": calls,
        "wall_s": round(wall, 3),
        "audio_s_per_s": round(sum(audio_s) / wall, 1),
        "call_s": round(wall / calls, 4),
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_weights(parser)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--precision", default="bf16", choices=["fp32", "bf16"])
    parser.add_argument("--batch-sizes", nargs="+", type=positive_int, default=[8, 16, 32, 64])
    parser.add_argument("--tokens", type=positive_int, default=120)
    parser.add_argument("--lanes", type=positive_int, default=2, help="threads in a size's second run")
    parser.add_argument("--calls", type=positive_int, default=8)
    parser.add_argument(
        "--cuda-graphs", choices=["true", "false"], default="true", help="KOKORO_CUDA_GRAPHS for the engine"
    )


def run(args: argparse.Namespace) -> int:
    import torch

    from api.engine.torch_engine import TorchEngine

    report = Report(args)
    started = time.perf_counter()
    engine = TorchEngine(
        args.weights, device=args.device, precision=args.precision, lanes=args.lanes,
        cuda_graphs=args.cuda_graphs == "true",
    )  # fmt: skip
    engine.load()
    results: dict[str, Any] = {
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else args.device,
        "torch": torch.__version__,
        "load_s": round(time.perf_counter() - started, 1),
        "cuda_graphs": engine.graphs is not None,
        "graph_capture": None if engine.graphs is None else dataclasses.asdict(engine.graphs.report),
        "memory_reserved_after_load_mib": (
            round(torch.cuda.memory_reserved() / 2**20) if torch.cuda.is_available() else None
        ),
        "points": [],
    }
    for size in args.batch_sizes:
        outputs: dict[int, list[np.ndarray]] = {}
        for threads in sorted({1, args.lanes}):
            point = run_point(engine, size, args.tokens, threads, args.calls, outputs)
            # The same batch from one thread and beside another lane on its own stream: the same audio?
            point["max_abs_diff_vs_one_thread"] = max(
                float(np.abs(got - want).max())
                for got, want in zip(outputs[threads], outputs[1], strict=True)
            )
            if engine.graphs is not None:
                point["graph_fallbacks"] = engine.graphs.fallbacks
            if torch.cuda.is_available():
                point["peak_memory_mib"] = round(torch.cuda.max_memory_allocated() / 2**20)
            results["points"].append(point)
            print(json.dumps(point), flush=True)
            report.write(results)
    return 0
