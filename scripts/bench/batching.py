"""What batching buys: the batched Kokoro forward against batch size and text-length mix, and the server with
batching off and on under the same load.

`engine` (the default mode): one process, the model on --device. For every dtype, text mix and batch size,
a batch of that many chunks goes through api/engine/batched.py's forward (one warm-up call, then --runs
timed calls), and the same chunks go one by one through the library's own `KModel.forward_with_tokens`
(path "library": what the server did before batching), so every ratio compares the same work. Per point:
audio seconds per wall second (throughput), the call's wall time (the last chunk of a batch is done when
the call is: the worst per-chunk latency), padding (padded / real tokens) and, on CUDA, peak memory.
Mixes are chunk token lengths cut from a phonemized English paragraph: short (30), medium (120), long
(250), mixed (30, 120, 250, 60 in turn). `--vocoder` chooses how the
decoder/vocoder runs: `auto` (the engine's default: one item at a time on a CPU, the whole batch on a GPU),
`1` or `all`. dtypes: fp32, or bf16 / fp16 under torch.autocast. `--random-weights` builds a randomly
initialised model (duration head biased to ~2 frames per token, as FACTS.md describes): same compute as the
real weights, for machines without them.

`server` mode: the real server (`python -m api`, one worker) is started twice on the same weights, with
KOKORO_MAX_BATCH_SIZE=1 and then --max-batch-size, and `load`'s closed-loop client runs at each --clients
level; the JSON holds both and the on/off ratios of throughput and latency per level.

    python -m scripts.bench batching --weights ~/.cache/kokoro-openai-server/test-registry-weights \\
        --batch-sizes 1 2 4 8 --mixes short mixed --runs 3 --out bench-results/<machine>/batching-cpu.json
    python -m scripts.bench batching --random-weights --device cuda --batch-sizes 1 2 4 8 16 32 64 \\
        --mixes short medium long mixed --dtypes fp32 bf16 --out bench-results/<machine>/batching-gpu.json
    python -m scripts.bench batching server --weights ~/.cache/kokoro-openai-server/test-registry-weights \\
        --max-batch-size 4 --clients 1 4 16 --duration 60 --out bench-results/<machine>/batching-server.json
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from scripts.bench import load
from scripts.bench.common import Report, add_weights, positive_int
from scripts.bench.measure import ENGINE_TEXTS
from scripts.harness import ServerPlan, deployed

MIXES = {"short": (30,), "medium": (120,), "long": (250,), "mixed": (30, 120, 250, 60)}
SAMPLE_RATE = 24_000


# --- engine mode -------------------------------------------------------------------------------------------


def load_model(args: argparse.Namespace, device: str) -> Any:
    from kokoro import KModel

    from api.engine.torch_engine import REPO_ID

    if args.random_weights:
        from api.weights.layout import shipped_config
        from scripts.tools.random_weights import random_kmodel

        model = random_kmodel(shipped_config())
    else:
        config = args.weights / "config.json"
        model = KModel(repo_id=REPO_ID, config=str(config), model=str(args.weights / "kokoro-v1_0.pth"))
    return model.to(device).eval()


def token_pool(vocab: dict[str, int]) -> list[int]:
    """Phoneme tokens of a real English paragraph (random tokens when no G2P is installed)."""
    try:
        from api.text.phonemize import Phonemizer

        phonemes = Phonemizer().phonemize(" ".join(ENGINE_TEXTS.values()), "a")
        return [vocab[p] for p in phonemes if p in vocab]
    except Exception as exc:  # misaki missing on a bare GPU box: same compute with random ids
        print(f"no G2P ({exc}); random tokens", file=sys.stderr)
        import random

        return [random.Random(0).randrange(1, 178) for _ in range(600)]


def batch_items(pool: Sequence[int], mix: str, size: int) -> list[list[int]]:
    lengths = [MIXES[mix][i % len(MIXES[mix])] for i in range(size)]
    return [[pool[(7 * i + j) % len(pool)] for j in range(length)] for i, length in enumerate(lengths)]


def styles_for(args: argparse.Namespace, items: Sequence[Sequence[int]]) -> list[Any]:
    import torch

    voice = None if args.random_weights else args.weights / "voices" / "af_heart.pt"
    if voice is None or not voice.exists():
        generator = torch.Generator().manual_seed(0)
        return [torch.randn(256, generator=generator) * 0.1 for _ in items]
    pack = torch.load(voice, weights_only=True).reshape(510, 256)
    return [pack[len(tokens) - 1] for tokens in items]


def synchronize(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def autocast(device: str, dtype: str) -> contextlib.AbstractContextManager[Any]:
    import torch

    if dtype == "fp32":
        return contextlib.nullcontext()
    kind = "cuda" if device.startswith("cuda") else "cpu"
    return torch.autocast(kind, dtype=torch.bfloat16 if dtype == "bf16" else torch.float16)


def time_calls(call: Any, device: str, repeats: int) -> tuple[list[float], float]:
    """Wall seconds of each timed call (after one warm-up) and the audio seconds one call gives."""
    audio_s = call()
    walls = []
    for _ in range(repeats):
        synchronize(device)
        started = time.perf_counter()
        call()
        synchronize(device)
        walls.append(time.perf_counter() - started)
    return walls, audio_s


def measure_point(
    args: argparse.Namespace, model: Any, items: list[list[int]], styles: list[Any], how: str, dtype: str
) -> Any:
    import torch

    from api.engine.batched import forward_batch, make_batch

    decoder_dtype = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]

    device = str(model.device)

    def batched() -> float:
        generators = [torch.Generator(device=device).manual_seed(0) for _ in items]
        batch = make_batch(items, styles, [1.0] * len(items), generators, device)
        output = forward_batch(
            model, batch, vocoder_batch=vocoder_batch(args.vocoder, device), decoder_dtype=decoder_dtype
        )
        return sum(len(audio) for audio in output.audio) / SAMPLE_RATE

    def library() -> float:
        total = 0
        for tokens, style in zip(items, styles, strict=True):
            with torch.inference_mode():
                audio, _ = model.forward_with_tokens(
                    torch.tensor([[0, *tokens, 0]], device=device), style[None].to(device), 1.0
                )
            total += audio.numel()
        return total / SAMPLE_RATE

    return time_calls(batched if how == "batched" else library, device, args.runs)


def vocoder_batch(choice: str, device: str) -> int | None:
    if choice == "auto":
        from api.engine.torch_engine import CPU_VOCODER_BATCH

        return None if device.startswith("cuda") else CPU_VOCODER_BATCH
    return None if choice == "all" else int(choice)


def point_record(
    how: str, dtype: str, mix: str, items: list[list[int]], walls: list[float], audio_s: float, device: str
) -> dict[str, Any]:
    import torch

    wall = statistics.median(walls)
    padded = len(items) * max(len(tokens) for tokens in items)
    record = {
        "path": how,
        "dtype": dtype,
        "mix": mix,
        "batch_size": len(items),
        "tokens": sum(len(tokens) for tokens in items),
        "padding_ratio": round(padded / sum(len(tokens) for tokens in items), 3),
        "audio_s": round(audio_s, 3),
        "wall_median_s": round(wall, 4),
        "wall_runs_s": [round(w, 4) for w in walls],
        "audio_s_per_s": round(audio_s / wall, 3),
        "chunk_latency_s": round(wall, 4),
    }
    if device.startswith("cuda"):
        record["peak_memory_mib"] = round(torch.cuda.max_memory_allocated() / 2**20)
        torch.cuda.reset_peak_memory_stats()
    return record


def run_engine_mode(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    model = load_model(args, device)
    pool = token_pool(model.vocab)
    points = []
    for dtype in args.dtypes:
        for mix in args.mixes:
            for size in args.batch_sizes:
                points.extend(measure_size(args, model, pool, dtype, mix, size, device))
    add_ratios(points)
    return {
        "device": device,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "points": points,
    }


def measure_size(
    args: argparse.Namespace, model: Any, pool: list[int], dtype: str, mix: str, size: int, device: str
) -> list[dict[str, Any]]:
    import torch

    items = batch_items(pool, mix, size)
    styles = styles_for(args, items)
    paths = ["library", "batched"]
    records = []
    for how in paths:
        try:
            # The library's forward has no precision option: autocast over all of it. The batched path runs
            # as the engine does: the text side in fp32, the decoder and vocoder under autocast.
            with autocast(device, dtype) if how == "library" else contextlib.nullcontext():
                walls, audio_s = measure_point(args, model, items, styles, how, dtype)
        except torch.cuda.OutOfMemoryError:
            torch.cuda.empty_cache()
            records.append(
                {"path": how, "dtype": dtype, "mix": mix, "batch_size": size, "error": "out of memory"}
            )
            print(f"{dtype:>5} {mix:>7} {how:>8} B={size:<3} out of memory", flush=True)
            continue
        record = point_record(how, dtype, mix, items, walls, audio_s, device)
        print(
            f"{dtype:>5} {mix:>7} {how:>8} B={size:<3} {record['audio_s_per_s']:>9.2f} audio-s/s "
            f"latency {record['chunk_latency_s']:.3f} s  padding {record['padding_ratio']:.2f}",
            flush=True,
        )
        records.append(record)
    return records


def add_ratios(points: list[dict[str, Any]]) -> None:
    """Throughput of every point relative to batch size 1 (batched path, same dtype and mix), and
    throughput and latency relative to the library's own forward run item by item on the same items."""
    for point in points:
        if "error" in point:
            continue
        same = [
            p
            for p in points
            if "error" not in p and p["dtype"] == point["dtype"] and p["mix"] == point["mix"]
        ]
        base = next((p for p in same if p["path"] == "batched" and p["batch_size"] == 1), None)
        library = next(
            (p for p in same if p["path"] == "library" and p["batch_size"] == point["batch_size"]), None
        )
        if base is not None:
            point["throughput_vs_batch1"] = round(point["audio_s_per_s"] / base["audio_s_per_s"], 3)
        if library is not None:
            point["throughput_vs_library"] = round(point["audio_s_per_s"] / library["audio_s_per_s"], 3)
            point["latency_vs_library"] = round(point["chunk_latency_s"] / library["chunk_latency_s"], 3)


# --- server mode -------------------------------------------------------------------------------------------


@contextlib.contextmanager
def server(args: argparse.Namespace, max_batch_size: int, log_dir: Path) -> Iterator[str]:
    top = str(max(args.clients))
    env = {
        "KOKORO_WEIGHTS_DIR": str(args.weights), "KOKORO_ENGINE": "torch",
        "KOKORO_MAX_BATCH_SIZE": str(max_batch_size), "KOKORO_MAX_INFLIGHT": top, "KOKORO_MAX_WAITING": top,
        "KOKORO_MAX_WAIT_S": str(args.timeout),
    }  # fmt: skip
    if args.batch_timeout_ms is not None:
        env["KOKORO_BATCH_TIMEOUT_MS"] = str(args.batch_timeout_ms)
    plan = ServerPlan(env={**os.environ, **env}, cpus=None, log_dir=log_dir / f"batch{max_batch_size}")
    plan.log_dir.mkdir(parents=True, exist_ok=True)
    with deployed(plan, replicas=1, threads=args.threads or os.cpu_count() or 1) as deployment:
        yield deployment.url


def run_server_mode(args: argparse.Namespace) -> dict[str, Any]:
    log_dir = Path(tempfile.mkdtemp(prefix="kokoro-batching-"))
    texts = load.builtin_texts(args.texts)
    runs: dict[str, list[dict[str, Any]]] = {}
    for size in (1, args.max_batch_size):
        with server(args, size, log_dir) as url:
            config = load.LoadConfig(
                url=url, texts=texts, formats=("pcm",), voice="af_heart", requests=args.requests,
                duration=None if args.requests else args.duration, timeout=args.timeout, warmup=1,
            )  # fmt: skip
            runs[f"max_batch_{size}"] = []
            for concurrency in args.clients:
                row = load.level_record(load.run_level(config, concurrency))
                runs[f"max_batch_{size}"].append(row)
                print(f"max batch {size:>2} c={concurrency:<3} {row}", flush=True)
    return {"texts": list(texts), "logs": str(log_dir), "runs": runs, "ratios": server_ratios(runs, args)}


def server_ratios(runs: dict[str, list[dict[str, Any]]], args: argparse.Namespace) -> list[dict[str, Any]]:
    off, on = runs["max_batch_1"], runs[f"max_batch_{args.max_batch_size}"]
    ratios = []
    for before, after in zip(off, on, strict=True):
        row: dict[str, Any] = {"concurrency": before["concurrency"]}
        for key in ("audio_s_per_s", "ttfb_p50_s", "ttfb_p95_s", "latency_p50_s", "latency_p95_s"):
            if before[key] and after[key] is not None:
                row[f"{key}_on_over_off"] = round(after[key] / before[key], 3)
        ratios.append(row)
    return ratios


# --- main -----------------------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("mode", nargs="?", choices=["engine", "server"], default="engine")
    add_weights(parser)
    parser.add_argument("--random-weights", action="store_true", help="engine mode: random weights")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--threads", type=int, help="torch threads (server mode: KOKORO_TORCH_THREADS)")
    parser.add_argument("--batch-sizes", nargs="+", type=positive_int, default=[1, 2, 4, 8, 16, 32, 64])
    parser.add_argument("--mixes", nargs="+", choices=list(MIXES), default=["short", "mixed"])
    parser.add_argument("--dtypes", nargs="+", choices=["fp32", "bf16", "fp16"], default=["fp32"])
    parser.add_argument("--vocoder", default="auto", help="auto, all or a group size")
    parser.add_argument("--runs", type=positive_int, default=3, help="timed calls per point, after 1 warm-up")
    parser.add_argument("--max-batch-size", type=int, default=4, help="server mode: batching on")
    parser.add_argument("--batch-timeout-ms", type=float, help="server mode: KOKORO_BATCH_TIMEOUT_MS")
    parser.add_argument("--clients", nargs="+", type=positive_int, default=[1, 4, 16], help="server mode")
    parser.add_argument("--texts", default="mixed", help="server mode: `load`'s texts")
    amount = parser.add_mutually_exclusive_group()
    amount.add_argument("--duration", type=float, default=60.0)
    amount.add_argument("--requests", type=positive_int)
    parser.add_argument("--timeout", type=float, default=600.0)


def run(args: argparse.Namespace) -> int:
    report = Report(args)
    results = run_server_mode(args) if args.mode == "server" else run_engine_mode(args)
    report.write({"mode": args.mode, **results})
    return 0
