"""Time from `python -m api`'s start to its first `/ready` 200, over several starts in a row that share one
compile-cache directory: the first finds the directory empty (a new one, unless --cache-dir names one that
is filled), the others load what it left. Each start's phases are read from the server's own log:

- `python`: from the start to the allocator's line (the interpreter and, under tcmalloc, its second start);
- `app`: to the engine's line (the app's imports and construction);
- `load`: to "KModel loaded" (torch and kokoro imported, the checkpoint read and checked, kernels prepared);
- `warmup`: to "compiled kernels: ..." (the compiled graphs loaded or built, one warm-up call);
- `engine_ready`: to "engine NAME ready" (the G2P's first call);
- `ready`: to the first `/ready` 200 seen (asked every 0.1 s).

The server runs with its defaults but the weights directory, KOKORO_FETCH_WEIGHTS=false, HF_HUB_OFFLINE=1,
--engine, the --server-env pairs (as bench_cpu.py starts it) and KOKORO_COMPILE_CACHE_DIR; nothing else
runs in this process meanwhile.

    python scripts/bench/bench_ready.py --engine torch --out bench-results/<machine>/ready.json
    python scripts/bench/bench_ready.py --starts 2 --server-env ONEDNN_MAX_CPU_ISA=AVX512_CORE_VNNI
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a file: the repository's packages
from scripts.bench.bench_cpu import DEFAULT_WEIGHTS, ENGINES, server_env
from scripts.bench.loadtest import positive_int
from scripts.benchlib import machine_info, recorded_args, write_report
from tests.harness import free_port, server_command, spawn, stop_server, wait_ready

TIMEOUT_S = 600.0
POLL_S = 0.1
LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \w+ (\S+): (.*)$")
# The log line each phase ends with (the logger's name, a pattern of its message), in order.
PHASES = (
    ("python", "__main__", re.compile(r"^allocator: ")),
    ("app", "api.app", re.compile(r"^engine: ")),
    ("load", "api.engine.torch_engine", re.compile(r"^KModel loaded ")),
    ("warmup", "api.engine.torch_engine", re.compile(r"^compiled kernels: ")),
    ("engine_ready", "api.engine.scheduler", re.compile(r"^engine \w+ ready ")),
)
GRAPHS = re.compile(r"compiled kernels: (\d+) graphs? loaded from the cache, (\d+) built")


def log_times(log: str) -> list[tuple[float, str, str]]:
    """(epoch seconds, logger, message) of each line of the server's plain-text log (local time)."""
    lines = []
    for line in log.splitlines():
        match = LOG_TIME.match(line)
        if match:
            stamp = datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            lines.append((stamp, match.group(2), match.group(3)))
    return lines


def phase_times(log: str, started: float) -> dict[str, float]:
    """Seconds from `started` (epoch) to the first line that ends each phase, for the phases logged."""
    lines = log_times(log)
    found = {}
    for phase, name, pattern in PHASES:
        stamp = next((at for at, logger, message in lines if logger == name and pattern.match(message)), None)
        if stamp is not None:
            found[phase] = round(stamp - started, 2)
    return found


def one_start(env: dict[str, str], log_path: Path) -> dict[str, Any]:
    port = free_port()
    started = time.time()
    server = spawn(server_command(port), log_path, port, env)
    try:
        wait_ready(server, TIMEOUT_S, poll_s=POLL_S)
        ready_s = time.time() - started
    finally:
        stop_server(server)
    log = server.log()
    graphs = GRAPHS.search(log)
    return {
        "ready_s": round(ready_s, 2),
        "phases_s": phase_times(log, started),
        "graphs_loaded": None if graphs is None else int(graphs.group(1)),
        "graphs_built": None if graphs is None else int(graphs.group(2)),
        "engine_line": next((line for line in log.splitlines() if "api.app: engine:" in line), None),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--weights-dir", type=Path, default=DEFAULT_WEIGHTS, help=f"(default {DEFAULT_WEIGHTS})"
    )
    parser.add_argument("--starts", type=positive_int, default=3, help="starts in a row (default 3)")
    parser.add_argument("--cache-dir", type=Path, help="the compile-cache directory (default: a new one)")
    parser.add_argument(
        "--engine", choices=["auto", *ENGINES], help="KOKORO_ENGINE (default: the server's default)"
    )
    parser.add_argument(
        "--server-env", action="append", default=[], metavar="KEY=VALUE", help="a server setting (repeatable)"
    )
    parser.add_argument("--out", type=Path, default=Path("bench-results/ready.json"), help="JSON report")
    args = parser.parse_args()
    cache_dir = args.cache_dir or Path(tempfile.mkdtemp(prefix="kokoro-ready-cache-"))
    env = {**server_env(args, os.environ), "KOKORO_COMPILE_CACHE_DIR": str(cache_dir)}
    cache_was_empty = not any(cache_dir.iterdir()) if cache_dir.exists() else True
    starts = []
    with tempfile.TemporaryDirectory(prefix="kokoro-ready-") as logs:
        for index in range(args.starts):
            result = one_start(env, Path(logs) / f"start-{index}.log")
            print(
                f"start {index + 1}: ready in {result['ready_s']:.1f} s, phases {result['phases_s']}",
                flush=True,
            )
            starts.append(result)
    report = {
        "args": recorded_args(args),
        "machine": machine_info(),
        "cache_dir_was_empty": cache_was_empty,
        "starts": starts,
    }
    write_report(report, args.out)


if __name__ == "__main__":
    main()
