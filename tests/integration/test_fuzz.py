"""Fuzzing the HTTP API from its own OpenAPI document (schemathesis, every default check: no server
error, status codes, content types, headers and bodies as documented, invalid data refused, valid data
accepted), against the app over the fake tone engine; bounded so it runs in under a minute. What a short
run seldom reaches is checked directly: a finished job's files in every format, and the links the stateful
phase follows. `python -m scripts.tools.fuzz_api` runs every phase, stateful included, thousands of cases
long against a real server process (bench-results/*/fuzz-api.json)."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, settings
from schemathesis.checks import positive_data_acceptance

from api.audio.formats import BookFormat
from api.server.app import create_app
from api.server.openapi import LINKS
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
# each generated case cheap, and the limit itself is part of the document. The voices the fuzzer uploads go
# to a folder of this app's own: the test process's KOKORO_CUSTOM_VOICES_DIR (tests/conftest.py) is shared
# with the servers the other integration tests start, which list what is in it.
FUZZ_ROOT = Path(tempfile.mkdtemp(prefix="fuzz-weights-"))
APP = create_app(
    make_settings(FUZZ_ROOT, max_input_chars=300, custom_voices_dir=FUZZ_ROOT / "custom-voices"),
    engine=FakeEngine(),  # type: ignore[arg-type]
    phonemizer=FakePhonemizer(),  # type: ignore[arg-type]
)
schema = schemathesis.openapi.from_asgi("/openapi.json", Started(APP))


def sends_nothing(value: Any) -> bool:
    """A form value that multipart encoding sends no part for: an empty list or object, or nulls."""
    return value is None or (isinstance(value, list | dict) and all(sends_nothing(item) for item in value))


@schema.hook
def filter_body(context: Any, body: Any) -> bool:
    """Leaves out a book form whose "invalid" field sends no part at all (a `speed` of `[]`, seen in a CI
    run): the request is then the same as one without that field, which is valid and accepted."""
    operation = getattr(context, "operation", None)
    if operation is None or operation.path != "/v1/audio/jobs" or not isinstance(body, dict):
        return True
    return not any(sends_nothing(value) for name, value in body.items() if name != "file")


@pytest.fixture(scope="module", autouse=True)
def client() -> Iterator[TestClient]:
    with TestClient(APP) as client:  # the real lifespan, once: the engine thread starts and loads
        wait_ready(client)
        yield client


@schema.parametrize()
@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
def test_api_conforms_to_its_document(case: Any) -> None:
    # Every check but positive_data_acceptance: a request can fit the schema and still be refused for
    # what no JSON schema says (a voice that does not exist, timestamps asked without SSE): a documented
    # 400 in the error shape, which the other checks verify.
    case.call_and_validate(excluded_checks=[positive_data_acceptance])


def finished(client: TestClient, job_id: str) -> None:
    deadline = time.monotonic() + 30
    while client.get(f"/v1/audio/jobs/{job_id}").json()["state"] != "done":
        assert time.monotonic() < deadline, f"job {job_id} not done in 30 s"
        time.sleep(0.05)


def test_a_finished_jobs_files_come_as_documented(client: TestClient) -> None:
    # The audio in each format and the captions in each: served as the document says (the fuzzer found
    # WAV, FLAC and SRT undocumented), checked by schemathesis's own checks.
    created = [
        client.post(
            "/v1/audio/jobs", json={"input": "Hello there.", "response_format": fmt, "captions": True}
        )
        for fmt in BookFormat
    ]
    audio = schema["/v1/audio/jobs/{job_id}/audio"]["GET"]
    captions = schema["/v1/audio/jobs/{job_id}/captions"]["GET"]
    for response in created:
        job_id = response.json()["id"]
        finished(client, job_id)
        audio.Case(path_parameters={"job_id": job_id}).call_and_validate()
        for fmt in ("srt", "vtt"):
            captions.Case(path_parameters={"job_id": job_id}, query={"format": fmt}).call_and_validate()


def test_a_form_field_is_text(client: TestClient) -> None:
    # What a form's `title` holds is text, whatever it spells (the fuzzer's "object"); its length is held
    # to the document's maxLength, refused in the one error shape.
    book = {"file": ("book.txt", b"Hello there.", "text/plain")}
    spelled = client.post("/v1/audio/jobs", files=book, data={"title": '{"a": 1}'})
    assert spelled.status_code == 202
    assert spelled.json()["title"] == '{"a": 1}'
    form = APP.openapi()["paths"]["/v1/audio/jobs"]["post"]["requestBody"]["content"]["multipart/form-data"]
    longest = form["schema"]["properties"]["title"]["maxLength"]
    assert client.post("/v1/audio/jobs", files=book, data={"title": "t" * longest}).status_code == 202
    refused = client.post("/v1/audio/jobs", files=book, data={"title": "t" * (longest + 1)})
    assert refused.status_code == 400
    assert refused.json()["error"]["param"] == "title"


def at_pointer(document: dict[str, Any], node: dict[str, Any], pointer: str) -> dict[str, Any]:
    """The schema of the value at `pointer` (a JSON pointer) in an instance of `node`."""
    for part in [part for part in pointer.split("/") if part]:
        node = resolved(document, node)
        node = node["items"] if part.isdigit() else node["properties"][part]
    return resolved(document, node)


def resolved(document: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        node = document["components"]["schemas"][node["$ref"].rsplit("/", 1)[1]]
    return node


def test_every_link_leads_to_an_operation_with_the_value_it_needs() -> None:
    document = APP.openapi()
    operations = {op["operationId"]: op for ops in document["paths"].values() for op in ops.values()}
    links = 0
    for ops in document["paths"].values():
        for operation in ops.values():
            for status, response in operation["responses"].items():
                returned = response.get("content", {}).get("application/json", {}).get("schema", {})
                for link in response.get("links", {}).values():
                    links += 1
                    target = operations[link["operationId"]]
                    path_parameters = {p["name"] for p in target.get("parameters", []) if p["in"] == "path"}
                    assert set(link.get("parameters", {})) <= path_parameters, (status, link)
                    expressions = [
                        *link.get("parameters", {}).values(),
                        *link.get("requestBody", {}).values(),
                    ]
                    for expression in expressions:
                        assert at_pointer(document, returned, expression.split("#", 1)[1])["type"] == "string"
                    if "requestBody" in link:
                        body = next(iter(target["requestBody"]["content"].values()))["schema"]
                        assert set(link["requestBody"]) <= set(at_pointer(document, body, "")["properties"])
    assert links == len(LINKS)
