"""Real server processes for the tests and the scripts: a free port, a start, a wait for `/ready`, a stop.

`/ready` answers 200 once the server's engine is ready, and with several workers once every worker's is
(api/workers.py); a wait also waits for the kernels that compile in the background on a first start, unless
told not to. A server that exits while it is awaited, or is not ready in time, raises with its log.
A stop is SIGTERM, then SIGKILL for a server still there after `STOP_TIMEOUT_S`.

The scripts import it too, with the repository's root on sys.path.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

if TYPE_CHECKING:
    from api.engine.base import Engine

ROOT = Path(__file__).resolve().parents[1]
READY_TIMEOUT_S = 300
STOP_TIMEOUT_S = 30
# What an error shows of a log: a start-up log fits, a long run's tail is what matters.
LOG_TAIL_CHARS = 20_000
# Each worker logs this once its engine has loaded and warmed up (api/engine/scheduler.py).
ENGINE_READY_LOG = re.compile(r"engine \w+ ready")
# The access log's line for a `/ready` poll (api/logs.py).
READY_POLL_LOG = re.compile(r"api\.access: GET /ready ")


@dataclass
class Server:
    """A started process that serves HTTP (a server, or nginx in front of servers): its URL, its process
    and the file its output goes to."""

    url: str
    log_path: Path
    process: subprocess.Popen[bytes]

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def log_tail(self) -> str:
        """The log's last LOG_TAIL_CHARS without the access lines of `/ready` polls: a wait of minutes
        filled an error's whole tail with them and hid what the server said."""
        lines = self.log().splitlines(keepends=True)
        return "".join(line for line in lines if not READY_POLL_LOG.search(line))[-LOG_TAIL_CHARS:]

    def check_alive(self) -> None:
        """Raises with the log's tail if the process has exited."""
        if self.process.poll() is not None:
            tail = self.log_tail()
            raise RuntimeError(f"{self.log_path.name} exited with {self.process.returncode}:\n{tail}")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def server_command(
    port: int, module: str = "api", workers: int = 1, options: Sequence[str] = ()
) -> list[str]:
    """`python -m api` (or a module taking its role, e.g. tests.tone_server) on 127.0.0.1:`port`."""
    host = ["--host", "127.0.0.1", "--port", str(port), "--workers", str(workers)]
    return [sys.executable, "-m", module, *host, *options]


def spawn(
    command: Sequence[str],
    log_path: Path,
    port: int,
    env: Mapping[str, str] | None = None,
    preexec_fn: Callable[[], None] | None = None,
) -> Server:
    """`command` started in the repository's root, its output in `log_path`; not waited for."""
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            list(command),
            cwd=ROOT,
            env=None if env is None else dict(env),
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=preexec_fn,
        )
    return Server(f"http://127.0.0.1:{port}", log_path, process)


def is_ready(url: str, compiled: bool = False) -> bool:
    """`/ready` answers 200; with `compiled`, and the kernels compile no more in the background (the server
    is at full speed, and its numerics are those of the compiled kernels from the first request on)."""
    try:
        response = httpx.get(f"{url}/ready", timeout=2)
    except httpx.TransportError:
        return False
    if response.status_code != 200:
        return False
    kernels = response.json().get("kernels") if compiled else None
    return kernels is None or kernels.get("state") != "compiling"


def wait_ready(
    server: Server,
    timeout_s: float = READY_TIMEOUT_S,
    watched: Sequence[Server] = (),
    settled: Callable[[], bool] | None = None,
    poll_s: float = 0.25,
    compiled: bool = True,
) -> None:
    """Until `server`'s `/ready` has answered 200 (with `compiled`, once its kernels compile no more in the
    background) and then `settled()` (when given) says so, asking every `poll_s`; raises if `server` or a
    process in `watched` exits first, or after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    ready = False
    while time.monotonic() < deadline:
        for process in (server, *watched):
            process.check_alive()
        ready = ready or is_ready(server.url, compiled)
        if ready and (settled is None or settled()):
            return
        time.sleep(poll_s)
    raise TimeoutError(f"{server.url} not ready after {timeout_s} s:\n{server.log_tail()}")


def engines_logged_ready(servers: Sequence[Server], count: int, grace_s: float) -> Callable[[], bool]:
    """A `settled` for `wait_ready`: every one of `count` engines has logged that it is ready, or `grace_s`
    have passed since the first call (should that log line change, a ready server still counts as ready).
    A second check beside `/ready`, for the benchmarks that measure from the first request on."""
    first_call: float | None = None

    def settled() -> bool:
        nonlocal first_call
        first_call = time.monotonic() if first_call is None else first_call
        logged = sum(len(ENGINE_READY_LOG.findall(server.log())) for server in servers)
        if logged >= count:
            return True
        if time.monotonic() - first_call > grace_s:
            print(f"warning: {logged} of {count} workers logged readiness; going on", file=sys.stderr)
            return True
        return False

    return settled


def stop_server(server: Server) -> None:
    stop_process(server.process)


def stop_process(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
    try:
        process.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def started(server: Server, timeout_s: float = READY_TIMEOUT_S) -> Server:
    """`server` once ready; stopped when it does not get there."""
    try:
        wait_ready(server, timeout_s)
    except BaseException:
        stop_server(server)
        raise
    return server


@contextmanager
def serving(server: Server, timeout_s: float = READY_TIMEOUT_S) -> Iterator[Server]:
    """`server` once ready; stopped when the block ends, however it ends."""
    try:
        wait_ready(server, timeout_s)
        yield server
    finally:
        stop_server(server)


def server_env(weights: Path, **env: str) -> dict[str, str]:
    """The environment of a test's server: offline, over `weights`, two torch threads, then `env`."""
    return {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "KOKORO_WEIGHTS_DIR": str(weights),
        "KOKORO_FETCH_WEIGHTS": "false",
        "KOKORO_TORCH_THREADS": "2",
        **env,
    }


def launch_server(
    weights: Path, log_path: Path, module: str = "api", workers: str = "1", **env: str
) -> Server:
    """`start_server` without waiting for it."""
    port = free_port()
    return spawn(server_command(port, module, int(workers)), log_path, port, server_env(weights, **env))


def start_server(
    weights: Path, log_path: Path, module: str = "api", workers: str = "1", **env: str
) -> Server:
    """`python -m api` (or a module taking its role, e.g. tests.tone_server) over `weights` on a free port,
    once ready; `env` adds or overrides settings."""
    return started(launch_server(weights, log_path, module, workers, **env))


@contextmanager
def running_server(
    weights: Path, log_path: Path, module: str = "api", workers: str = "1", **env: str
) -> Iterator[Server]:
    """`start_server`, stopped when the block ends."""
    with serving(launch_server(weights, log_path, module, workers, **env)) as server:
        yield server


@contextlib.contextmanager
def engine_process(engine: Engine, path: Path) -> Iterator[None]:
    """The shared engine's process in this one: `serve` over `engine` (not yet loaded) on its own thread and
    event loop, on a real Unix socket at `path`."""
    from api.engine.scheduler import Scheduler
    from api.engine.shared import serve

    loop = asyncio.new_event_loop()
    runner = Scheduler(engine, max_queued=1000)
    task: asyncio.Task[None] | None = None

    def run() -> None:
        nonlocal task
        asyncio.set_event_loop(loop)
        task = loop.create_task(serve(runner, path))
        with contextlib.suppress(asyncio.CancelledError):
            loop.run_until_complete(task)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield
    finally:
        loop.call_soon_threadsafe(lambda: task.cancel() if task else None)
        thread.join(10)
