"""Real server processes for the benchmarks and the tests: the environment, a free port, a start, a wait for
`/ready`, a stop.

`process_env` is the one place a server's environment (or a measuring process's) is built. `/ready` answers
200 once the server's engine is ready, and with several workers once every worker's is
(api/server/workers.py); a wait also waits for the kernels that compile in the background on a first start,
unless told not to. A server that exits while it is awaited, or is not ready in time, raises with its log.
A stop is SIGTERM, then SIGKILL for a server still there after `STOP_TIMEOUT_S`.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import httpx

if TYPE_CHECKING:
    from api.engine.base import Engine

ROOT = Path(__file__).resolve().parents[1]
READY_TIMEOUT_S = 300
# A benchmark's server may compile for longer before its first `/ready` 200.
BENCH_READY_TIMEOUT_S = 600
# Should the engines' ready line change, a server whose `/ready` has answered 200 this long counts as ready.
ENGINE_LOG_GRACE_S = 120
STOP_TIMEOUT_S = 30
NGINX_FALLBACK = Path("/usr/sbin/nginx")
# What an error shows of a log: a start-up log fits, a long run's tail is what matters.
LOG_TAIL_CHARS = 20_000
# Each worker logs this once its engine has loaded and warmed up (api/engine/scheduling/scheduler.py).
ENGINE_READY_LOG = re.compile(r"engine \w+ ready")
# The access log's line for a `/ready` poll (api/server/logs.py).
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


THREAD_SETTINGS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "KOKORO_TORCH_THREADS", "KOKORO_ONNX_THREADS")
# What a test's server runs with unless the test says otherwise.
TEST_SETTINGS = {"KOKORO_TORCH_THREADS": "2"}


def process_env(
    weights: Path | None = None,
    *,
    threads: int | None = None,
    base: Mapping[str, str] | None = None,
    **settings: str,
) -> dict[str, str]:
    """The environment of a server (or a measuring process) that the benchmarks and tests start: `base`
    (default: this process's), offline (no hub, no weights fetched), over `weights`, with `threads` threads
    for OpenMP, MKL and either engine where given, then `settings` (KOKORO_* and the like) over all that."""
    env = {**(os.environ if base is None else base), "HF_HUB_OFFLINE": "1", "KOKORO_FETCH_WEIGHTS": "false"}
    if weights is not None:
        env["KOKORO_WEIGHTS_DIR"] = str(weights)
    if threads is not None:
        env.update(dict.fromkeys(THREAD_SETTINGS, str(threads)))
    return {**env, **settings}


def launch(
    env: Mapping[str, str],
    log_path: Path,
    module: str = "api",
    workers: int = 1,
    options: Sequence[str] = (),
    cpus: Sequence[int] | None = None,
    prefix: Sequence[str] = (),
) -> Server:
    """`python -m api` (or `module`) with `workers` workers on a free port in `env`, on `cpus` where given
    (`prefix`, e.g. taskset, runs it); not waited for."""
    port = free_port()
    command = [*prefix, *server_command(port, module, workers, options)]
    return spawn(command, log_path, port, env, pinned_to(cpus))


def pinned_to(cpus: Sequence[int] | None) -> Callable[[], None] | None:
    """A preexec_fn that pins the child (and so its threads and children) to `cpus`."""
    if cpus is None:
        return None
    chosen = set(cpus)
    return lambda: os.sched_setaffinity(0, chosen)


def wait_engines_ready(server: Server, workers: int = 1, watched: Sequence[Server] = ()) -> None:
    """Until `/ready` answers 200 and each of `workers` engines (in `server` and `watched`) has logged that
    it is ready: for the benchmarks that measure from the first request on."""
    settled = engines_logged_ready([server, *watched], workers, ENGINE_LOG_GRACE_S) if workers else None
    wait_ready(server, BENCH_READY_TIMEOUT_S, watched, settled)


@contextmanager
def running(
    env: Mapping[str, str], log_path: Path, workers: int = 1, module: str = "api"
) -> Iterator[Server]:
    """A benchmark's server (`launch`), once every engine is ready; stopped when the block ends."""
    server = launch(env, log_path, module, workers)
    try:
        wait_engines_ready(server, workers)
        yield server
    finally:
        stop_server(server)


@dataclass(frozen=True)
class ServerPlan:
    """How a benchmark starts the servers of its layouts (`deployed`): everything but the layout itself."""

    env: dict[str, str]
    cpus: list[int] | None
    log_dir: Path
    limit_concurrency: int | None = None
    nginx: str | None = None  # the nginx binary, or None for uvicorn workers


@dataclass
class Deployment:
    """The servers of one layout, up and ready: the URL to load, the processes, the pids of the replicas."""

    url: str
    processes: list[Server] = field(default_factory=list)
    mode: str = "workers"

    def replica_pids(self) -> list[int]:
        if self.mode == "nginx":
            return [process.process.pid for process in self.processes[:-1]]  # the last one is nginx
        pid = self.processes[0].process.pid
        return worker_pids(pid) or [pid]  # one worker: uvicorn serves in the main process


@contextmanager
def deployed(plan: ServerPlan, replicas: int, threads: int) -> Iterator[Deployment]:
    """`replicas` replicas of `threads` threads each, ready: uvicorn workers of one server, or with
    `plan.nginx` single-worker servers behind the repository's nginx config (docker/render_nginx.py)."""
    deployment = Deployment(url="", mode="workers" if plan.nginx is None else "nginx")
    env = process_env(threads=threads, base=plan.env)
    name = f"{threads}x{replicas}"
    options = [] if plan.limit_concurrency is None else ["--limit-concurrency", str(plan.limit_concurrency)]
    try:
        if plan.nginx is None:
            server = launch(env, plan.log_dir / f"server-{name}.log", workers=replicas, options=options,
                            cpus=plan.cpus)  # fmt: skip
            deployment.processes.append(server)
            deployment.url = server.url
            wait_engines_ready(server, replicas)
        else:
            for replica in range(replicas):
                log = plan.log_dir / f"server-{name}-replica{replica}.log"
                deployment.processes.append(launch(env, log, options=options, cpus=plan.cpus))
            behind_nginx(plan, name, deployment, plan.nginx)
        yield deployment
    finally:
        for process in reversed(deployment.processes):
            stop_server(process)


def behind_nginx(plan: ServerPlan, name: str, deployment: Deployment, nginx: str) -> None:
    """nginx in front of the deployment's replicas, once they are ready; ready itself."""
    replicas = list(deployment.processes)
    for replica in replicas:
        wait_engines_ready(replica, 0)
    port = free_port()
    render = load_render_nginx()
    upstreams = [replica.url.removeprefix("http://") for replica in replicas]
    conf = render.write_config(plan.log_dir / f"nginx-{name}", upstreams, f"127.0.0.1:{port}")
    command = [nginx, *render.nginx_command(conf)[1:]]
    balancer = spawn(command, plan.log_dir / f"nginx-{name}.log", port, os.environ, pinned_to(plan.cpus))
    deployment.processes.append(balancer)
    deployment.url = balancer.url
    wait_engines_ready(balancer, 0, watched=replicas)


def load_render_nginx() -> ModuleType:
    spec = importlib.util.spec_from_file_location("render_nginx", ROOT / "docker" / "render_nginx.py")
    if spec is None or spec.loader is None:
        raise ImportError("docker/render_nginx.py not found")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def find_nginx() -> str | None:
    found = shutil.which("nginx")
    if found is None and NGINX_FALLBACK.exists():
        found = str(NGINX_FALLBACK)
    return found


def child_pids(pid: int) -> list[int]:
    try:
        return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def worker_pids(server_pid: int) -> list[int]:
    """uvicorn's worker processes (multiprocessing also starts a resource tracker, which is not one)."""
    return [pid for pid in child_pids(server_pid) if b"spawn_main" in _cmdline(pid)]


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def launch_server(
    weights: Path, log_path: Path, module: str = "api", workers: str = "1", **env: str
) -> Server:
    """`start_server` without waiting for it."""
    return launch(process_env(weights, **{**TEST_SETTINGS, **env}), log_path, module, int(workers))


def start_server(
    weights: Path, log_path: Path, module: str = "api", workers: str = "1", **env: str
) -> Server:
    """A test's server: `python -m api` (or a module taking its role, e.g. tests.tone_server) over `weights`
    on a free port, once ready; `env` adds or overrides settings."""
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
    from api.engine.scheduling.scheduler import Scheduler
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
