"""Figures of the thread and replica benchmarks, as PNGs (matplotlib, Agg backend: no display needed).

- threads_rtf.png, from thread_benchmark.py's JSON: real-time factor vs threads, one subplot per engine,
  one line per text length (below the dashed line at 1 is faster than real time).
- replicas_throughput_latency.png, from replica_benchmark.py's JSON: throughput (audio seconds per
  second) vs latency p50, one subplot per engine (and front end), one line per split T threads x R
  replicas, one point per concurrency (labelled).

A missing input file skips its figure. Needs matplotlib (`pip install -e '.[bench]'`).

    python scripts/bench/plot_performance.py --threads-json bench-results/cpu-amd-epyc-avx512/threads.json \\
        --replicas-json bench-results/cpu-amd-epyc-avx512/replicas.json --out-dir docs/img
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend is chosen before pyplot loads)

THREADS_PNG = "threads_rtf.png"
REPLICAS_PNG = "replicas_throughput_latency.png"
TEXT_ORDER = ("short", "medium", "long")
Point = tuple[float, float, int]  # latency p50, throughput, concurrency


def rtf_series(rows: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """engine -> text -> [(threads, RTF)] sorted by threads; rows without an RTF are left out."""
    series: dict[str, dict[str, list[tuple[int, float]]]] = defaultdict(lambda: defaultdict(list))
    for row in rows:
        if row.get("rtf") is not None:
            series[row["engine"]][row["text"]].append((row["threads"], row["rtf"]))
    return {
        engine: {text: sorted(points) for text, points in texts.items()} for engine, texts in series.items()
    }


def split_series(splits: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, list[Point]]]:
    """ "engine (mode)" -> "T x R" -> [(latency p50, audio-s/s, concurrency)] by concurrency."""
    series: dict[str, dict[str, list[Point]]] = defaultdict(dict)
    for split in splits:
        panel = f"{split['engine']} ({split['mode']})"
        points = [
            (level["latency_p50_s"], level["audio_s_per_s"], level["concurrency"])
            for level in split["levels"]
            if level.get("latency_p50_s") is not None
        ]
        series[panel][f"{split['threads']} thr x {split['replicas']} rep"] = sorted(
            points, key=lambda p: p[2]
        )
    return dict(series)


def text_key(text: str) -> tuple[int, str]:
    return (TEXT_ORDER.index(text) if text in TEXT_ORDER else len(TEXT_ORDER), text)


def plot_threads(report: Mapping[str, Any], out: Path) -> None:
    series = rtf_series(report["results"])
    figure, axes = plt.subplots(1, len(series), figsize=(5 * len(series), 4), squeeze=False, sharey=True)
    for axis, (engine, texts) in zip(axes[0], sorted(series.items()), strict=True):
        for text in sorted(texts, key=text_key):
            threads, rtf = zip(*texts[text], strict=True)
            axis.plot(threads, rtf, marker="o", label=text)
        all_threads = sorted({t for points in texts.values() for t, _ in points})
        axis.set_xscale("log", base=2)
        axis.set_xticks(all_threads, [str(t) for t in all_threads])
        axis.axhline(1.0, color="grey", linestyle="--", linewidth=0.8)
        axis.set(title=engine, xlabel="threads (OMP_NUM_THREADS)", ylim=(0, None))
        axis.legend(title="text")
    axes[0][0].set_ylabel("real-time factor (wall / audio)")
    figure.suptitle(_title("Real-time factor vs threads", report))
    _save(figure, out)


def plot_replicas(report: Mapping[str, Any], out: Path) -> None:
    series = split_series(report["splits"])
    figure, axes = plt.subplots(1, len(series), figsize=(6 * len(series), 4.5), squeeze=False)
    for axis, (panel, splits) in zip(axes[0], sorted(series.items()), strict=True):
        for label, points in sorted(splits.items()):
            if not points:
                continue
            latency, throughput, _ = zip(*points, strict=True)
            axis.plot(latency, throughput, marker="o", label=label)
            for x, y, c in points:
                axis.annotate(f"c={c}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
        top = max((y for points in splits.values() for _, y, _ in points), default=1.0)
        axis.set(
            title=panel, xlabel="latency p50 (s)", ylabel="throughput (audio s / s)", ylim=(0, top * 1.15)
        )
        axis.legend(title="split")
    figure.suptitle(_title("Throughput vs latency per split", report))
    _save(figure, out)


def _title(text: str, report: Mapping[str, Any]) -> str:
    machine = report.get("machine", {})
    cpu = machine.get("cpu_model") or "?"
    return f"{text} ({cpu}, {machine.get('affinity_cores', '?')} cores)"


def _save(figure: Any, out: Path) -> None:
    figure.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=120)
    plt.close(figure)
    print(f"wrote {out}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    results = Path("bench-results/cpu-amd-epyc-avx512")
    parser.add_argument("--threads-json", type=Path, default=results / "threads.json")
    parser.add_argument("--replicas-json", type=Path, default=results / "replicas.json")
    parser.add_argument("--out-dir", type=Path, default=Path("docs/img"))
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    plots = (
        (args.threads_json, plot_threads, THREADS_PNG),
        (args.replicas_json, plot_replicas, REPLICAS_PNG),
    )
    drawn = 0
    for source, plot, name in plots:
        if not source.exists():
            print(f"{source} not found: {name} skipped")
            continue
        plot(json.loads(source.read_text(encoding="utf-8")), args.out_dir / name)
        drawn += 1
    return 0 if drawn else 1


if __name__ == "__main__":
    sys.exit(main())
