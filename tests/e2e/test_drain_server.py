"""`python -m api.server.drain` (the pod's preStop hook) against a real server process over the tone engine:
an open live session keeps the pod busy, and a hung server is given up on within seconds, not the drain's
whole timeout (deploy/k8s/: the kubelet runs the hook when the liveness probe kills a container too)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from websockets.asyncio.client import connect

from api.server.drain import POLL_S, READ_TIMEOUT_S, UNANSWERED_S
from scripts.bench.live import ws_url
from scripts.harness import ROOT, Server, running_server
from tests.e2e.test_workers import children

# The drain's timeout in the manifests: the hung server must be given up on long before it.
MANIFEST_TIMEOUT_S = 360


@pytest.fixture
def tone_server(random_weights: Path, tmp_path: Path) -> Iterator[Server]:
    with running_server(random_weights, tmp_path / "server.log", module="tests.tone_server") as server:
        yield server


def drain(server: Server, timeout_s: float) -> tuple[int, str, float]:
    """Runs the hook as the pod does; its exit status, its log and how long it took."""
    started = time.monotonic()
    finished = subprocess.run(
        [sys.executable, "-m", "api.server.drain", "--url", server.url, "--timeout", str(timeout_s)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout_s + 60,
        check=False,
    )
    return finished.returncode, finished.stderr, time.monotonic() - started


def test_an_open_live_session_holds_the_drain_until_it_closes(tone_server: Server) -> None:
    async def scenario() -> tuple[int, str]:
        async with connect(ws_url(tone_server.url)) as ws:
            # Open, and silent between utterances: no admission slot is held, the session still counts.
            held = await asyncio.to_thread(drain, tone_server, 8)
            assert ws.state.name == "OPEN"
        status, log, _ = await asyncio.to_thread(drain, tone_server, 60)
        assert status == 0, log
        return held[0], held[1]

    status, log = asyncio.run(scenario())
    assert status == 1, log
    assert "still busy" in log


def test_a_hung_server_is_given_up_on_within_seconds(tone_server: Server) -> None:
    processes = [tone_server.process.pid, *children(tone_server.process.pid)]
    for pid in processes:
        os.kill(pid, signal.SIGSTOP)  # the sockets stay open, nothing answers: a hung event loop
    try:
        status, log, took = drain(tone_server, MANIFEST_TIMEOUT_S)
    finally:
        for pid in processes:
            os.kill(pid, signal.SIGCONT)
    print(f"the drain gave up on the hung server after {took:.1f} s")
    assert status == 1, log
    assert "not answering" in log
    assert UNANSWERED_S <= took <= UNANSWERED_S + READ_TIMEOUT_S + POLL_S + 5, log
