"""A real server process (`python -m api`) over the real kokoro model code with random weights."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from scripts.harness import Server, running_server, start_server, stop_server
from scripts.hearing import load_whisper


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
    with running_server(random_weights, folder / "server.log", KOKORO_LEXICON_FILE=str(lexicon)) as running:
        yield running


@pytest.fixture(scope="session")
def whisper() -> Any:
    """whisper tiny.en (scripts/hearing.py), loaded once for every module that listens."""
    return load_whisper()
