"""Idle unload, measured: the memory a worker gives back when `KOKORO_IDLE_UNLOAD_S` frees its model, and what
the request that finds it unloaded waits for.

One server (`python -m api`, one worker) over the given weights with `KOKORO_IDLE_UNLOAD_S` set and a long
`KOKORO_RELOAD_WAIT_S` (the request waits for the reload rather than getting 503). After /ready, one request
(pcm, one sentence) warms it; then --cycles times: wait until /ready says `unloaded`, settle, read memory,
send the request and time its first byte and its end, read memory, send it again (loaded and warm). Memory:
the resident set of the server's processes (`VmRSS`, summed over the process and its children) and, where
`nvidia-smi` answers, the GPU memory in use (the whole GPU's: run it alone there).

    python -m scripts.bench idle-unload --out bench-results/<machine>/idle-unload.json
    bash scripts/gpu/gpu_session.sh unload                 # on a GPU machine: KOKORO_DEVICE=cuda
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from scripts.bench.common import (
    Report,
    add_engine,
    add_server_env,
    add_weights,
    checked_server_env,
    child_pids,
    parse_kb,
    read_text,
)
from scripts.harness import Server, launch, process_env, stop_server, wait_ready

TEXT = "Hello world, this is a test of a model loaded again."
READY_TIMEOUT_S = 600.0


def rss_mib(pid: int) -> float:
    """VmRSS of `pid` and every process below it, in MiB."""
    total_kib, pids = 0, [pid]
    while pids:
        current = pids.pop()
        total_kib += parse_kb(read_text(f"/proc/{current}/status"), "VmRSS") or 0
        pids.extend(child_pids(current))
    return round(total_kib / 1024, 1)


def gpu_mib() -> float | None:
    """GPU memory in use (MiB, the first GPU), None without nvidia-smi."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return float(out.split()[0])


def memory(server: Server) -> dict[str, float | None]:
    return {"rss_mib": rss_mib(server.process.pid), "gpu_mib": gpu_mib()}


def speak(url: str) -> dict[str, float]:
    """One request: seconds to the first audio byte and to the end."""
    started = time.perf_counter()
    first = None
    body = {"model": "kokoro", "input": TEXT, "voice": "af_heart", "response_format": "pcm"}
    with httpx.stream("POST", f"{url}/v1/audio/speech", json=body, timeout=300) as response:
        response.raise_for_status()
        for chunk in response.iter_bytes():
            if chunk and first is None:
                first = time.perf_counter() - started
    return {"first_byte_s": round(first or 0.0, 3), "total_s": round(time.perf_counter() - started, 3)}


def wait_unloaded(url: str, timeout_s: float) -> float:
    """Seconds until /ready says the model is unloaded."""
    started = time.perf_counter()
    while time.perf_counter() - started < timeout_s:
        if httpx.get(f"{url}/ready", timeout=5).json().get("status") == "unloaded":
            return round(time.perf_counter() - started, 2)
        time.sleep(0.2)
    raise TimeoutError(f"the model was not unloaded within {timeout_s} s")


def reload_seconds(url: str) -> float | None:
    """kokoro_model_reload_seconds_sum from /metrics (every reload so far)."""
    for line in httpx.get(f"{url}/metrics", timeout=5).text.splitlines():
        if line.startswith("kokoro_model_reload_seconds_sum"):
            return float(line.split()[-1])
    return None


def measure(args: argparse.Namespace, log: Path) -> dict[str, Any]:
    engine = {} if args.engine is None else {"KOKORO_ENGINE": args.engine}
    unload = {"KOKORO_IDLE_UNLOAD_S": str(args.idle_s), "KOKORO_RELOAD_WAIT_S": "300"}
    env = process_env(args.weights, **{**engine, **args.settings, **unload})
    started = time.perf_counter()
    server = launch(env, log)
    try:
        wait_ready(server, READY_TIMEOUT_S)
        result: dict[str, Any] = {"ready_s": round(time.perf_counter() - started, 1), "cycles": []}
        result["first_request"] = speak(server.url)
        result["warm_request"] = speak(server.url)
        result["loaded"] = memory(server)
        for _ in range(args.cycles):
            cycle: dict[str, Any] = {"unloaded_after_s": wait_unloaded(server.url, args.idle_s + 60)}
            time.sleep(args.settle_s)
            cycle["unloaded"] = memory(server)
            cycle["request"] = speak(server.url)
            cycle["reloaded"] = memory(server)
            cycle["next_request"] = speak(server.url)
            result["cycles"].append(cycle)
            print(cycle, flush=True)
        result["reload_seconds_sum"] = reload_seconds(server.url)
    finally:
        stop_server(server)
    result["log_tail"] = [line for line in server.log().splitlines() if "reload" in line.lower()][-8:]
    return result


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_weights(parser)
    add_engine(parser)
    add_server_env(parser)
    parser.add_argument("--idle-s", type=float, default=5.0, help="KOKORO_IDLE_UNLOAD_S (default 5)")
    parser.add_argument(
        "--settle-s", type=float, default=3.0, help="wait after the unload before reading memory"
    )
    parser.add_argument("--cycles", type=int, default=3)


def prepare(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    args.settings = checked_server_env(parser, args)


def run(args: argparse.Namespace) -> int:
    report = Report(args, leave_out={"settings"})
    with tempfile.TemporaryDirectory(prefix="kokoro-unload-") as logs:
        result = measure(args, Path(logs) / "server.log")
    report.write(result)
    return 0
