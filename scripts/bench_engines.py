"""Real-time factor of the PyTorch fp32 engine vs the ONNX Runtime int8 engine, same texts, same voice.

Runs each engine at each thread count on short / medium / long texts (phonemized once), excludes a
warm-up run, repeats, and writes JSON. Needs a weights directory with the converted checkpoint and the
ONNX model (the registry source writes both: `python -m api.weights fetch --source registry`).

    python scripts/bench_engines.py --weights-dir DIR --threads 1 2 --runs 3 --out bench-results/engines.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from api.engine.base import SAMPLE_RATE, Engine, SynthesisItem
from api.engine.onnx_engine import OnnxEngine
from api.engine.torch_engine import TorchEngine
from api.engine.voices import VoiceStore, style_for
from api.settings import DEFAULT_WEIGHTS_DIR
from api.text.chunk import ChunkLimits, chunk_words, phonemes_of
from api.text.phonemize import Phonemizer

TEXTS = {
    "short": "Hello there, how are you today?",
    "medium": (
        "The old lighthouse keeper climbed the spiral stairs every evening, lit the great lamp, "
        "and watched the ships pass safely through the narrow channel below."
    ),
    "long": (
        "When the storm finally arrived, it came faster than anyone in the village had expected. "
        "The fishermen pulled their boats high onto the shingle, the baker closed his shutters, and "
        "the children were called in from the fields. By nightfall the wind was howling through the "
        "streets, rattling every loose tile and sending spray over the harbour wall, while the keeper "
        "in the lighthouse kept his lamp burning until the first grey light of morning."
    ),
}


def build_engine(name: str, weights: Path, threads: int) -> Engine:
    if name == "torch":
        torch.set_num_threads(threads)
        return TorchEngine(weights, device="cpu", threads=threads, warmup=True)
    return OnnxEngine(weights, threads=threads, warmup=True)


def items_for(text: str, engine: Engine, store: VoiceStore, phonemizer: Phonemizer) -> list[SynthesisItem]:
    pack = store.resolve("af_heart")
    items = []
    # Each text up to 450 tokens stays one chunk: the benchmark compares engines, not chunking.
    for chunk in chunk_words(phonemizer.words(text, "a"), ChunkLimits(first_budget=450)):
        tokens = tuple(engine.vocab[p] for p in phonemes_of(chunk) if p in engine.vocab)
        items.append(SynthesisItem(tokens=tokens, style=style_for(pack, len(tokens)), speed=1.0))
    return items


def time_runs(engine: Engine, items: list[SynthesisItem], runs: int) -> dict[str, Any]:
    engine.synthesize(items)  # warm-up for this length, excluded
    walls, audio_s = [], 0.0
    for _ in range(runs):
        started = time.perf_counter()
        outputs = engine.synthesize(items)
        walls.append(time.perf_counter() - started)
        audio_s = sum(len(out) for out in outputs) / SAMPLE_RATE
    median = statistics.median(walls)
    return {
        "tokens": sum(len(item.tokens) for item in items),
        "chunks": len(items),
        "audio_s": round(audio_s, 3),
        "wall_s": [round(w, 3) for w in walls],
        "wall_median_s": round(median, 3),
        "rtf": round(median / audio_s, 4),
        "audio_s_per_s": round(audio_s / median, 3),
    }


def ratios(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by_key = {(r["engine"], r["threads"], r["text"]): r for r in results}
    out = []
    for (engine, threads, text), onnx in by_key.items():
        if engine != "onnx" or ("torch", threads, text) not in by_key:
            continue
        speedup = by_key[("torch", threads, text)]["wall_median_s"] / onnx["wall_median_s"]
        out.append({"threads": threads, "text": text, "onnx_speedup_over_torch": round(speedup, 3)})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--weights-dir", type=Path, default=Path(os.environ.get("KOKORO_WEIGHTS_DIR", DEFAULT_WEIGHTS_DIR))
    )
    parser.add_argument("--engines", nargs="+", default=["torch", "onnx"], choices=["torch", "onnx"])
    parser.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("bench-results/engines.json"))
    args = parser.parse_args()

    phonemizer = Phonemizer()
    store = VoiceStore(args.weights_dir / "voices")
    results = []
    for name in args.engines:
        for threads in args.threads:
            engine = build_engine(name, args.weights_dir, threads)
            engine.load()
            for label, text in TEXTS.items():
                row = {
                    "engine": name,
                    "threads": threads,
                    "text": label,
                    **time_runs(engine, items_for(text, engine, store, phonemizer), args.runs),
                }
                print(json.dumps(row))
                results.append(row)
    report = {
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(),
            "torch": torch.__version__,
        },
        "voice": "af_heart",
        "runs": args.runs,
        "results": results,
        "ratios": ratios(results),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print(json.dumps(report["ratios"], indent=2))


if __name__ == "__main__":
    main()
