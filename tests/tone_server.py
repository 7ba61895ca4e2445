"""A real server process (uvicorn, real routes, middleware, text pipeline, G2P and encoders) over the
fake tone engine, for end-to-end tests that need more audio, or more requests, than the real model makes
quickly on a CPU. Takes the same flags as `python -m api`.

    python -m tests.tone_server --host 127.0.0.1 --port PORT [--workers N]   (settings from KOKORO_*)
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from typing import TYPE_CHECKING

import uvicorn

from api.__main__ import parse_args, prepare_metrics_dir, prepare_worker_board
from api.settings import Settings

if TYPE_CHECKING:
    from fastapi import FastAPI

# Seconds the tone engine sleeps per chunk, so that requests overlap as they would on a real model.
DELAY_ENV = "TONE_ENGINE_DELAY_S"
# Seconds the tone engine takes to load (each time: at start, and again after an idle unload).
LOAD_DELAY_ENV = "TONE_ENGINE_LOAD_DELAY_S"
# A phoneme symbol that makes the tone engine fail (to test error handling end to end).
FAIL_ENV = "TONE_ENGINE_FAIL_SYMBOL"
# Seconds each worker's app factory holds the GIL, as a long import or a C call that keeps it does: no
# other thread of the worker runs meanwhile, uvicorn's health-check answerer included.
HOLD_GIL_ENV = "TONE_SERVER_HOLD_GIL_S"


def hold_gil(seconds: float) -> None:
    # ctypes releases the GIL around a foreign call, except through PyDLL.
    libc = ctypes.PyDLL(ctypes.util.find_library("c"))
    libc.usleep(int(seconds * 1_000_000))


def create_tone_app() -> FastAPI:
    # Imported here, in the worker, after uvicorn has started the thread that answers its supervisor: a
    # spawned worker first imports the main module (this one), and nothing answers while that runs.
    # `python -m api` is the same: a package's __main__ is not imported again in its workers.
    from api.server.app import create_app
    from api.server.logs import configure_logging
    from api.server.workers import on_board
    from tests.fakes import FakeEngine, shipped_vocab

    hold_gil(float(os.environ.get(HOLD_GIL_ENV, "0")))
    settings = Settings()
    configure_logging(settings.log_level)
    fail_symbol = os.environ.get(FAIL_ENV)
    fail_token = shipped_vocab()[fail_symbol] if fail_symbol else None
    delay = float(os.environ.get(DELAY_ENV, "0"))
    load_delay = float(os.environ.get(LOAD_DELAY_ENV, "0"))

    def engine() -> FakeEngine:  # a factory: an idle unload (KOKORO_IDLE_UNLOAD_S) replaces the engine
        return FakeEngine(delay=delay, fail_token=fail_token, load_delay=load_delay)

    return on_board(create_app(settings, engine_factory=engine))  # type: ignore[arg-type]


def main() -> None:
    args = parse_args()
    settings = Settings()
    prepare_metrics_dir(args.workers)
    prepare_worker_board(args.workers)
    uvicorn.run(
        "tests.tone_server:create_tone_app",
        factory=True,
        host=args.host,
        port=args.port,
        workers=args.workers,
        limit_concurrency=args.limit_concurrency,
        log_level=settings.log_level,
        timeout_worker_healthcheck=settings.worker_healthcheck_timeout_s,
    )


if __name__ == "__main__":
    main()
