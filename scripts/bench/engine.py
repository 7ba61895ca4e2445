"""Real-time factor of the PyTorch fp32 engine vs the ONNX Runtime int8 engine, same texts, same voice.

Runs each engine at each thread count on short / medium / long texts (phonemized once), excludes a
warm-up run, repeats, and writes JSON. Needs a weights directory with the converted checkpoint and the
ONNX model (the registry source writes both: `python -m api.weights fetch --source registry`).

    python -m scripts.bench engine --weights DIR --threads 1 2 --runs 3 \\
        --out bench-results/<machine>/engines.json
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from scripts.bench.common import Report, add_weights, positive_int
from scripts.bench.measure import ENGINE_TEXTS, VOICE, build_engine, items_for, time_runs

KERNEL_ENV = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")


def ratios(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by_key = {(r["engine"], r["threads"], r["text"]): r for r in results}
    out = []
    for (engine, threads, text), onnx in by_key.items():
        if engine != "onnx" or ("torch", threads, text) not in by_key:
            continue
        speedup = by_key[("torch", threads, text)]["wall_median_s"] / onnx["wall_median_s"]
        out.append({"threads": threads, "text": text, "onnx_speedup_over_torch": round(speedup, 3)})
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_weights(parser)
    engines = ["torch", "torch-bf16", "torch-int8", "onnx"]
    parser.add_argument("--engine", nargs="+", default=["torch", "onnx"], choices=engines)
    parser.add_argument("--threads", nargs="+", type=positive_int, default=[1, 2])
    parser.add_argument("--runs", type=positive_int, default=3, help="timed runs per text, after 1 warm-up")


def run(args: argparse.Namespace) -> int:
    from api.engine.voices import VoiceStore
    from api.text.phonemize import Phonemizer

    report = Report(args)
    phonemizer = Phonemizer()
    store = VoiceStore(args.weights / "voices")
    rows = []
    for name in args.engine:
        for threads in args.threads:
            engine = build_engine(name, args.weights, threads)
            engine.load()
            for label, text in ENGINE_TEXTS.items():
                items = items_for(text, engine, store, phonemizer)
                row = {"engine": name, "threads": threads, "text": label}
                row.update(time_runs(engine, items, args.runs))
                print(json.dumps(row))
                rows.append(row)
    report.write({
        "kernel_env": {key: os.environ.get(key) for key in KERNEL_ENV}, "voice": VOICE, "runs": args.runs,
        "rows": rows, "ratios": ratios(rows),
    })  # fmt: skip
    print(json.dumps(ratios(rows), indent=2))
    return 0
