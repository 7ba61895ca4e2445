"""Real-time factor of the PyTorch fp32 engine vs the ONNX Runtime int8 engine, same texts, same voice.

Runs each engine at each thread count on short / medium / long texts (phonemized once), excludes a
warm-up run, repeats, and writes JSON. Needs a weights directory with the converted checkpoint and the
ONNX model (the registry source writes both: `python -m api.weights fetch --source registry`).

    python scripts/bench/bench_engines.py --weights-dir DIR --threads 1 2 --runs 3 \\
        --out bench-results/<machine>/engines.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a file: the repository's packages
from api.engine.voices import VoiceStore
from api.settings import DEFAULT_WEIGHTS_DIR
from api.text.phonemize import Phonemizer
from scripts.benchlib import ENGINE_TEXTS, build_engine, items_for, machine_info, time_runs, write_report


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
    parser.add_argument(
        "--engines",
        nargs="+",
        default=["torch", "onnx"],
        choices=["torch", "torch-bf16", "torch-int8", "onnx"],
    )
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
            for label, text in ENGINE_TEXTS.items():
                row = {
                    "engine": name,
                    "threads": threads,
                    "text": label,
                    **time_runs(engine, items_for(text, engine, store, phonemizer), args.runs),
                }
                print(json.dumps(row))
                results.append(row)
    report = {
        "machine": machine_info(),
        "kernel_env": {key: os.environ.get(key) for key in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")},
        "voice": "af_heart",
        "runs": args.runs,
        "results": results,
        "ratios": ratios(results),
    }
    write_report(report, args.out)
    print(json.dumps(report["ratios"], indent=2))


if __name__ == "__main__":
    main()
