"""The performance page's figures, rendered from the JSON under bench-results/ into docs/img/ (matplotlib,
Agg backend: no display needed). Each figure names the files it reads; docs/performance.md embeds them.

- cpu_throughput.png: the server's audio-s/s against the kokoro library's, measured in the same run
  (the `cpu` benchmark), one pair of bars per CPU kind and dispatch level.
- first_audio.png: first audio (TTFB) p50 and p95 under load: those CPU runs at 4 clients, and the GPU
  layouts against clients.
- gpu_throughput.png: the GPU layouts' audio-s/s against closed-loop streaming clients (the
  `gpu-server` benchmark).
- threads_rtf.png, from the threads benchmark's JSON: real-time factor vs threads, one subplot per engine,
  one line per text length (below the dashed line at 1 is faster than real time).
- replicas_throughput_latency.png, from the replicas benchmark's JSON: throughput (audio seconds per
  second) vs latency p50, one subplot per engine (and front end), one line per split T threads x R
  replicas, one point per concurrency (labelled).

A figure whose input files are missing is skipped. Needs matplotlib (`pip install -e '.[bench]'`).

    python -m scripts.bench.plot_performance                  # bench-results/ -> docs/img/
    python -m scripts.bench.plot_performance --out-dir /tmp/img
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend is chosen before pyplot loads)

THREADS_PNG = "threads_rtf.png"
REPLICAS_PNG = "replicas_throughput_latency.png"
CPU_PNG = "cpu_throughput.png"
FIRST_AUDIO_PNG = "first_audio.png"
GPU_PNG = "gpu_throughput.png"
TEXT_ORDER = ("short", "medium", "long")
Point = tuple[float, float, int]  # latency p50, throughput, concurrency
Report = Mapping[str, Any]


@dataclass(frozen=True)
class CpuRun:
    """One run of the `cpu` benchmark: the server's defaults and the library, 4 streaming clients, pcm."""

    label: str
    path: str  # under bench-results/


@dataclass(frozen=True)
class GpuRun:
    """One layout of one `gpu-server` run (its pcm levels: mp3's recorded no audio seconds)."""

    label: str
    path: str
    variant: str


# The runs behind docs/performance.md's tables "CPU, torch engine" and "CPU, ONNX engine" (those with the
# library in the same run) and its GPU table.
CPU_RUNS = (
    CpuRun("AMX Xeon\nbf16", "cpu-intel-amx/tcmalloc.json"),
    CpuRun("AMX Xeon, AVX2\ndispatch: int8", "cpu-intel-amx/as-avx2-tcmalloc.json"),
    CpuRun("Zen 4\nint8 + bf16", "cpu-amd-zen4/lanes.json"),
    CpuRun("Zen 4, AVX2\ndispatch: int8", "cpu-amd-zen4/as-avx2-lanes-200.json"),
    CpuRun("AVX2 EPYC (real)\nONNX int8", "cpu-amd-epyc-avx2/staged.json"),
)
GPU_RUNS = (
    GpuRun("H100, 4 workers", "gpu-h100/layouts-2026-11-27.json", "today"),
    GpuRun("H100, shared engine", "gpu-h100/layouts-2026-11-27.json", "shared"),
    GpuRun("H200, 4 workers, glibc", "gpu-h200/server-default.json", "default"),
    GpuRun("H200, 4 workers, tcmalloc", "gpu-h200/server-allocators-glibc-first.json", "tcmalloc"),
)


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


def cpu_rows(reports: Sequence[Report]) -> list[tuple[float, float, float, float]]:
    """(server audio-s/s, library audio-s/s, TTFB p50, TTFB p95) of each `cpu` report."""
    return [
        (
            report["server"]["audio_s_per_s"],
            report["library"]["audio_s_per_s"],
            report["server"]["ttfb_p50_s"],
            report["server"]["ttfb_p95_s"],
        )
        for report in reports
    ]


def gpu_levels(report: Report, run: GpuRun) -> list[tuple[int, float, float, float]]:
    """(clients, audio-s/s, first audio p50, p95) of one layout in pcm, by clients."""
    (layout,) = [layout for layout in report["layouts"] if layout["variant"] == run.variant]
    return sorted(
        (level["concurrency"], level["audio_s_per_s"], level["ttfa_p50_s"], level["ttfa_p95_s"])
        for level in layout["levels"]
        if level.get("format", "pcm") == "pcm" and level["ok"]
    )


def plot_cpu(reports: Sequence[Report], out: Path) -> None:
    rows = cpu_rows(reports)
    figure, axis = plt.subplots(figsize=(9, 4.5))
    x = range(len(rows))
    server = axis.bar([i - 0.2 for i in x], [r[0] for r in rows], 0.4, label="this server (its defaults)")
    axis.bar(
        [i + 0.2 for i in x], [r[1] for r in rows], 0.4, label="kokoro library (fp32, one text at a time)"
    )
    for bar, (ours, library, _, _) in zip(server, rows, strict=True):
        axis.annotate(
            f"{ours / library:.2f}x", (bar.get_x() + bar.get_width() / 2, ours), ha="center", va="bottom"
        )
    axis.set_xticks(list(x), [run.label for run in CPU_RUNS])
    axis.set(
        ylabel="audio seconds per second",
        title="2 vCPUs, 4 streaming clients, pcm: the server against the library",
    )
    axis.legend(loc="upper right")
    _save(figure, out)


def plot_first_audio(cpu: Sequence[Report], gpu: Sequence[Report], out: Path) -> None:
    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5), gridspec_kw={"width_ratios": [5, 4]})
    rows = cpu_rows(cpu)
    x = range(len(rows))
    left.bar([i - 0.2 for i in x], [r[2] for r in rows], 0.4, label="p50")
    left.bar([i + 0.2 for i in x], [r[3] for r in rows], 0.4, label="p95")
    left.set_xticks(list(x), [run.label for run in CPU_RUNS], fontsize=8)
    left.set(ylabel="first audio (s)", title="CPU, 4 streaming clients")
    left.legend()
    for run, report in zip(GPU_RUNS, gpu, strict=True):
        clients, _, p50, p95 = zip(*gpu_levels(report, run), strict=True)
        (line,) = right.plot(clients, p95, marker="o", label=f"{run.label}: p95")
        right.plot(clients, p50, marker=".", linestyle=":", color=line.get_color())
    right.set_xscale("log", base=2)
    right.set_xticks([8, 32, 128], ["8", "32", "128"])
    right.set(xlabel="streaming clients (dotted: p50)", ylabel="first audio (s)", title="GPU, random weights")
    right.legend(fontsize=7)
    figure.suptitle("First audio under load")
    _save(figure, out)


def plot_gpu(reports: Sequence[Report], out: Path) -> None:
    figure, axis = plt.subplots(figsize=(7, 4.5))
    for run, report in zip(GPU_RUNS, reports, strict=True):
        clients, throughput, _, _ = zip(*gpu_levels(report, run), strict=True)
        axis.plot(clients, throughput, marker="o", label=run.label)
    axis.set_xscale("log", base=2)
    axis.set_xticks([8, 32, 128], ["8", "32", "128"])
    axis.set(
        xlabel="closed-loop streaming clients",
        ylabel="audio seconds per second",
        ylim=(0, None),
        title="GPU through the server (random weights, mixed texts)",
    )
    axis.legend()
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
    parser.add_argument("--results", type=Path, default=Path("bench-results"), help="the JSON's root")
    parser.add_argument("--threads-json", type=Path, help="default: RESULTS/cpu-amd-epyc-avx512/threads.json")
    parser.add_argument(
        "--replicas-json", type=Path, help="default: RESULTS/cpu-amd-epyc-avx512/replicas.json"
    )
    parser.add_argument("--out-dir", type=Path, default=Path("docs/img"))
    return parser


Figure = tuple[str, Sequence[Path], Callable[[Sequence[Report], Path], None]]


def figures(args: argparse.Namespace) -> list[Figure]:
    """(image name, its input files, how to draw it from their reports)."""
    epyc = args.results / "cpu-amd-epyc-avx512"
    cpu = [args.results / run.path for run in CPU_RUNS]
    gpu = [args.results / run.path for run in GPU_RUNS]
    return [
        (CPU_PNG, cpu, plot_cpu),
        (
            FIRST_AUDIO_PNG,
            cpu + gpu,
            lambda reports, out: plot_first_audio(reports[: len(cpu)], reports[len(cpu) :], out),
        ),
        (GPU_PNG, gpu, plot_gpu),
        (
            THREADS_PNG,
            [args.threads_json or epyc / "threads.json"],
            lambda reports, out: plot_threads(reports[0], out),
        ),
        (
            REPLICAS_PNG,
            [args.replicas_json or epyc / "replicas.json"],
            lambda reports, out: plot_replicas(reports[0], out),
        ),
    ]


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    drawn = 0
    for name, sources, plot in figures(args):
        if missing := [str(source) for source in sources if not source.exists()]:
            print(f"{', '.join(missing)} not found: {name} skipped")
            continue
        plot([json.loads(source.read_text(encoding="utf-8")) for source in sources], args.out_dir / name)
        drawn += 1
    return 0 if drawn else 1


if __name__ == "__main__":
    sys.exit(main())
