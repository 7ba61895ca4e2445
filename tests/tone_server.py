"""A real server process (uvicorn, real routes, text pipeline, G2P and encoders) over the fake tone
engine, for end-to-end tests that need more audio than the real model makes quickly on a CPU.

    python -m tests.tone_server --host 127.0.0.1 --port PORT   (settings from KOKORO_* as usual)
"""

from __future__ import annotations

import uvicorn

from api.__main__ import parse_args
from api.app import configure_logging, create_app
from api.settings import Settings
from tests.fakes import FakeEngine


def main() -> None:
    args = parse_args()
    settings = Settings()
    configure_logging(settings.log_level)
    app = create_app(settings, engine=FakeEngine())  # type: ignore[arg-type]
    uvicorn.run(app, host=args.host, port=args.port, log_level=settings.log_level)


if __name__ == "__main__":
    main()
