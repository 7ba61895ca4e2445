"""Where a batched forward spends its time on a GPU: wall time per call under a few backend settings, and
torch.profiler's table of the kernels (self CUDA time) for two calls. Random weights (the real shapes,
scripts/tools/random_weights.py), built in memory.

    python -m scripts.tools.profile_gpu --batch-size 32 --tokens 120 --out /tmp/profile.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from api.engine.batched import forward_batch, make_batch
from api.engine.kernels import PreparedKernels
from api.weights.layout import shipped_config
from scripts.tools.random_weights import random_kmodel

ROOT = Path(__file__).resolve().parents[2]


def timed(
    model: Any, batch_args: tuple[Any, ...], dtype: torch.dtype | None, repeats: int, kernels: Any = None
) -> dict[str, Any]:
    tokens, styles, speeds, device = batch_args

    def call() -> float:
        generators = [torch.Generator(device=device).manual_seed(0) for _ in tokens]
        batch = make_batch(tokens, styles, speeds, generators, device)
        output = forward_batch(model, batch, decoder_dtype=dtype, kernels=kernels)
        return sum(len(audio) for audio in output.audio) / 24000

    call()
    walls = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        audio_s = call()
        torch.cuda.synchronize()
        walls.append(time.perf_counter() - start)
    wall = statistics.median(walls)
    return {"wall_s": round(wall, 4), "audio_s": round(audio_s, 2), "audio_s_per_s": round(audio_s / wall, 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=120)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--variants", nargs="+", help="which variants to time (default: all)")
    parser.add_argument("--profile", default="prepared bf16", help="the variant whose kernels are tabled")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    device = "cuda"
    model = random_kmodel(shipped_config()).to(device).eval()
    generator = torch.Generator().manual_seed(0)
    tokens = [
        torch.randint(1, 178, (args.tokens,), generator=generator).tolist() for _ in range(args.batch_size)
    ]
    styles = [torch.randn(256, generator=generator) * 0.2 for _ in tokens]
    batch_args = (tokens, styles, [1.0] * len(tokens), device)
    report: dict[str, Any] = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "batch": {"size": args.batch_size, "tokens": args.tokens},
        "profiled": args.profile,
        "variants": {},
    }
    prepared = PreparedKernels(model.decoder, torch.float32, compile=True)
    prepared_bf16 = PreparedKernels(model.decoder, torch.bfloat16, compile=True)
    variants = {
        "default": (False, True, None, None),
        "cudnn.benchmark": (True, True, None, None),
        "no tf32": (True, False, None, None),
        "bf16 decoder": (True, True, torch.bfloat16, None),
        "prepared": (False, True, None, prepared),
        "prepared, cudnn.benchmark": (True, True, None, prepared),
        "prepared bf16": (False, True, None, prepared_bf16),
        "prepared bf16, cudnn.benchmark": (True, True, None, prepared_bf16),
    }
    chosen = args.variants or list(variants)
    for name in chosen:
        benchmark, tf32, dtype, kernels = variants[name]
        torch.backends.cudnn.benchmark = benchmark
        torch.backends.cudnn.allow_tf32 = tf32
        try:
            report["variants"][name] = timed(model, batch_args, dtype, args.repeats, kernels)
        except Exception as exc:  # a variant that fails must not cost the others
            report["variants"][name] = {"error": repr(exc)[:500]}
        print(name, report["variants"][name], flush=True)
    torch.backends.cudnn.benchmark, torch.backends.cudnn.allow_tf32 = False, True
    from torch.profiler import ProfilerActivity, profile

    profiled = variants[args.profile]
    torch.backends.cudnn.benchmark = profiled[0]
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        timed(model, batch_args, profiled[2], 1, profiled[3])
    table = prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=30)
    print(table)
    report["profile_table"] = table
    events = prof.key_averages()
    report["cuda_time_total_ms"] = round(sum(e.self_device_time_total for e in events) / 1000, 1)
    report["kernel_launches"] = sum(e.count for e in events if e.key.startswith("cudaLaunchKernel"))
    print("self CUDA total ms", report["cuda_time_total_ms"], "launches", report["kernel_launches"])
    if args.out:
        args.out.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
