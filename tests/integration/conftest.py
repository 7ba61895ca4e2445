"""A real server process (`python -m api`) over the real kokoro model code with random weights."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
READY_TIMEOUT_S = 300


@dataclass
class Server:
    url: str
    log_path: Path
    process: subprocess.Popen[bytes]

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_server(
    weights: Path, log_path: Path, module: str = "api", workers: str = "1", **env: str
) -> Server:
    """`python -m api` (or another module taking the same role, e.g. tests.tone_server) on a free port, once
    `/ready` says 200: with several workers, once every worker is ready (api/workers.py)."""
    server = launch_server(weights, log_path, module, workers, **env)
    wait_ready(server)
    return server


def launch_server(
    weights: Path, log_path: Path, module: str = "api", workers: str = "1", **env: str
) -> Server:
    """`start_server` without waiting for it."""
    port = free_port()
    environment = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "KOKORO_WEIGHTS_DIR": str(weights),
        "KOKORO_FETCH_WEIGHTS": "false",
        "KOKORO_TORCH_THREADS": "2",
        **env,
    }
    command = [sys.executable, "-m", module, "--host", "127.0.0.1", "--port", str(port), "--workers", workers]
    log = log_path.open("wb")
    process = subprocess.Popen(command, cwd=ROOT, env=environment, stdout=log, stderr=subprocess.STDOUT)
    return Server(f"http://127.0.0.1:{port}", log_path, process)


def wait_ready(server: Server) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"server exited with {server.process.returncode}:\n{server.log()}")
        try:
            if httpx.get(f"{server.url}/ready", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.25)
    raise TimeoutError(f"server not ready after {READY_TIMEOUT_S} s:\n{server.log()}")


def stop_server(server: Server) -> None:
    server.process.terminate()
    try:
        server.process.wait(30)
    except subprocess.TimeoutExpired:
        server.process.kill()
        server.process.wait()


class RegistryServers:
    """Real servers over the registry weights with the default settings but the engine, one per engine,
    started on first use and shared by every module that needs no other setting (a start costs 10-20 s)."""

    def __init__(self, weights: Path, folder: Path) -> None:
        self._weights = weights
        self._folder = folder
        self._running: dict[str, Server] = {}

    def __call__(self, engine: str) -> Server:
        server = self._running.get(engine)
        if server is None:
            log = self._folder / f"{engine}.log"
            server = self._running[engine] = start_server(self._weights, log, KOKORO_ENGINE=engine)
        if server.process.poll() is not None:
            raise RuntimeError(f"the shared {engine} server exited:\n{server.log()}")
        return server

    def close(self) -> None:
        for server in self._running.values():
            stop_server(server)


@pytest.fixture(scope="session")
def registry_servers(
    registry_weights: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RegistryServers]:
    servers = RegistryServers(registry_weights, tmp_path_factory.mktemp("registry-servers"))
    yield servers
    servers.close()


# The shared server's lexicon (tests/integration/test_markup_server.py checks it): words no other test says.
LEXICON = {"tomato": "təmˈɑːtO", "Kokoro": "kˈOkəɹO"}


@pytest.fixture(scope="session")
def server(random_weights: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The default settings over the random weights, but for a lexicon file: one start for every module
    that asks nothing else of its server (a start took 21-23 s on the AMX Xeon with the compiled kernels
    in the compile cache, 61 s without)."""
    folder = tmp_path_factory.mktemp("server")
    lexicon = folder / "lexicon.json"
    lexicon.write_text(json.dumps(LEXICON))
    running = start_server(random_weights, folder / "server.log", KOKORO_LEXICON_FILE=str(lexicon))
    yield running
    stop_server(running)
