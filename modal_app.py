"""The Kokoro server on Modal: one H100 per container, Dockerfile.gpu's image, weights baked in.

    modal deploy modal_app.py     # a persistent endpoint: https://<workspace>--kokoro-tts-serve.modal.run
    modal serve modal_app.py      # a temporary one that follows local edits

Each container runs `python -m api --workers WORKERS --limit-concurrency LIMIT_CONCURRENCY` (the
same command as the Docker images) behind Modal's web proxy. Modal routes at most MAX_INPUTS
requests at a time to a container and adds containers, up to MAX_CONTAINERS, when they average more
than TARGET_INPUTS. Importing this module needs no network and no Modal token.

API keys come from the Modal Secret SECRET_NAME (its KOKORO_API_KEYS; docs/deploy.md has the command
that creates it), and /metrics needs a key too. Compiled kernels are kept on the Volume CACHE_VOLUME, so
only the first container on a GPU kind compiles them. A request whose response has not started within
150 s gets Modal's 303 redirect instead (docs/deploy.md): stream long texts.
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

# Worker processes per container, each with its own model on the GPU and its own G2P thread and encoders
# on the CPU. Measured on an H100 (docs/journal/gpu.md, entry 12; random weights, streamed pcm): one
# worker kept the GPU at most 61% busy (284 audio-s/s); four kept it 95% busy from 8 clients on and
# delivered 489 audio-s/s at 128 clients with the fused kernels; the GPU, not the CPU, is then the limit.
# More workers would not add speed, and each worker's CUDA caching allocator keeps its peak: four reached
# 58 GiB of the card's 80 (77 GiB before the fused kernels), so eight would run out of memory under load.
# One shared engine for 8 workers (KOKORO_SHARED_ENGINE; docs/journal/gpu.md, entry 27) delivered the same
# 557 audio-s/s at 128 clients in half the GPU memory but with a first-audio p95 of 4.1 s against 1.5 s: not
# the default here.
WORKERS = 4
# The CPU cost per audio second of the server path (HTTP, G2P, scheduler, encoding) measured per format
# (docs/journal/gpu.md, entry 8): pcm/wav 0.002 core-seconds, aac 0.008, mp3 0.026-0.032 through PyAV's
# libmp3lame; streamed mp3 now goes through lameenc at 96 kbit/s, -q 7, 3.4x less CPU than PyAV at the same
# settings (docs/api.md, "MP3 settings"). On the H100 (entry 27) mp3 capped the server near 300 audio-s/s
# before that change, with 16 cores; pcm left cores to spare.
CPU = 16.0
MEMORY_MIB = 24 * 1024  # host memory per container: about 1-2.5 GB per torch worker, room for long texts

# Requests one worker synthesizes at a time (KOKORO_MAX_INFLIGHT). Each has one or two chunks queued, and
# the worker's scheduler runs the queued chunks of all of them in one batched forward pass (up to 32 per
# batch on a GPU: KOKORO_MAX_BATCH_SIZE). On the H100, 4 workers x 32 = 128 streams was the knee: 256
# clients gave no more audio (472 against 489 audio-s/s) and a first-audio p95 of 10.6 s against 1.7 s.
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
# The longest input (KOKORO_MAX_INPUT_CHARS): OpenAI's own limit, about 275 s of audio, which a streamed
# request delivers well within TIMEOUT_S; the server's default of 100,000 characters would not fit it.
MAX_INPUT_CHARS = 4096
TIMEOUT_S = 900  # longest request, streaming included
STARTUP_TIMEOUT_S = 600  # a cold container: image pull, model load and warm-up in every worker

# The hub's fp32 checkpoint, which the torch engine runs as published; "registry" converts it from
# the int8 model instead (docs/weights.md) and needs no hub.
WEIGHTS_SOURCE = "hub"

# The Modal Secret that holds KOKORO_API_KEYS (comma-separated `KEY` or `LABEL:KEY`): the endpoint is
# public, so it answers only requests that carry one of them; /metrics too (KOKORO_METRICS_REQUIRE_KEY).
SECRET_NAME = "kokoro-api-keys"
SECRET_KEY = "KOKORO_API_KEYS"
# Inductor's caches on a Volume (KOKORO_COMPILE_CACHE_DIR): each container's workers compile their Triton
# kernels at start (about a minute on an H100), a new container loads them from here. The cache keeps one
# directory per GPU kind, CUDA and torch version (api/engine/kernels.py), so another GPU never loads them.
CACHE_VOLUME = "kokoro-compile-cache"
CACHE_MOUNT = "/cache"
COMPILE_CACHE_DIR = f"{CACHE_MOUNT}/compile"
# Uploaded voices (POST /v1/audio/voices) on a Volume, when KOKORO_MODAL_VOICES_VOLUME names one at deploy
# time; without it uploads are off (KOKORO_VOICE_UPLOADS=false): a container's own disk is gone when it
# scales down, and other containers never see it (docs/voices.md#where-they-live).
VOICES_VOLUME = os.environ.get("KOKORO_MODAL_VOICES_VOLUME") or None
VOICES_MOUNT = "/voices"
# Modal answers a web request whose response has not started within this many seconds with a 303 redirect
# that the client must follow to wait for it: a long `stream: false` request can outlast it (documented
# in docs/deploy.md; streaming starts within seconds).
RESPONSE_START_LIMIT_S = 150

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
api_keys = modal.Secret.from_name(SECRET_NAME, required_keys=[SECRET_KEY])
compile_cache = modal.Volume.from_name(CACHE_VOLUME, create_if_missing=True)
voices = modal.Volume.from_name(VOICES_VOLUME, create_if_missing=True) if VOICES_VOLUME else None
VOLUMES: dict[str | os.PathLike[str], modal.Volume] = {CACHE_MOUNT: compile_cache}
if voices is not None:
    VOLUMES[VOICES_MOUNT] = voices


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
    """The image's environment (with the Secret's API keys) plus the per-worker admission limits that match
    MAX_INPUTS, /metrics behind a key, the input limit, the compile cache on the Volume, book jobs in the
    Secret's PostgreSQL if it names one, and voice uploads (on only with a voices Volume)."""
    return {
        **os.environ,
        "KOKORO_MAX_INFLIGHT": str(INPUTS_PER_WORKER),
        "KOKORO_MAX_WAITING": str(MAX_WAITING),
        "KOKORO_METRICS_REQUIRE_KEY": "true",
        "KOKORO_MAX_INPUT_CHARS": str(MAX_INPUT_CHARS),
        "KOKORO_COMPILE_CACHE_DIR": COMPILE_CACHE_DIR,
        # Book jobs off unless the Secret also holds KOKORO_JOBS_DATABASE (a PostgreSQL URL the containers
        # reach): containers come and go with the load, and a Volume is no database that several write at
        # once (docs/api.md#books-on-many-machines).
        "KOKORO_DATA_DIR": "none",
        **voice_env(VOICES_VOLUME),
    }


def voice_env(volume: str | None) -> dict[str, str]:
    """Uploads on, into the voices Volume, when there is one; off otherwise."""
    if volume is None:
        return {"KOKORO_VOICE_UPLOADS": "false"}
    return {"KOKORO_VOICE_UPLOADS": "true", "KOKORO_CUSTOM_VOICES_DIR": VOICES_MOUNT}


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
    secrets=[api_keys],
    volumes=VOLUMES,
)
@modal.concurrent(max_inputs=MAX_INPUTS, target_inputs=TARGET_INPUTS)
@modal.web_server(PORT, startup_timeout=STARTUP_TIMEOUT_S)
def serve() -> None:
    process = subprocess.Popen(server_command(), env=server_env())
    # Modal routes requests here once this returns; several ready answers in a row keep them from
    # workers still loading their model.
    wait_until_ready(process, READY_URL, timeout_s=STARTUP_TIMEOUT_S, in_a_row=2 * WORKERS)
    # What the workers compiled is on the Volume for the next container now, not only at shutdown.
    compile_cache.commit()
