"""`python -m api`: run the server under uvicorn."""

from __future__ import annotations

import argparse
import logging
import os
import platform
import signal
import sys
import tempfile
from collections.abc import MutableMapping
from typing import TYPE_CHECKING

import uvicorn

from api.engine.allocator import AllocatorError, describe_allocator, restart_under_tcmalloc
from api.engine.choice import EngineName, engine_at_start
from api.engine.shared import SOCKET_ENV
from api.live.discovery import advertise
from api.metrics import MULTIPROC_ENV
from api.server.logs import configure_logging
from api.server.security import MissingKeysError, required_keys
from api.server.workers import BOARD_ENV, WorkerBoard, on_board
from api.settings import Settings, get_settings

if TYPE_CHECKING:
    from fastapi import FastAPI

logger = logging.getLogger(__name__)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m api", description="Kokoro OpenAI-compatible TTS server")
    parser.add_argument("--host", default="0.0.0.0", help="bind address (default 0.0.0.0)")
    parser.add_argument("--port", type=int, default=8880, help="port (default 8880)")
    parser.add_argument("--workers", type=int, default=1, help="worker processes, each with its own model")
    parser.add_argument(
        "--limit-concurrency",
        type=int,
        default=None,
        help="uvicorn's hard cap on concurrent connections per worker (beyond it: 503)",
    )
    return parser.parse_args(argv)


# oneDNN keeps up to 1,024 compiled convolutions by default, one per input shape, and nearly every chunk
# has a width of its own: under 4 clients the torch worker's peak fell from 1846 to 1784 MiB with 32 kept
# (no loss of speed; docs/journal/cpu-kernels-int8.md, entry 15). Set before any worker runs a convolution.
ONEDNN_CACHE_ENV = "ONEDNN_PRIMITIVE_CACHE_CAPACITY"
ONEDNN_CACHE_DEFAULT = "32"


def prepare_metrics_dir(workers: int) -> None:
    """With several workers, metrics go through files: the workers start fresh and read this variable
    before importing prometheus_client; /metrics, in whichever worker answers, merges them all."""
    if workers > 1 and not os.environ.get(MULTIPROC_ENV):
        os.environ[MULTIPROC_ENV] = tempfile.mkdtemp(prefix="kokoro-metrics-")


def prepare_worker_board(workers: int) -> None:
    """With several workers, a board on which each says whether it is ready, so that /ready in any of them
    answers for all (api/server/workers.py)."""
    if workers > 1 and not os.environ.get(BOARD_ENV):
        os.environ[BOARD_ENV] = str(WorkerBoard.create(workers).directory)


# PyTorch's Apple GPU backend (MPS) runs an operator it lacks on the CPU only when this is set before torch
# loads; without it kokoro's model stops at the first such operator.
MPS_FALLBACK_ENV = "PYTORCH_ENABLE_MPS_FALLBACK"


def allow_mps_fallback(environ: MutableMapping[str, str], system: str | None = None) -> bool:
    """On macOS, let MPS fall back to the CPU for missing operators (unless the user set the variable);
    whether it was set here."""
    if (system or platform.system()) != "Darwin" or MPS_FALLBACK_ENV in environ:
        return False
    environ[MPS_FALLBACK_ENV] = "1"
    return True


def main(argv: list[str] | None = None, engine_name: EngineName | None = None) -> None:
    """`engine_name`: the engine the workers will run (`engine_at_start`), where the caller has it already."""
    args = parse_args(argv)
    settings = get_settings()
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    os.environ.setdefault(ONEDNN_CACHE_ENV, ONEDNN_CACHE_DEFAULT)
    prepare_metrics_dir(args.workers)
    prepare_worker_board(args.workers)
    configure_logging(settings.log_level, settings.log_format)
    if allow_mps_fallback(os.environ):
        logger.info("macOS: %s=1, so the Apple GPU (MPS) runs what it lacks on the CPU", MPS_FALLBACK_ENV)
    engine_name = engine_name or engine_at_start(settings)
    logger.info("%s", describe_allocator(settings.allocator, engine_name))
    if not (settings.shared_engine and args.workers > 1):
        serve(args, settings)
        return
    # Imported here: it loads torch, which `python -m api` does only after choosing its allocator.
    from api.server.engine_process import engine_process

    with engine_process(on_death=lambda _: os.kill(os.getpid(), signal.SIGTERM)) as engine:
        os.environ[SOCKET_ENV] = str(engine.path)
        serve(args, settings)
    if engine.died is not None:
        sys.exit(f"the shared engine process exited with status {engine.died}")


def serve(args: argparse.Namespace, settings: Settings) -> None:
    with advertise(settings):  # the Wyoming service, by this process for all its workers
        run_uvicorn(args, settings)


def run_uvicorn(args: argparse.Namespace, settings: Settings) -> None:
    uvicorn.run(
        "api.__main__:create_worker_app",
        factory=True,
        host=args.host,
        port=args.port,
        workers=args.workers,
        limit_concurrency=args.limit_concurrency,
        log_level=settings.log_level,
        log_config=None,  # the server's own logging (text or JSON), set up above and in each worker
        access_log=False,  # api.server.logs writes one line per request instead
        timeout_keep_alive=int(max(1, settings.keep_alive_s)),
        timeout_graceful_shutdown=30,
        timeout_worker_healthcheck=settings.worker_healthcheck_timeout_s,
    )


def create_worker_app() -> FastAPI:
    """uvicorn's factory, in each worker: `create_app_from_env`'s app, on the worker board."""
    # Imported here, in the worker: this process must not load torch before it has chosen its allocator.
    from api.server.app import create_app_from_env

    return on_board(create_app_from_env())


if __name__ == "__main__":
    # Before anything heavy is loaded: the allocator is the process's from its start
    # (api/engine/allocator.py).
    try:
        settings = get_settings()
        # Before the model loads: a server that must not run without keys says so in a second.
        required_keys(settings.api_keys, settings.api_keys_file, settings.require_api_keys)
        engine_name = engine_at_start(settings)
        restart_under_tcmalloc(settings.allocator, engine_name, sys.orig_argv, sys.executable)
    except (AllocatorError, MissingKeysError) as exc:
        sys.exit(f"python -m api: {exc}")
    main(engine_name=engine_name)
