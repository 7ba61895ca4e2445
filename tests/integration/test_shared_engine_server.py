"""`KOKORO_SHARED_ENGINE=true` through the real launcher (`python -m api --workers 2`): one engine process,
one model load, behind two uvicorn workers (the torch engine on the CPU, random weights); every request is
answered, with the audio a one-worker server gives; when the engine process dies, the server stops."""

from __future__ import annotations

import os
import re
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np

from scripts.harness import Server, running_server

TEXTS = (
    "One engine serves every worker.",
    "The second worker's request, a little longer than the first one.",
    "Short.",
)
# Eager kernels: the sharing is the question here, and each of the two starts would build the compiled ones
# (a minute and more on a CPU whose compile cache lacks them) or load them from the cache.
ENV = {"KOKORO_ENGINE": "torch", "KOKORO_TORCH_PRECISION": "fp32", "KOKORO_TORCH_COMPILE": "false"}


def say(server: Server, text: str) -> np.ndarray:
    """The speech, asked for as a client would: /ready answers from whichever worker is ready first, and a
    worker still warming up its G2P answers 503 (model_loading) with Retry-After, so that is retried."""
    body = {"model": "tts-1", "voice": "af_heart", "input": text, "response_format": "pcm"}
    deadline = time.monotonic() + 120
    while True:
        response = httpx.post(f"{server.url}/v1/audio/speech", json=body, timeout=300)
        if response.status_code != 503 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert response.status_code == 200, response.text
    return np.frombuffer(response.content, dtype=np.int16)


def children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(child) for child in (task / "children").read_text().split()]
    return found


def test_two_workers_share_one_engine_and_speak_as_one_worker(random_weights: Path, tmp_path: Path) -> None:
    """Then the engine process is killed: every request would fail without it, so the launcher exits with
    an error status, and whatever supervises it (Docker, Modal, systemd) starts a new server."""
    with running_server(
        random_weights, tmp_path / "shared.log", workers="2", KOKORO_SHARED_ENGINE="true", **ENV
    ) as shared:
        with ThreadPoolExecutor(6) as pool:
            shared_audio = list(pool.map(lambda text: say(shared, text), TEXTS * 2))
        (engine,) = [
            pid
            for pid in children(shared.process.pid)
            if b"api.server.engine_process" in Path(f"/proc/{pid}/cmdline").read_bytes()
        ]
        os.kill(engine, signal.SIGKILL)
        status = shared.process.wait(60)
    log = shared.log()
    assert status != 0
    assert "the shared engine process exited with status -9" in log
    assert log.count("KModel loaded") == 1, log
    assert log.count("engine: the shared torch engine process") == 2, log
    socket = re.search(r"shared engine: torch ready at (\S+)", log)
    assert socket is not None, log
    assert not Path(socket.group(1)).exists()  # the engine process's directory went with the server

    with running_server(random_weights, tmp_path / "single.log", **ENV) as single:
        single_audio = [say(single, text) for text in TEXTS]
    for index, audio in enumerate(shared_audio):
        expected = single_audio[index % len(TEXTS)]
        assert len(audio) == len(expected), TEXTS[index % len(TEXTS)]
        assert np.abs(audio.astype(np.int32) - expected).max() <= 2, TEXTS[index % len(TEXTS)]
