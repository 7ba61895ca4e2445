"""The server's default configuration against the kokoro library's own fp32 pipeline, on this machine, in
the same run: audio seconds per wall second of each, and their ratio.

Library: a fresh process with OMP_NUM_THREADS = torch.set_num_threads = --library-threads (2) runs kokoro's
KPipeline with a KModel read from the weights directory (no hub) and voice af_heart as a tensor, one text
at a time with the library's own G2P and chunking, after one warm-up text; --library-texts texts (default:
each text once). The texts are 20 built-in paragraphs of one to four sentences, or --text-file's. Its audio
is what the pipeline yields. It runs before the server and again after it (unless --library-once), and the
ratio is taken against the faster of the two runs: the library's figure moves more than the server's from
run to run on a shared VM, and the faster run is the stricter yardstick.

Server: `python -m api` with its defaults, given only the weights directory, KOKORO_FETCH_WEIGHTS=false,
HF_HUB_OFFLINE=1, --engine (KOKORO_ENGINE) and --server-env pairs. Once ready, its idle memory is read,
then --clients closed-loop clients (`load`'s) send --requests streaming pcm requests, the
texts rotated, after --warmup requests not counted. A thread reads the worker's VmRSS every 0.5 s; the
"plateau" series is the highest RSS seen in each block of 20 completed requests, and VmHWM is read at the
end. Its audio is what the server delivers (chunks trimmed and joined with pauses), so characters per
second are reported too, a comparison that does not depend on how long either side's audio is.

    python -m scripts.bench cpu --out bench-results/<machine>/default.json
    python -m scripts.bench cpu --engine torch --skip-library \\
        --server-env KOKORO_MAX_BATCH_SIZE=1 --server-env KOKORO_BATCH_TIMEOUT_MS=0
    python -m scripts.bench cpu --requests 6 --warmup 1 --clients 2 --library-texts 2
    python -m scripts.bench cpu --skip-library --text-file scripts/bench/texts/run-on.txt \\
        --requests 16 --warmup 2
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from scripts.bench import load
from scripts.bench.common import (
    ENGINES,
    PARAGRAPHS,
    Report,
    add_engine,
    add_server_env,
    add_weights,
    checked_server_env,
    logged_allocator,
    memory_mib,
    non_negative_int,
    positive_float,
    positive_int,
    ratio,
    read_text,
    warn,
)
from scripts.bench.measure import measure_library
from scripts.harness import process_env, running, worker_pids

# Not recorded with the arguments: the texts are the results' own field, the settings --server-env's.
LEAVE_OUT = ("texts", "settings")
BLOCK_REQUESTS = 20  # one plateau value per this many completed requests
RSS_INTERVAL_S = 0.5
BUSY_LOAD_PER_CORE = 0.25
KERNEL_ENV = (
    "ATEN_CPU_CAPABILITY",
    "ONEDNN_MAX_CPU_ISA",
    "MKL_ENABLE_INSTRUCTIONS",
    "MKL_CBWR",
    "OMP_NUM_THREADS",
)
# The server's own word on its engine: an "engine: NAME ..." line where it says what it chose, else the
# line each worker logs once loaded ("engine NAME ready", api/engine/scheduling/scheduler.py).
CHOSEN_LOG = re.compile(r"\bengine:\s*(torch|onnx)\b")
READY_LOG = re.compile(r"\bengine (torch|onnx) ready\b")

# --- pure parts ------------------------------------------------------------------------------------------


def rotated(texts: Sequence[str], count: int) -> list[str]:
    """`count` texts, the list repeated as often as needed (request i sends text i mod n, as `load`)."""
    return [texts[index % len(texts)] for index in range(count)]


def completion_times(samples: Sequence[Any], started: float) -> list[float]:
    """When each request of a load-test phase ended, on the clock of `started`, in order."""
    return sorted(started + sample.start_s + sample.latency_s for sample in samples)


def plateau_blocks(
    completions: Sequence[float],
    rss: Sequence[tuple[float, float]],
    started: float,
    block: int = BLOCK_REQUESTS,
) -> list[dict[str, Any]]:
    """Per block of `block` completed requests (the last one may hold fewer): its requests, when it ended
    (seconds from `started`) and the highest RSS (MiB) read within it; a block shorter than the reading
    interval gets the last reading before its end, or None when there is none."""
    blocks, begin = [], started
    for first in range(0, len(completions), block):
        ends = completions[first : first + block]
        blocks.append(
            {
                "requests": len(ends),
                "end_s": round(ends[-1] - started, 3),
                "rss_max_mib": block_peak(rss, begin, ends[-1]),
            }
        )
        begin = ends[-1]
    return blocks


def block_peak(rss: Sequence[tuple[float, float]], begin: float, end: float) -> float | None:
    inside = [value for at, value in rss if begin <= at <= end]
    if inside:
        return max(inside)
    before = [value for at, value in rss if at <= end]
    return before[-1] if before else None


def chosen_engine(log: str, env: Mapping[str, str]) -> tuple[str | None, str | None]:
    """The engine the server runs and where that was read: its "engine:" line, its ready line, or
    KOKORO_ENGINE; (None, None) when none says."""
    for source, pattern in (("log engine:", CHOSEN_LOG), ("log ready", READY_LOG)):
        found = pattern.search(log)
        if found:
            return found.group(1), source
    if env.get("KOKORO_ENGINE") in ENGINES:  # not "auto": that names no engine
        return env["KOKORO_ENGINE"], "KOKORO_ENGINE"
    return None, None


def faster_library(runs: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The run with the most audio seconds per second (the stricter yardstick for the server); None when
    no run has a figure."""
    measured = [run for run in runs if run.get("audio_s_per_s") is not None]
    return max(measured, key=lambda run: run["audio_s_per_s"], default=None)


def _round(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


def server_load_record(level: load.LevelResult, texts: Sequence[str]) -> dict[str, Any]:
    """The figures of the measured requests; chars of the successful ones."""
    chars = sum(len(texts[sample.index % len(texts)]) for sample in level.samples if sample.ok)
    return {
        **load.level_record(level),
        "non_200": level.requests - level.status_counts.get("200", 0),
        "chars_per_s": _round(ratio(chars, level.wall_s)),
    }


def comparison(library: Mapping[str, Any] | None, server: Mapping[str, Any]) -> dict[str, float | None]:
    """Server over library, in audio seconds per second and in characters per second."""
    if library is None:
        return {"ratio_vs_library": None, "chars_ratio_vs_library": None}
    return {
        "ratio_vs_library": _ratio_of(server, library, "audio_s_per_s"),
        "chars_ratio_vs_library": _ratio_of(server, library, "chars_per_s"),
    }


def _ratio_of(server: Mapping[str, Any], library: Mapping[str, Any], key: str) -> float | None:
    if server.get(key) is None or library.get(key) is None:
        return None
    return _round(ratio(server[key], library[key]))


def busy_warning(load_1min: float, cores: int) -> str | None:
    """A warning when other work holds more than a quarter of the cores: then neither side's figure, nor
    their ratio, says what this machine can do."""
    if load_1min <= cores * BUSY_LOAD_PER_CORE:
        return None
    return f"load average {load_1min:.2f} on {cores} cores: other work is running, the figures are unreliable"


def kernel_env(env: Mapping[str, str]) -> dict[str, str | None]:
    return {name: env.get(name) for name in KERNEL_ENV}


def server_env(args: argparse.Namespace, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The server's environment: this one, the weights, no fetching or hub, then --engine and --server-env."""
    engine = {} if args.engine is None else {"KOKORO_ENGINE": args.engine}
    return process_env(args.weights, base=base, **{**engine, **args.settings})


# --- the server ------------------------------------------------------------------------------------------


class RssSampler:
    """Reads a process's VmRSS every `interval` seconds on a thread: (perf_counter time, MiB) pairs."""

    def __init__(self, pid: int, interval: float = RSS_INTERVAL_S) -> None:
        self.pid = pid
        self.interval = interval
        self.readings: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def _run(self) -> None:
        while True:
            self.read()
            if self._stop.wait(self.interval):
                return

    def read(self) -> None:
        rss = memory_mib(read_text(f"/proc/{self.pid}/status"))["rss_mib"]
        if rss is not None:
            self.readings.append((time.perf_counter(), rss))

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()
        self.read()


def serving_pid(server_pid: int) -> int:
    """The process that runs the model: uvicorn's worker, or with one worker the server itself."""
    workers = worker_pids(server_pid)
    return workers[0] if workers else server_pid


def measure_server(args: argparse.Namespace, env: Mapping[str, str], log_dir: Path) -> dict[str, Any]:
    with running(env, log_dir / "server.log") as server:
        pid = serving_pid(server.process.pid)
        idle = memory_mib(read_text(f"/proc/{pid}/status"))
        config = load.LoadConfig(
            url=server.url, texts=args.texts, formats=("pcm",), requests=args.requests, timeout=args.timeout,
            warmup=args.warmup,
        )  # fmt: skip
        with RssSampler(pid) as sampler:
            phase, wall_s = asyncio.run(load.measure_level(config, args.clients))
        end = memory_mib(read_text(f"/proc/{pid}/status"))
        log = server.log()
    level = load.summarize(args.clients, phase.samples, wall_s)
    engine, source = chosen_engine(log, env)
    completions = completion_times(phase.samples, phase.started)
    return {
        "engine": engine,
        "engine_source": source,
        "allocator": logged_allocator(log),
        "settings": {key: value for key, value in env.items() if key.startswith("KOKORO_")},
        "clients": args.clients,
        **server_load_record(level, args.texts),
        "rss_idle_mib": idle["rss_mib"],
        "rss_plateau": plateau_blocks(completions, sampler.readings, phase.started),
        "rss_end_mib": end["rss_mib"],
        "hwm_mib": end["hwm_mib"],
        "log": str(log_dir / "server.log"),
    }


# --- the report ------------------------------------------------------------------------------------------


def results(
    texts: Sequence[str], library_runs: Sequence[Mapping[str, Any]], server: dict[str, Any]
) -> dict[str, Any]:
    library = faster_library(library_runs)
    return {
        "texts": list(texts),
        "kernel_env": kernel_env(os.environ),
        "library_runs": list(library_runs),
        "library": library,
        "server": server,
        **comparison(library, server),
    }


def table(report: Mapping[str, Any]) -> str:
    header = (
        f"{'':<40} {'audio-s/s':>9} {'chars/s':>8} {'ttfb p50/p95 s':>15} {'lat p50/p95 s':>15} "
        f"{'RSS idle/plateau/HWM MiB':>25} {'non-200':>7}"
    )
    runs = report.get("library_runs") or [None]
    rows = [header, *(library_row(run) for run in runs), server_row(report["server"])]
    audio, chars = report["ratio_vs_library"], report["chars_ratio_vs_library"]
    if audio is not None:
        against = f" (against the faster library run, {report['library']['when']})" if len(runs) > 1 else ""
        rows.append(f"server / library: {audio:.3f}x audio-s/s, {_cell(chars, '.3f')}x chars/s{against}")
    return "\n".join(rows)


def library_row(library: Mapping[str, Any] | None) -> str:
    if library is None:
        return f"{'library: skipped':<40}"
    when = f", {library['when']}" if "when" in library else ""
    label = f"library (torch fp32, {library['threads']} threads{when})"
    memory = f"-/-/{library['peak_rss_mib']:.0f}"
    return (
        f"{label:<40} {_cell(library['audio_s_per_s'], '.3f'):>9} {_cell(library['chars_per_s'], '.1f'):>8} "
        f"{'-':>15} {'-':>15} {memory:>25} {'-':>7}"
    )


def server_row(server: Mapping[str, Any]) -> str:
    label = f"server ({server['engine'] or '?'}, {server['clients']} clients)"
    plateau = max(
        (b["rss_max_mib"] for b in server["rss_plateau"] if b["rss_max_mib"] is not None), default=None
    )
    memory = (
        f"{_cell(server['rss_idle_mib'], '.0f')}/{_cell(plateau, '.0f')}/{_cell(server['hwm_mib'], '.0f')}"
    )
    return (
        f"{label:<40} {server['audio_s_per_s']:>9.3f} {_cell(server['chars_per_s'], '.1f'):>8} "
        f"{_pair(server, 'ttfb'):>15} {_pair(server, 'latency'):>15} {memory:>25} {server['non_200']:>7}"
    )


def _cell(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _pair(row: Mapping[str, Any], name: str) -> str:
    p50, p95 = row[f"{name}_p50_s"], row[f"{name}_p95_s"]
    return "-" if p50 is None else f"{p50:.2f}/{p95:.2f}"


# --- the run ---------------------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_weights(parser)
    parser.add_argument("--clients", type=positive_int, default=4, help="concurrent streaming clients")
    parser.add_argument("--requests", type=positive_int, default=200, help="measured server requests")
    parser.add_argument("--warmup", type=non_negative_int, default=4, help="server requests not counted")
    parser.add_argument(
        "--library-texts", type=positive_int, help="texts the library runs (default: each text once)"
    )
    texts = f"texts separated by blank lines (default: the {len(PARAGRAPHS)} built-in)"
    parser.add_argument("--text-file", type=Path, help=texts)
    parser.add_argument("--library-threads", type=positive_int, default=2, help="OMP and torch threads")
    parser.add_argument("--skip-library", action="store_true", help="measure the server only")
    parser.add_argument(
        "--library-once", action="store_true", help="run the library before the server only, not after it too"
    )
    add_engine(parser)
    add_server_env(parser)
    parser.add_argument("--timeout", type=positive_float, default=600.0, help="seconds per server request")
    parser.add_argument(
        "--library-timeout", type=positive_float, default=3600.0, help="seconds for the whole library run"
    )


def prepare(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The settings and the texts both sides run, read once: a malformed pair, or an empty or unreadable
    --text-file, fails before anything starts."""
    args.settings = checked_server_env(parser, args)
    try:
        args.texts = load.read_texts(args.text_file) if args.text_file else PARAGRAPHS
    except (OSError, ValueError) as exc:
        parser.error(str(exc))


def library_run(args: argparse.Namespace, when: str) -> dict[str, Any]:
    """One measured run of the library; `when` says whether it ran before or after the server."""
    texts = rotated(args.texts, args.library_texts or len(args.texts))
    measured = measure_library(args.weights, args.library_threads, texts, args.library_timeout)
    run = {"when": when, "load_average_before": load_before(f"library {when}"), **measured}
    print(f"library ({when} the server): {run['audio_s_per_s']} audio-s/s over {run['texts_measured']} texts")
    return run


def load_before(phase: str) -> list[float]:
    """The load averages before a phase starts; a warning on stderr when the machine is busy."""
    load = list(os.getloadavg())
    warning = busy_warning(load[0], len(os.sched_getaffinity(0)))
    if warning is not None:
        warn(f"({phase}) {warning}")
    return load


def run(args: argparse.Namespace) -> int:
    report = Report(args, leave_out=LEAVE_OUT)
    library_runs: list[dict[str, Any]] = []
    if not args.skip_library:
        library_runs.append(library_run(args, "before"))
    log_dir = Path(tempfile.mkdtemp(prefix="kokoro-bench-cpu-"))
    server_load = load_before("server")
    server = {"load_average_before": server_load, **measure_server(args, server_env(args), log_dir)}
    if not args.skip_library and not args.library_once:
        library_runs.append(library_run(args, "after"))
    measured = results(args.texts, library_runs, server)
    report.write(measured)
    print(table(measured), flush=True)
    return 0 if server["non_200"] == 0 else 1
