"""The Kokoro server on Modal: one H100 per container, Dockerfile.gpu's image, weights baked in.

    modal deploy modal_app.py     # a persistent endpoint: https://<workspace>--kokoro-tts-serve.modal.run
    modal serve modal_app.py      # a temporary one that follows local edits

Each container runs `python -m api --workers WORKERS --limit-concurrency LIMIT_CONCURRENCY` (the
same command as the Docker images) behind Modal's web proxy. Modal routes at most MAX_INPUTS
requests at a time to a container and adds containers, up to MAX_CONTAINERS, when they average more
than TARGET_INPUTS. Importing this module needs no network and no Modal token.
"""

from __future__ import annotations

import os
import subprocess
import time
import urllib.request
from pathlib import Path

import modal

APP_NAME = "kokoro-tts"
GPU = "H100"
PORT = 8880

# Worker processes per container, each with its own model on the GPU (82M parameters: a few hundred
# MiB each) and its own G2P thread and encoders on the CPU. Set from scripts/bench_frontend.py (the CPU
# side with the GPU simulated; docs/performance.md, section 8): misaki's G2P is not thread-safe, so a
# worker phonemizes on one core, about 820-1000 audio-seconds per second; one worker's whole server path
# delivered 420-630 audio-s/s of pcm on 2 cores. Eight workers leave room over the 2,500 audio-s/s target.
WORKERS = 8
# The CPU cost per audio second of the server path (HTTP, G2P, scheduler, encoding) measured per format:
# pcm/wav 0.002 core-seconds (5 cores at 2,500 audio-s/s), aac 0.008 (20), mp3 0.026-0.032 (65-79).
# 16 cores feed the target in pcm, wav and flac, and about 500-600 audio-s/s of mp3: a container that
# serves mainly mp3 (OpenAI's default format) is CPU-bound long before the GPU is; raise CPU for it.
CPU = 16.0
MEMORY_MIB = 24 * 1024  # host memory per container: about 1-2.5 GB per torch worker, room for long texts

# Requests one worker synthesizes at a time (KOKORO_MAX_INFLIGHT). Each has one or two chunks queued, and
# the worker's scheduler runs the queued chunks of all of them in one batched forward pass (up to 32 per
# batch on a GPU: KOKORO_MAX_BATCH_SIZE), so more streams per worker mean fuller batches. Not measured on
# an H100 yet (docs/batching.md). Modal sends a container at most what its workers synthesize at once.
INPUTS_PER_WORKER = 32
MAX_INPUTS = WORKERS * INPUTS_PER_WORKER
# Modal adds containers once they average this many requests, before any is full.
TARGET_INPUTS = MAX_INPUTS // 2
# Workers accept connections from one shared socket, so requests do not split evenly between them:
# a worker's waiting line (KOKORO_MAX_WAITING) absorbs its excess instead of answering 503.
MAX_WAITING = INPUTS_PER_WORKER
# uvicorn's hard cap on connections per worker, above admission control's (in synthesis + waiting)
# so that a full worker answers admission's 503 with Retry-After; the rest is for probes and listings.
LIMIT_CONCURRENCY = INPUTS_PER_WORKER + MAX_WAITING + 4

MIN_CONTAINERS = 0  # 1 keeps a GPU warm (no cold start, billed around the clock)
MAX_CONTAINERS = 4  # the bill's ceiling: at most this many H100s at once
SCALEDOWN_WINDOW_S = 300  # an idle container stays this long, so a pause between bursts costs no cold start
TIMEOUT_S = 900  # longest request, streaming included: a 100,000-character input takes minutes
STARTUP_TIMEOUT_S = 600  # a cold container: image pull, model load and warm-up in every worker

# The hub's fp32 checkpoint, which the torch engine runs as published; "registry" converts it from
# the int8 model instead (docs/weights.md) and needs no hub.
WEIGHTS_SOURCE = "hub"

ROOT = Path(__file__).resolve().parent
DOCKERFILE = ROOT / "Dockerfile.gpu"
READY_URL = f"http://127.0.0.1:{PORT}/ready"

image = (
    modal.Image.from_dockerfile(DOCKERFILE, context_dir=ROOT, build_args={"WEIGHTS_SOURCE": WEIGHTS_SOURCE})
    # Modal runs its own runtime in the container, which mounts this module under /root (hence root,
    # inside Modal's sandbox); serve() starts the server itself, so the image's entrypoint goes.
    .dockerfile_commands("USER root", "ENTRYPOINT []")
)

app = modal.App(APP_NAME, image=image)


def server_command() -> list[str]:
    return [
        "python",
        "-m",
        "api",
        "--host",
        "0.0.0.0",
        "--port",
        str(PORT),
        "--workers",
        str(WORKERS),
        "--limit-concurrency",
        str(LIMIT_CONCURRENCY),
    ]


def server_env() -> dict[str, str]:
    """The image's environment plus the per-worker admission limits that match MAX_INPUTS."""
    return {
        **os.environ,
        "KOKORO_MAX_INFLIGHT": str(INPUTS_PER_WORKER),
        "KOKORO_MAX_WAITING": str(MAX_WAITING),
    }


def wait_until_ready(
    process: subprocess.Popen[bytes], url: str, *, timeout_s: float, in_a_row: int, poll_s: float = 1.0
) -> None:
    """Return once `url` has answered 200 `in_a_row` times in a row; raise if the process exits or
    the time runs out. Each worker loads its own model and each request reaches whichever worker
    accepts it, so several answers in a row make it likely that every worker is ready."""
    deadline = time.monotonic() + timeout_s
    successes = 0
    while successes < in_a_row:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with status {process.returncode} before it was ready")
        if time.monotonic() > deadline:
            raise TimeoutError(f"the server was not ready after {timeout_s:.0f} s")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                successes = successes + 1 if response.status == 200 else 0
        except OSError:  # not listening yet, or 503 while loading
            successes = 0
            time.sleep(poll_s)


@app.function(
    gpu=GPU,
    cpu=CPU,
    memory=MEMORY_MIB,
    min_containers=MIN_CONTAINERS,
    max_containers=MAX_CONTAINERS,
    scaledown_window=SCALEDOWN_WINDOW_S,
    timeout=TIMEOUT_S,
    startup_timeout=STARTUP_TIMEOUT_S,
)
@modal.concurrent(max_inputs=MAX_INPUTS, target_inputs=TARGET_INPUTS)
@modal.web_server(PORT, startup_timeout=STARTUP_TIMEOUT_S)
def serve() -> None:
    process = subprocess.Popen(server_command(), env=server_env())
    # Modal routes requests here once this returns; several ready answers in a row keep them from
    # workers still loading their model.
    wait_until_ready(process, READY_URL, timeout_s=STARTUP_TIMEOUT_S, in_a_row=2 * WORKERS)
