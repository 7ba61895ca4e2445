"""What the CUDA graphs' buckets cost (api/engine/graphs.py): padding, graphs, memory; needs no GPU.

1. The server's chunks of `load`'s mixed texts (the server's own planner), each chunk's frames from the
   real model's duration predictor (the text side only) at the speeds given: frames per token.
2. The shared engine's batches: queues of `--queue` of those chunks (drawn at random, a request's first chunk
   at first-chunk priority now and then) through the scheduler's own `next_batch` with the GPU policy (batch
   32, 8,192 padded tokens, ratio 2, launch tokens 1,500), batch after batch until each queue is empty.
3. For every batch: its bucket (or the eager fallback), and the work the device does for it: tokens and
   frames of the items themselves, of the eager forward (every item padded to the batch's longest), and of
   the bucketed one (rows, tokens and frames padded to their buckets). Padding = padded / the items' own.
4. The bucket set: graphs per lane, and each lane's arena (inputs and outputs of its graphs) in bytes.

    python -m scripts.tools.graph_buckets --out bench-results/<machine>/graph-buckets.json
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from scripts.bench import load
from scripts.bench.common import Report
from scripts.bench.measure import server_chunks

DEFAULT_WEIGHTS = Path.home() / ".cache" / "kokoro-openai-server" / "test-registry-weights"


def chunk_frames(weights: Path, speeds: Sequence[float], voice: str) -> list[tuple[int, float, int]]:
    """(tokens, speed, frames) of every server chunk of the mixed texts at each speed, frames from the real
    model's duration predictor."""
    import json

    import numpy as np
    import torch

    from api.engine.batched import _durations, _padding, encoded_text, make_batch
    from api.engine.torch_engine import load_kmodel
    from api.text.phonemize import Phonemizer

    config = json.loads((weights / "config.json").read_text(encoding="utf-8"))
    model = load_kmodel(config, weights / "kokoro-v1_0.pth").eval()
    pack = torch.load(weights / "voices" / f"{voice}.pt", weights_only=True).reshape(510, 256).numpy()
    phonemizer = Phonemizer()
    items = [
        item
        for text in load.builtin_texts("mixed")
        for item in server_chunks(text, config["vocab"], np.asarray(pack), phonemizer).items
    ]
    rows = []
    with torch.inference_mode():
        for item in items:
            for speed in speeds:
                batch = make_batch([item.tokens], [torch.from_numpy(item.style)], [speed], [None], "cpu")
                pad = _padding(batch.lengths, batch.input_ids.shape[1])
                d_en = encoded_text(model, batch.input_ids, pad)
                d = model.predictor.text_encoder(d_en, batch.styles[:, 128:], batch.lengths, pad)
                frames = int(_durations(model.predictor, d, batch, pad).sum())
                rows.append((len(item.tokens), speed, frames))
    return rows


def simulate(
    chunks: Sequence[tuple[int, float, int]], queue_size: int, queues: int, seed: int
) -> list[list[tuple[int, float, int]]]:
    """Batches the GPU scheduler forms from random queues of `chunks`."""
    import asyncio

    import numpy as np

    from api.engine.base import SynthesisItem
    from api.engine.scheduling.batching import next_batch
    from api.engine.scheduling.entries import FIRST_CHUNK_PRIORITY, LATER_CHUNK_PRIORITY, Entry
    from api.engine.torch_engine import SHARED_GPU_LANES, gpu_batch_policy

    policy = gpu_batch_policy(SHARED_GPU_LANES)
    rng = random.Random(seed)
    loop = asyncio.new_event_loop()
    batches = []
    for _ in range(queues):
        entries = []
        for index in range(queue_size):
            tokens, speed, frames = rng.choice(chunks)
            item = SynthesisItem(tokens=(1,) * tokens, style=np.zeros(256, np.float32), speed=speed)
            priority = FIRST_CHUNK_PRIORITY if rng.random() < 0.25 else LATER_CHUNK_PRIORITY
            entry = Entry(item, loop.create_future(), loop, str(index), enqueued_at=0.0, priority=priority)
            entry.frames = frames  # type: ignore[attr-defined]
            entries.append(entry)
        while entries:
            decision = next_batch(entries, now=1.0, policy=policy)
            batches.append([(len(e.item.tokens), e.item.speed, e.frames) for e in decision.batch])  # type: ignore[attr-defined]
            taken = {id(entry) for entry in decision.batch}
            entries = [entry for entry in entries if id(entry) not in taken]
    loop.close()
    return batches


def padding(batches: Sequence[Sequence[tuple[int, float, int]]], buckets: Any) -> dict[str, Any]:
    own = {"tokens": 0, "frames": 0}
    eager = {"tokens": 0, "frames": 0}
    graphs = {"tokens": 0, "frames": 0}
    fallbacks = 0
    for batch in batches:
        size = len(batch)
        tokens = max(t for t, _, _ in batch) + 2
        frames = max(f for _, _, f in batch)
        own["tokens"] += sum(t + 2 for t, _, _ in batch)
        own["frames"] += sum(f for _, _, f in batch)
        eager["tokens"] += size * tokens
        eager["frames"] += size * frames
        rows, token_bucket = buckets.batch(size), buckets.tokens(tokens)
        frame_bucket = None if rows is None else buckets.frames(rows, frames)
        if rows is None or token_bucket is None or frame_bucket is None:
            fallbacks += 1
            graphs["tokens"] += size * tokens
            graphs["frames"] += size * frames
            continue
        graphs["tokens"] += rows * token_bucket
        graphs["frames"] += rows * frame_bucket
    return {
        "batches": len(batches),
        "eager_fallbacks": fallbacks,
        "chunks_per_batch": statistics.mean(len(batch) for batch in batches),
        "padding_eager": {key: eager[key] / own[key] for key in own},
        "padding_bucketed": {key: graphs[key] / own[key] for key in own},
        "bucketed_over_eager": {key: graphs[key] / eager[key] for key in own},
    }


def bucket_set(weights: Path) -> dict[str, Any]:
    import json

    from api.engine.graphs import BucketedForward, Buckets, EagerBackend
    from api.engine.torch_engine import GPU_BATCH_POLICY, load_kmodel

    config = json.loads((weights / "config.json").read_text(encoding="utf-8"))
    model = load_kmodel(config, weights / "kokoro-v1_0.pth").eval()
    buckets = Buckets.up_to(GPU_BATCH_POLICY.max_batch_size)
    forward = BucketedForward(model, buckets, EagerBackend)
    shapes = forward.all_shapes()
    return {
        "buckets": {
            "batch_sizes": buckets.batch_sizes,
            "token_sizes": buckets.token_sizes,
            "frame_sizes": buckets.frame_sizes,
            "max_batch_frames": buckets.max_batch_frames,
        },
        "graphs_per_lane": {
            segment: sum(1 for shape in shapes if shape[0] == segment)
            for segment in ("text", "prosody", "vocoder")
        },
        "arena_bytes_per_lane": forward.arena_bytes,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--weights-dir", type=Path, default=DEFAULT_WEIGHTS)
    parser.add_argument("--voice", default="af_heart")
    parser.add_argument("--speeds", type=float, nargs="+", default=[1.0, 0.75, 1.5])
    parser.add_argument("--queue", type=int, default=128, help="chunks queued at once (about the clients)")
    parser.add_argument("--queues", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    written = Report(args, benchmark="graph-buckets")
    started = time.perf_counter()
    chunks = chunk_frames(args.weights_dir, args.speeds, args.voice)
    per_token = [frames / tokens * speed for tokens, speed, frames in chunks]
    from api.engine.graphs import Buckets
    from api.engine.torch_engine import GPU_BATCH_POLICY

    buckets = Buckets.up_to(GPU_BATCH_POLICY.max_batch_size)
    report: dict[str, Any] = {
        "chunks": len(chunks) // len(args.speeds),
        "tokens_per_chunk": {"min": min(t for t, _, _ in chunks), "max": max(t for t, _, _ in chunks)},
        "frames_per_token_at_speed_1": {
            "mean": statistics.mean(per_token),
            "max": max(per_token),
            "p99": sorted(per_token)[int(0.99 * (len(per_token) - 1))],
        },
        "queues": {},
        **bucket_set(args.weights_dir),
    }
    for queue_size in sorted({8, 32, args.queue}):
        batches = simulate(chunks, queue_size, args.queues, args.seed)
        report["queues"][str(queue_size)] = padding(batches, buckets)
    report["seconds"] = time.perf_counter() - started
    print(written.write(report))


if __name__ == "__main__":
    main()
