"""A real server process (uvicorn, real routes, middleware, text pipeline, G2P and encoders) over the
fake tone engine, for end-to-end tests that need more audio, or more requests, than the real model makes
quickly on a CPU. Takes the same flags as `python -m api`.

    python -m tests.tone_server --host 127.0.0.1 --port PORT [--workers N]   (settings from KOKORO_*)
"""

from __future__ import annotations

import os

import uvicorn
from fastapi import FastAPI

from api.__main__ import parse_args, prepare_metrics_dir
from api.app import create_app
from api.logs import configure_logging
from api.settings import Settings
from tests.fakes import FakeEngine, shipped_vocab

# Seconds the tone engine sleeps per chunk, so that requests overlap as they would on a real model.
DELAY_ENV = "TONE_ENGINE_DELAY_S"
# A phoneme symbol that makes the tone engine fail (to test error handling end to end).
FAIL_ENV = "TONE_ENGINE_FAIL_SYMBOL"


def create_tone_app() -> FastAPI:
    settings = Settings()
    configure_logging(settings.log_level)
    fail_symbol = os.environ.get(FAIL_ENV)
    fail_token = shipped_vocab()[fail_symbol] if fail_symbol else None
    engine = FakeEngine(delay=float(os.environ.get(DELAY_ENV, "0")), fail_token=fail_token)
    return create_app(settings, engine=engine)  # type: ignore[arg-type]


def main() -> None:
    args = parse_args()
    prepare_metrics_dir(args.workers)
    uvicorn.run(
        "tests.tone_server:create_tone_app",
        factory=True,
        host=args.host,
        port=args.port,
        workers=args.workers,
        limit_concurrency=args.limit_concurrency,
        log_level=Settings().log_level,
    )


if __name__ == "__main__":
    main()
