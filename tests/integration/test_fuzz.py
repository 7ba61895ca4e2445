"""Fuzzing the HTTP API from its own OpenAPI document (schemathesis, every default check: no server
error, status codes, content types, headers and bodies as documented, invalid data refused, valid data
accepted), against the app over the fake tone engine; bounded so it runs in a couple of minutes.
`scripts/tools/fuzz.sh URL EXAMPLES` runs the same checks longer against a running server."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, settings
from schemathesis.checks import positive_data_acceptance

from api.app import create_app
from tests.fakes import FakeEngine, FakePhonemizer
from tests.unit.test_api import make_settings, wait_ready


class Started:
    """The app with its lifespan already run: schemathesis's client runs a lifespan per call, which would
    start and stop the engine thread each time; here those events are answered and nothing else."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "lifespan":
            await self.app(scope, receive, send)
            return
        while True:
            message = await receive()
            await send({"type": message["type"] + ".complete"})
            if message["type"] == "lifespan.shutdown":
                return


# Loaded when the module is collected (schemathesis parametrizes from the document); short inputs keep
# each generated case cheap, and the limit itself is part of the document.
APP = create_app(
    make_settings(Path(tempfile.mkdtemp(prefix="fuzz-weights-")), max_input_chars=300),
    engine=FakeEngine(),  # type: ignore[arg-type]
    phonemizer=FakePhonemizer(),  # type: ignore[arg-type]
)
schema = schemathesis.openapi.from_asgi("/openapi.json", Started(APP))


@pytest.fixture(scope="module", autouse=True)
def running() -> Iterator[None]:
    with TestClient(APP) as client:  # the real lifespan, once: the engine thread starts and loads
        wait_ready(client)
        yield


@schema.parametrize()
@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
def test_api_conforms_to_its_document(case: Any) -> None:
    # Every check but positive_data_acceptance: a request can fit the schema and still be refused for
    # what no JSON schema says (a voice that does not exist, timestamps asked without SSE): a documented
    # 400 in the error shape, which the other checks verify.
    case.call_and_validate(excluded_checks=[positive_data_acceptance])
