"""Time from `python -m api`'s start to its first `/ready` 200, over several starts in a row that share one
compile-cache directory: the first finds the directory empty (a new one, unless --cache-dir names one that
is filled), the others load what it left. Each start's phases are read from the server's own log:

- `python`: from the start to the allocator's line (the interpreter and, under tcmalloc, its second start);
- `app`: to the engine's line (the app's imports and construction);
- `load`: to "KModel loaded" (torch and kokoro imported, the checkpoint read and checked, kernels prepared);
- `warmup`: to "compiled kernels: ..." (the compiled graphs loaded, or asked of the background compiler, and
  one warm-up call);
- `engine_ready`: to "engine NAME ready" (the G2P's first call);
- `ready`: to the first `/ready` 200 seen (asked every 0.1 s);
- `full_speed`: to "compiled kernels: all N in use" (the background compiler's last kernel taken over), on a
  start that had kernels to compile.

With --speech, one client sends the texts one after another (pcm, whole bodies) from the first `/ready` 200
until the kernels are compiled and --speech plus `--after` more requests are done: each request's audio,
time and the kernels' state before and after it (`/ready`'s `kernels`). Then, unless --skip-reference, the
same client against a start with KOKORO_TORCH_COMPILE=false (eager kernels, nothing compiling beside them),
and kokoro's own fp32 pipeline on the same texts (`cpu`'s library process): the background compile's
cost to requests is the eager start's figure over the figure while compiling.

With --from-clone, first the README's serve command (`bash scripts/serve.sh`) on a clone of HEAD with an
empty HOME (no pip or uv cache, no weights, no compile cache): the seconds to `setup: done`, to the weights
fetched, to `/ready` 200, to the first byte of streamed speech, and to full speed.

The server runs with its defaults but the weights directory, KOKORO_FETCH_WEIGHTS=false, HF_HUB_OFFLINE=1,
--engine, the --server-env pairs (as `cpu` starts it) and KOKORO_COMPILE_CACHE_DIR; nothing else runs in
this process meanwhile.

    python -m scripts.bench ready --engine torch --out bench-results/<machine>/ready.json
    python -m scripts.bench ready --starts 2 --speech --out bench-results/<machine>/first-start.json
    python -m scripts.bench ready --from-clone --starts 1 --out bench-results/<machine>/from-clone.json
    python -m scripts.bench ready --starts 2 --server-env ONEDNN_MAX_CPU_ISA=AVX512_CORE_VNNI
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from scripts.bench.common import (
    PARAGRAPHS,
    ROOT,
    Report,
    add_engine,
    add_server_env,
    add_weights,
    checked_server_env,
    positive_int,
)
from scripts.bench.measure import measure_library
from scripts.harness import free_port, is_ready, launch, process_env, stop_server, wait_ready

TIMEOUT_S = 600.0
CLONE_TIMEOUT_S = 3600.0
POLL_S = 0.1
LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \w+ (\S+): (.*)$")
# The log line each phase ends with (the logger's name, a pattern of its message), in order.
PHASES = (
    ("python", "__main__", re.compile(r"^allocator: ")),
    ("app", "api.server.app", re.compile(r"^engine: ")),
    ("load", "api.engine.torch_engine", re.compile(r"^KModel loaded ")),
    ("warmup", "api.engine.torch_engine", re.compile(r"^compiled kernels: ")),
    ("engine_ready", "api.engine.scheduling.scheduler", re.compile(r"^engine \w+ ready ")),
    ("full_speed", "api.engine.compiled", re.compile(r"^compiled kernels: all \d+ in use")),
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


def one_start(env: Mapping[str, str], log_path: Path, speech: Speech | None = None) -> dict[str, Any]:
    started = time.time()
    server = launch(env, log_path)
    requests: list[dict[str, Any]] = []
    try:
        wait_ready(server, TIMEOUT_S, poll_s=POLL_S, compiled=False)
        ready_s = time.time() - started
        if speech is not None:
            requests = speech.run(server.url, started)
    finally:
        stop_server(server)
    log = server.log()
    graphs = GRAPHS.search(log)
    result: dict[str, Any] = {
        "ready_s": round(ready_s, 2),
        "phases_s": phase_times(log, started),
        "graphs_loaded": None if graphs is None else int(graphs.group(1)),
        "graphs_built": None if graphs is None else int(graphs.group(2)),
        "engine_line": next((line for line in log.splitlines() if "api.server.app: engine:" in line), None),
        "log_lines": "\n".join(
            line for line in log.splitlines() if "api.server.app: " in line or "compiled kernels" in line
        ),
    }
    if speech is not None:
        result["speech"] = {"summary": speech_summary(requests), "requests": requests}
    return result


class Speech:
    """One client, the texts in turn, from `/ready`'s 200 until the kernels are compiled and `after` more
    requests are done (at least `least` in all; at most `limit_s` seconds)."""

    def __init__(self, texts: list[str], after: int, least: int, limit_s: float) -> None:
        self.texts, self.after, self.least, self.limit_s = texts, after, least, limit_s

    def run(self, url: str, started: float) -> list[dict[str, Any]]:
        records: list[dict[str, Any]] = []
        compiled_requests = 0
        with httpx.Client(base_url=url, timeout=TIMEOUT_S) as client:
            while compiled_requests < self.after or len(records) < self.least:
                before = kernels_state(client)
                begun = time.time()
                text = self.texts[len(records) % len(self.texts)]
                body = {"input": text, "voice": "af_heart", "response_format": "pcm", "stream": False}
                response = client.post("/v1/audio/speech", json=body)
                response.raise_for_status()
                wall = time.time() - begun
                after = kernels_state(client)
                records.append({
                    "at_s": round(begun - started, 2), "wall_s": round(wall, 3),
                    "audio_s": round(len(response.content) / 2 / 24_000, 3), "chars": len(text),
                    "text": len(records) % len(self.texts),
                    "kernels_before": before, "kernels_after": after,
                })  # fmt: skip
                compiled_requests += before in (None, "compiled", "eager")
                if time.time() - started > self.limit_s:
                    break
        return records


def kernels_state(client: httpx.Client) -> str | None:
    kernels = client.get("/ready").json().get("kernels")
    return None if kernels is None else str(kernels["state"])


PRECISION_LOG = re.compile(r"api\.app: torch precision: (\w+)")


def same_texts(
    starts: list[dict[str, Any]], eager: dict[str, Any], library: dict[str, Any]
) -> list[dict[str, Any]]:
    """For each start, its requests' audio-s/s while compiling and once compiled, each over the same texts
    said by the eager start and by the library (each text's time there, as often as the start said it):
    the background compile's cost is the eager figure over the one while compiling."""
    eager_wall = {record["text"]: record["wall_s"] for record in eager["speech"]["requests"]}
    library_rate = {
        index % len(PARAGRAPHS): text["audio_s"] / text["wall_s"]
        for index, text in enumerate(library.get("texts", []))
    }
    rows = []
    for number, start in enumerate(starts, 1):
        row: dict[str, Any] = {"start": number}
        for phase, chosen in _phases(start["speech"]["requests"]).items():
            if not chosen:
                continue
            audio = sum(record["audio_s"] for record in chosen)
            wall = sum(record["wall_s"] for record in chosen)
            eager_s = sum(eager_wall[record["text"]] for record in chosen)
            library_s = sum(record["audio_s"] / library_rate[record["text"]] for record in chosen)
            row[phase] = {
                "requests": len(chosen),
                "audio_s_per_s": round(audio / wall, 3),
                "x_eager": round(eager_s / wall, 3),
                "x_library": round(library_s / wall, 3),
            }
        rows.append(row)
    return rows


def _phases(requests: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    return {
        "while_compiling": [record for record in requests if record["kernels_before"] == "compiling"],
        "compiled": [record for record in requests if record["kernels_before"] != "compiling"],
    }


def speech_summary(requests: list[dict[str, Any]]) -> dict[str, Any]:
    """Audio seconds per second of the requests that began while the kernels compiled, and of those that
    began once they were compiled (or with none to compile)."""

    def rate(chosen: list[dict[str, Any]]) -> dict[str, Any]:
        wall = sum(record["wall_s"] for record in chosen)
        audio = sum(record["audio_s"] for record in chosen)
        return {"requests": len(chosen), "audio_s": round(audio, 2), "wall_s": round(wall, 2),
                "audio_s_per_s": round(audio / wall, 3) if wall else None}  # fmt: skip

    return {phase: rate(chosen) for phase, chosen in _phases(requests).items()}


# What a newcomer's `bash scripts/serve.sh` prints at each milestone (scripts/setup.sh, api/weights).
CLONE_MILESTONES = (
    ("setup_s", re.compile(r"^setup: done")),
    ("weights_s", re.compile(r"Fetched Kokoro-82M|registry weights complete|fetched hexgrad")),
)


def from_clone(server_args: list[str]) -> dict[str, Any]:
    """The README's serve command on a clone of HEAD with an empty HOME (no pip or uv cache, no weights, no
    compile cache): seconds from the command to each milestone of its output, `/ready` 200, the first byte
    of streamed speech and full speed (the kernels compiled in the background)."""
    work = Path(tempfile.mkdtemp(prefix="kokoro-clone-"))
    repo, home = work / "repo", work / "home"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(repo)], check=True)
    home.mkdir()
    env = {key: value for key, value in os.environ.items() if not key.startswith("KOKORO_")}
    env.update(HOME=str(home), HF_HUB_OFFLINE="1")
    port = free_port()
    command = ["bash", "scripts/serve.sh", "--host", "127.0.0.1", "--port", str(port), *server_args]
    started = time.time()
    process = subprocess.Popen(
        command, cwd=repo, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )
    lines: list[tuple[float, str]] = []
    reader = threading.Thread(target=_read_lines, args=(process, started, lines), daemon=True)
    reader.start()
    url = f"http://127.0.0.1:{port}"
    result: dict[str, Any] = {"command": " ".join(command), "home": "empty"}
    try:
        result["ready_s"] = _until(lambda: is_ready(url), process, started)
        body = {"input": PARAGRAPHS[0], "voice": "af_heart", "response_format": "pcm"}
        with httpx.stream("POST", f"{url}/v1/audio/speech", json=body, timeout=TIMEOUT_S) as response:
            next(response.iter_bytes())
            result["first_audio_s"] = round(time.time() - started, 2)
            result["audio_bytes"] = sum(len(part) for part in response.iter_bytes())
        result["full_speed_s"] = _until(lambda: is_ready(url, compiled=True), process, started)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        process.wait(60)
        reader.join(10)
        shutil.rmtree(work, ignore_errors=True)
    for name, pattern in CLONE_MILESTONES:
        result[name] = next((round(at, 2) for at, line in lines if pattern.search(line)), None)
    result["setup_lines"] = [line for _, line in lines if line.startswith("setup:")]
    return result


def _read_lines(process: subprocess.Popen[bytes], started: float, lines: list[tuple[float, str]]) -> None:
    assert process.stdout is not None
    for raw in process.stdout:
        lines.append((time.time() - started, raw.decode(errors="replace").rstrip()))


def _until(done: Callable[[], bool], process: subprocess.Popen[bytes], started: float) -> float:
    while not done():
        if process.poll() is not None:
            raise RuntimeError(f"serve.sh exited with {process.returncode}")
        if time.time() - started > CLONE_TIMEOUT_S:
            raise TimeoutError("serve.sh not there in time")
        time.sleep(POLL_S)
    return round(time.time() - started, 2)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_weights(parser)
    parser.add_argument("--starts", type=positive_int, default=3, help="starts in a row (default 3)")
    parser.add_argument("--cache-dir", type=Path, help="the compile-cache directory (default: a new one)")
    add_engine(parser)
    add_server_env(parser)
    speech = "one client's speech during and after compiling"
    parser.add_argument("--speech", action="store_true", help=speech)
    parser.add_argument(
        "--after", type=positive_int, default=8, help="with --speech: requests once compiled (default 8)"
    )
    parser.add_argument(
        "--speech-limit", type=float, default=900.0, help="with --speech: seconds per start at most"
    )
    parser.add_argument(
        "--skip-reference", action="store_true", help="with --speech: no eager start and no library run"
    )
    parser.add_argument("--library-threads", type=positive_int, default=2, help=argparse.SUPPRESS)
    parser.add_argument("--library-timeout", type=float, default=1800.0, help=argparse.SUPPRESS)
    clone = "first the README's serve command on a clone with an empty HOME"
    parser.add_argument("--from-clone", action="store_true", help=clone)


def prepare(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    args.settings = checked_server_env(parser, args)


def run(args: argparse.Namespace) -> int:
    texts = list(PARAGRAPHS)
    cache_dir = args.cache_dir or Path(tempfile.mkdtemp(prefix="kokoro-ready-cache-"))
    engine = {} if args.engine is None else {"KOKORO_ENGINE": args.engine}
    env = process_env(args.weights, **{**engine, **args.settings, "KOKORO_COMPILE_CACHE_DIR": str(cache_dir)})
    cache_was_empty = not any(cache_dir.iterdir()) if cache_dir.exists() else True
    speech = Speech(texts, args.after, args.after, args.speech_limit) if args.speech else None
    starts = []
    report = Report(args, leave_out={"settings"})
    results: dict[str, Any] = {}
    if args.from_clone:
        results["from_clone"] = from_clone([])
        print(f"from a clone: {results['from_clone']}", flush=True)
    with tempfile.TemporaryDirectory(prefix="kokoro-ready-") as logs:
        for index in range(args.starts):
            result = one_start(env, Path(logs) / f"start-{index}.log", speech)
            print(
                f"start {index + 1}: ready in {result['ready_s']:.1f} s, phases {result['phases_s']}",
                flush=True,
            )
            if "speech" in result:
                print(f"  speech: {result['speech']['summary']}", flush=True)
            starts.append(result)
        if speech is not None and not args.skip_reference:
            results.update(references(args, env, texts, starts, Path(logs)))
    results.update(cache_dir_was_empty=cache_was_empty, starts=starts)
    report.write(results)
    return 0


def references(
    args: argparse.Namespace,
    env: Mapping[str, str],
    texts: list[str],
    starts: list[dict[str, Any]],
    logs: Path,
) -> dict[str, Any]:
    """The same engine and precision as the first start, its kernels eager, every text once; the library on
    the same texts; and the starts' figures over theirs."""
    precision = PRECISION_LOG.search(starts[0]["log_lines"])
    eager_env = {**env, "KOKORO_TORCH_COMPILE": "false", "KOKORO_ENGINE": "torch"}
    if precision is not None:
        eager_env["KOKORO_TORCH_PRECISION"] = precision.group(1)
    every_text = Speech(texts, len(texts), len(texts), args.speech_limit)
    eager = one_start(eager_env, logs / "eager.log", every_text)
    print(f"eager start: {eager['speech']['summary']}", flush=True)
    library = measure_library(args.weights, args.library_threads, texts, args.library_timeout)
    print(f"library: {library.get('audio_s_per_s')} audio-s/s", flush=True)
    compared = same_texts(starts, eager, library)
    print(f"over the same texts: {compared}", flush=True)
    return {"eager_start": eager, "library": library, "same_texts": compared}
