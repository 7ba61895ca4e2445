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
then --clients closed-loop clients (scripts/bench/loadtest.py) send --requests streaming pcm requests, the
texts rotated, after --warmup requests not counted. A thread reads the worker's VmRSS every 0.5 s; the
"plateau" series is the highest RSS seen in each block of 20 completed requests, and VmHWM is read at the
end. Its audio is what the server delivers (chunks trimmed and joined with pauses), so characters per
second are reported too, a comparison that does not depend on how long either side's audio is.

    HF_HUB_OFFLINE=1 python scripts/bench/bench_cpu.py --out bench-results/<machine>/default.json
    HF_HUB_OFFLINE=1 python scripts/bench/bench_cpu.py --engine torch --skip-library \\
        --server-env KOKORO_MAX_BATCH_SIZE=1 --server-env KOKORO_BATCH_TIMEOUT_MS=0
    HF_HUB_OFFLINE=1 python scripts/bench/bench_cpu.py --requests 6 --warmup 1 --clients 2 --library-texts 2
    HF_HUB_OFFLINE=1 python scripts/bench/bench_cpu.py --skip-library \\
        --text-file scripts/bench/texts/run-on.txt \\
        --requests 16 --warmup 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a file: the repository's packages
from scripts.bench import loadtest
from scripts.bench.loadtest import non_negative_int, positive_float, positive_int
from scripts.bench.replica_benchmark import memory_mib, parse_env, wait_workers_ready, worker_pids
from scripts.benchlib import (
    RESULT_PREFIX,
    ROOT,
    logged_allocator,
    machine_info,
    package_version,
    parse_kb,
    process_result,
    ratio,
    read_text,
    recorded_args,
    thread_env,
    write_report,
)
from tests.harness import Server, free_port, server_command, spawn, stop_server

DEFAULT_WEIGHTS = Path.home() / ".cache" / "kokoro-openai-server" / "test-registry-weights"
REPO_ID = "hexgrad/Kokoro-82M"
VOICE = "af_heart"
LANG_CODE = "a"
SAMPLE_RATE = 24000
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
ENGINES = ("torch", "onnx")
# The server's own word on its engine: an "engine: NAME ..." line where it says what it chose, else the
# line each worker logs once loaded ("engine NAME ready", api/engine/scheduler.py).
CHOSEN_LOG = re.compile(r"\bengine:\s*(torch|onnx)\b")
READY_LOG = re.compile(r"\bengine (torch|onnx) ready\b")

TEXTS = (
    "The train to Edinburgh leaves from platform nine at a quarter past eight.",
    "Please remember to water the tomatoes while I'm away. They need a full can every evening, and a "
    "little more if the weather stays this hot.",
    "Our support team is available from nine in the morning until six in the evening, Monday to Friday.",
    "The library will close early on Saturday for the annual book sale. Volunteers are still welcome, and "
    "anyone who helps gets first pick of the rare editions. Coffee and biscuits will be provided.",
    "She opened the letter slowly, as if the words inside might change if she hurried.",
    "Add the flour a spoonful at a time, stirring gently so that no lumps form. When the mixture is "
    "smooth, pour in the warm milk and let it rest for ten minutes.",
    "Traffic on the northern bypass is moving slowly after an earlier accident near the river bridge. "
    "Drivers heading into the city should allow an extra twenty minutes. The southbound lanes are clear.",
    "Thank you for your patience.",
    "The first astronomers who studied the rings of Saturn thought they might be solid, like the brim of "
    "a hat. We now know they are made of countless pieces of ice and rock, some as small as grains of "
    "sand and others as large as a house. Together they stretch for hundreds of thousands of kilometres, "
    "yet in most places they are only a few metres thick.",
    "If you have any questions about your bill, press two to speak with someone from accounts.",
    "The old mill by the river had been empty for years. Children dared each other to touch its door, "
    "and nobody ever did it twice.",
    "Before you begin, make sure the device is switched off and unplugged. Remove the back cover with a "
    "small screwdriver and set the screws aside. Slide the old battery out of its holder, then insert the "
    "new one with the positive side facing up.",
    "It was the kind of morning that made everyone on the street stop for a moment and look up at the sky.",
    "Researchers followed more than three thousand volunteers for ten years. Those who walked for at "
    "least half an hour a day slept better, reported less stress, and visited their doctors less often.",
    "Your appointment is confirmed for Tuesday at eleven. If you need to change it, reply to this message "
    "at least a day in advance.",
    "Nobody in the village could remember who had planted the great oak in the square. Some said it was a "
    "soldier returning from the war, others a young bride on her wedding day. Whoever it was, the tree had "
    "outlived them all, and every spring it still put out its leaves a week before any other tree nearby.",
    "Welcome aboard. Please keep your seat belt fastened while you are seated.",
    "The recipe calls for fresh basil, but dried basil works almost as well if you use half as much. Add "
    "it near the end so the flavour stays bright.",
    "Good afternoon, and thank you for joining us. Today we will look at how small businesses can prepare "
    "for the busy holiday season. We will cover stock planning, staffing, and what to do when a delivery "
    "arrives late. There will be time for questions at the end.",
    "The lighthouse keeper wrote the same short line in his logbook every night: lamp lit, sea calm, all "
    "well.",
)


# --- pure parts ------------------------------------------------------------------------------------------


def rotated(texts: Sequence[str], count: int) -> list[str]:
    """`count` texts, the list repeated as often as needed (request i sends text i mod n, as loadtest.py)."""
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


def library_summary(texts: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Totals over the library's per-text records ({"chars", "audio_s", "wall_s"})."""
    audio = sum(text["audio_s"] for text in texts)
    wall = sum(text["wall_s"] for text in texts)
    chars = sum(text["chars"] for text in texts)
    return {
        "texts_measured": len(texts),
        "audio_s": round(audio, 3),
        "wall_s": round(wall, 3),
        "audio_s_per_s": _round(ratio(audio, wall)),
        "chars_per_s": _round(ratio(chars, wall)),
    }


def faster_library(runs: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The run with the most audio seconds per second (the stricter yardstick for the server); None when
    no run has a figure."""
    measured = [run for run in runs if run.get("audio_s_per_s") is not None]
    return max(measured, key=lambda run: run["audio_s_per_s"], default=None)


def _round(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


def server_load_record(level: Any, texts: Sequence[str]) -> dict[str, Any]:
    """The figures of the measured requests (a loadtest.LevelResult); chars of the successful ones."""
    chars = sum(len(texts[sample.index % len(texts)]) for sample in level.samples if sample.ok)
    return {
        "requests": level.requests,
        "ok": level.ok,
        "non_200": level.requests - level.status_counts.get("200", 0),
        "failed": level.failed,
        "status_counts": level.status_counts,
        "error_kinds": level.error_kinds,
        "wall_s": round(level.wall_s, 3),
        "audio_s": round(level.audio_s, 3),
        "audio_s_per_s": round(level.audio_s_per_s, 4),
        "chars_per_s": _round(ratio(chars, level.wall_s)),
        "ttfb_p50_s": _percentile(level.ttfb_s, "p50"),
        "ttfb_p95_s": _percentile(level.ttfb_s, "p95"),
        "latency_p50_s": _percentile(level.latency_s, "p50"),
        "latency_p95_s": _percentile(level.latency_s, "p95"),
    }


def _percentile(spread: Any, key: str) -> float | None:
    return None if spread is None else round(getattr(spread, key), 4)


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


def server_env(args: argparse.Namespace, base: Mapping[str, str]) -> dict[str, str]:
    """The server's environment: this one, the weights, no fetching or hub, then --engine and --server-env."""
    env = {
        **base,
        "KOKORO_WEIGHTS_DIR": str(args.weights_dir),
        "KOKORO_FETCH_WEIGHTS": "false",
        "HF_HUB_OFFLINE": "1",
    }
    if args.engine is not None:
        env["KOKORO_ENGINE"] = args.engine
    return {**env, **parse_env(args.server_env)}


# --- the library, in its own process ---------------------------------------------------------------------


def measure_library(args: argparse.Namespace) -> dict[str, Any]:
    """Runs this script as the library's measuring process (fresh, so the thread settings hold)."""
    spec = {
        "weights_dir": str(args.weights_dir),
        "threads": args.library_threads,
        "texts": rotated(args.texts, args.library_texts or len(args.texts)),
    }
    completed = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--library-process"], input=json.dumps(spec),
        text=True, capture_output=True, cwd=ROOT, env=thread_env(args.library_threads), check=False,
        timeout=args.library_timeout,
    )  # fmt: skip
    return process_result(completed, "the library process")


def library_process() -> None:
    """The measuring process: reads its spec on stdin, prints RESULT_PREFIX + JSON."""
    spec = json.loads(sys.stdin.read())
    print(RESULT_PREFIX + json.dumps(run_library(spec)), flush=True)


def run_library(spec: Mapping[str, Any]) -> dict[str, Any]:
    import torch

    torch.set_num_threads(spec["threads"])
    weights = Path(spec["weights_dir"])
    started = time.perf_counter()
    pipeline = build_pipeline(weights)
    voice = torch.load(weights / "voices" / f"{VOICE}.pt", weights_only=True)
    load_s = time.perf_counter() - started
    time_text(pipeline, voice, spec["texts"][0])  # warm-up: G2P's lexicons, the first forward
    texts = [time_text(pipeline, voice, text) for text in spec["texts"]]
    return {
        "pipeline": f"kokoro {package_version('kokoro')} KPipeline('{LANG_CODE}'), KModel fp32 on cpu",
        "voice": VOICE,
        "threads": spec["threads"],
        "threads_effective": torch.get_num_threads(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "load_s": round(load_s, 2),
        "peak_rss_mib": round((parse_kb(read_text("/proc/self/status"), "VmHWM") or 0) / 1024, 1),
        **library_summary(texts),
        "texts": texts,
    }


def build_pipeline(weights: Path) -> Any:
    """kokoro's own pipeline with its model read from `weights`: nothing comes from the hub."""
    from kokoro import KModel, KPipeline

    model = KModel(
        repo_id=REPO_ID, config=str(weights / "config.json"), model=str(weights / "kokoro-v1_0.pth")
    ).eval()
    return KPipeline(lang_code=LANG_CODE, repo_id=REPO_ID, model=model)


def time_text(pipeline: Any, voice: Any, text: str) -> dict[str, Any]:
    """One text through the pipeline, all its chunks: wall time and the audio it yields."""
    started = time.perf_counter()
    samples = sum(
        len(result.audio) for result in pipeline(text, voice=voice, speed=1) if result.audio is not None
    )
    wall = time.perf_counter() - started
    audio = samples / SAMPLE_RATE
    return {
        "chars": len(text),
        "audio_s": round(audio, 4),
        "wall_s": round(wall, 4),
        "rtf": _round(ratio(wall, audio)),
    }


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


@contextmanager
def running_server(env: Mapping[str, str], log_dir: Path) -> Iterator[Server]:
    """A one-worker server, ready."""
    port = free_port()
    server = spawn(server_command(port), log_dir / "server.log", port, env)
    try:
        wait_workers_ready(server, workers_logged=1)
        yield server
    finally:
        stop_server(server)


def serving_pid(server_pid: int) -> int:
    """The process that runs the model: uvicorn's worker, or with one worker the server itself."""
    workers = worker_pids(server_pid)
    return workers[0] if workers else server_pid


def measure_server(args: argparse.Namespace, env: Mapping[str, str], log_dir: Path) -> dict[str, Any]:
    with running_server(env, log_dir) as server:
        pid = serving_pid(server.process.pid)
        idle = memory_mib(read_text(f"/proc/{pid}/status"))
        config = loadtest.LoadConfig(
            url=server.url, texts=args.texts, formats=("pcm",), requests=args.requests, timeout=args.timeout,
            warmup=args.warmup,
        )  # fmt: skip
        with RssSampler(pid) as sampler:
            phase, wall_s = asyncio.run(loadtest.measure_level(config, args.clients))
        end = memory_mib(read_text(f"/proc/{pid}/status"))
        log = server.log()
    level = loadtest.summarize(args.clients, phase.samples, wall_s)
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


def build_report(
    args: argparse.Namespace,
    machine: dict[str, Any],
    library_runs: Sequence[Mapping[str, Any]],
    server: dict[str, Any],
) -> dict[str, Any]:
    library = faster_library(library_runs)
    return {
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "args": recorded_args(args, leave_out={"texts"}),  # the texts are the report's own field
        "machine": {**machine, "load_average_end": list(os.getloadavg())},
        "kernel_env": kernel_env(os.environ),
        "texts": list(args.texts),
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--weights-dir", type=Path, default=DEFAULT_WEIGHTS, help=f"(default {DEFAULT_WEIGHTS})"
    )
    parser.add_argument("--clients", type=positive_int, default=4, help="concurrent streaming clients")
    parser.add_argument("--requests", type=positive_int, default=200, help="measured server requests")
    parser.add_argument("--warmup", type=non_negative_int, default=4, help="server requests not counted")
    parser.add_argument(
        "--library-texts", type=positive_int, help="texts the library runs (default: each text once)"
    )
    parser.add_argument(
        "--text-file", type=Path, help=f"texts separated by blank lines (default: the {len(TEXTS)} built-in)"
    )
    parser.add_argument("--library-threads", type=positive_int, default=2, help="OMP and torch threads")
    parser.add_argument("--skip-library", action="store_true", help="measure the server only")
    parser.add_argument(
        "--library-once", action="store_true", help="run the library before the server only, not after it too"
    )
    parser.add_argument(
        "--engine", choices=["auto", *ENGINES], help="KOKORO_ENGINE (default: the server's default)"
    )
    parser.add_argument(
        "--server-env", action="append", default=[], metavar="KEY=VALUE", help="a server setting (repeatable)"
    )
    parser.add_argument("--timeout", type=positive_float, default=600.0, help="seconds per server request")
    parser.add_argument(
        "--library-timeout", type=positive_float, default=3600.0, help="seconds for the whole library run"
    )
    parser.add_argument("--out", type=Path, default=Path("bench-results/cpu.json"))
    parser.add_argument("--library-process", action="store_true", help=argparse.SUPPRESS)
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        parse_env(args.server_env)  # a malformed pair fails before anything starts
        # the texts both sides run, read once; an empty or unreadable --text-file fails here too
        args.texts = loadtest.read_texts(args.text_file) if args.text_file else TEXTS
    except (OSError, ValueError) as exc:
        parser.error(str(exc))
    return args


def library_run(args: argparse.Namespace, when: str) -> dict[str, Any]:
    """One measured run of the library; `when` says whether it ran before or after the server."""
    run = {"when": when, "load_average_before": load_before(f"library {when}"), **measure_library(args)}
    print(f"library ({when} the server): {run['audio_s_per_s']} audio-s/s over {run['texts_measured']} texts")
    return run


def load_before(phase: str) -> list[float]:
    """The load averages before a phase starts; a warning on stderr when the machine is busy."""
    load = list(os.getloadavg())
    warning = busy_warning(load[0], len(os.sched_getaffinity(0)))
    if warning is not None:
        print(f"warning ({phase}): {warning}", file=sys.stderr, flush=True)
    return load


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.library_process:
        library_process()
        return 0
    machine = machine_info()
    library_runs: list[dict[str, Any]] = []
    if not args.skip_library:
        library_runs.append(library_run(args, "before"))
    log_dir = Path(tempfile.mkdtemp(prefix="kokoro-bench-cpu-"))
    server_load = load_before("server")
    server = {
        "load_average_before": server_load,
        **measure_server(args, server_env(args, os.environ), log_dir),
    }
    if not args.skip_library and not args.library_once:
        library_runs.append(library_run(args, "after"))
    report = build_report(args, machine, library_runs, server)
    write_report(report, args.out)
    print(table(report), flush=True)
    return 0 if server["non_200"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
