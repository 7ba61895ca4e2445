"""The OpenAPI document as the server really answers: each response's content types, every error status
with the one error schema (and Retry-After on 503), /metrics as text. Client generators and fuzzers read
it, so it must not promise what the server never sends (FastAPI's automatic 422) or omit what it does."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from api.audio.formats import CONTENT_TYPES
from api.protocol import BookJobRequest, SpeechAudioDelta, SpeechAudioDone
from api.text.phonemize import LANGUAGES


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    """OpenAI's error shape: every error the server answers has it."""

    error: ErrorDetail


_ERROR_DESCRIPTIONS = {
    400: "Invalid request: a field's value, malformed JSON, or nothing to speak (`param` names the field).",
    401: "Missing or wrong API key (only when API keys are configured).",
    403: "Forbidden: voice uploads are turned off on this server (KOKORO_VOICE_UPLOADS).",
    404: "Unknown model or path.",
    408: "The request body did not arrive in time.",
    409: "The book job is not finished: its audio and captions come once its state is `done`.",
    413: "The request body is too large.",
    500: "Synthesis failed before any audio was sent.",
    503: "Overloaded, or the model is loading or failed to load: retry after `Retry-After` seconds.",
}
_RETRY_AFTER = {
    "Retry-After": {"description": "Seconds to wait before retrying.", "schema": {"type": "integer"}}
}


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """Response entries for these error statuses, all with the error schema."""
    return {
        status: {
            "model": ErrorResponse,
            "description": _ERROR_DESCRIPTIONS[status],
            **({"headers": _RETRY_AFTER} if status == 503 else {}),
        }
        for status in statuses
    }


_BINARY = {"schema": {"type": "string", "format": "binary"}}
# One server-sent event: its `data` is a JSON object, `speech.audio.delta` ({"type", "audio": base64,
# "timestamps" when asked}) or, last, `speech.audio.done` ({"type", "usage"}).
# Each event's `data:` is one JSON object, described by the event models of api/protocol.py (put in the
# document's components by `install_openapi`).
SSE_EVENT_MODELS = (SpeechAudioDelta, SpeechAudioDone)
_SSE_EVENT = {
    "type": "object",
    "required": ["data"],
    "properties": {
        "data": {
            "type": "string",
            "contentMediaType": "application/json",
            "contentSchema": {
                "oneOf": [{"$ref": f"#/components/schemas/{model.__name__}"} for model in SSE_EVENT_MODELS],
                "discriminator": {"propertyName": "type"},
            },
        },
        "event": {"type": "string"},
    },
}
SPEECH_ERRORS = (400, 401, 404, 408, 413, 500, 503)
SPEECH_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "The audio in `response_format` (a chunked body when streamed), or server-sent events "
        "with `stream_format: sse`.",
        "content": {
            **{content_type: _BINARY for content_type in CONTENT_TYPES.values()},
            "text/event-stream": {"schema": _SSE_EVENT},
        },
    },
    **errors(*SPEECH_ERRORS),
}
# The voice-agent vendors' speech endpoints (api/server/routes/agents.py): raw audio in the query's or body's
# format.
AGENT_AUDIO_TYPES = ("audio/pcm", "audio/basic", "audio/x-alaw-basic", "audio/mpeg", "audio/wav")
AGENT_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "The audio, streamed as it is made, in the encoding and rate asked for.",
        "content": {content_type: _BINARY for content_type in AGENT_AUDIO_TYPES},
    },
    **errors(*SPEECH_ERRORS),
}
CAPTIONED_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "One JSON object (`stream: false`), or one JSON object per line as audio is made.",
        "content": {"application/x-ndjson": {"schema": {"type": "string"}}},
    },
    **errors(*SPEECH_ERRORS),
}
METRICS_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "Prometheus text exposition format.",
        "content": {"text/plain": {"schema": {"type": "string"}}},
    },
    **errors(401),
}


@dataclass(frozen=True)
class Link:
    """An OpenAPI link: a value in `source`'s `status` response names the resource another operation,
    `target`, acts on (each "METHOD /path"), given as its path `parameters` or merged into its `body`.
    Clients and the fuzzer's stateful phase follow it: create a job, then read, fetch and delete that one;
    save a listed voice under a new name, then use, fetch and delete that one."""

    source: str
    status: int
    target: str
    parameters: Mapping[str, str] = field(default_factory=dict)
    body: Mapping[str, str] | None = None


_JOB_ID = {"job_id": "$response.body#/id"}
_FIRST_VOICE = "$response.body#/voices/0/id"
_JOB_OPERATIONS = (
    "GET /v1/audio/jobs/{job_id}",
    "GET /v1/audio/jobs/{job_id}/audio",
    "GET /v1/audio/jobs/{job_id}/captions",
    "DELETE /v1/audio/jobs/{job_id}",
)
LINKS = (
    *(Link("POST /v1/audio/jobs", 202, target, _JOB_ID) for target in _JOB_OPERATIONS),
    *(Link("GET /v1/audio/jobs/{job_id}", 200, target, _JOB_ID) for target in _JOB_OPERATIONS[1:]),
    Link("GET /v1/audio/jobs", 200, _JOB_OPERATIONS[0], {"job_id": "$response.body#/data/0/id"}),
    Link("POST /v1/audio/voices", 201, "GET /v1/audio/voices/{voice}", {"voice": "$response.body#/id"}),
    Link("POST /v1/audio/voices", 201, "DELETE /v1/audio/voices/{name}", {"name": "$response.body#/id"}),
    Link("POST /v1/audio/voices", 201, "POST /v1/audio/jobs", body={"voice": "$response.body#/id"}),
    Link("GET /v1/audio/voices", 200, "GET /v1/audio/voices/{voice}", {"voice": _FIRST_VOICE}),
    Link("GET /v1/audio/voices", 200, "POST /v1/audio/voices", body={"voice": _FIRST_VOICE}),
)


def _add_links(paths: dict[str, Any], links: Iterable[Link]) -> None:
    """Each link on its source's response, naming its target by operationId (a KeyError if either
    operation is gone: the table must follow the routes)."""

    def operation(spelled: str) -> dict[str, Any]:
        method, path = spelled.split(" ", 1)
        found: dict[str, Any] = paths[path][method.lower()]
        return found

    for link in links:
        target = operation(link.target)["operationId"]
        definition: dict[str, Any] = {"operationId": target}
        if link.parameters:
            definition["parameters"] = dict(link.parameters)
        if link.body is not None:
            definition["requestBody"] = dict(link.body)
        response = operation(link.source)["responses"][str(link.status)]
        response.setdefault("links", {})[target] = definition


def _errors_as_json(responses: dict[str, Any]) -> None:
    """No 422 (never sent); every error's body is JSON, whatever the route's success type."""
    responses.pop("422", None)
    for status, response in responses.items():
        content = response.get("content", {})
        if int(status) >= 400 and content and "application/json" not in content:
            response["content"] = {"application/json": next(iter(content.values()))}


def install_openapi(app: FastAPI, *, max_input_chars: int, phoneme_symbols: Iterable[str]) -> None:
    """Build the document once, without FastAPI's 422 (validation errors are answered with 400), stating the
    limits the server enforces beyond the models' own: the input's length (a setting), the G2P languages and
    the phoneme alphabet (the model's vocabulary)."""

    def document() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
            for operations in schema.get("paths", {}).values():
                for operation in operations.values():
                    _errors_as_json(operation.get("responses", {}))
            _add_links(schema.get("paths", {}), LINKS)
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            for unused in ("HTTPValidationError", "ValidationError"):
                components.pop(unused, None)
            _add_models(components, (*SSE_EVENT_MODELS, BookJobRequest))
            _state_limits(components, max_input_chars, phoneme_symbols)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = document  # type: ignore[method-assign]


def _add_models(components: dict[str, Any], models: tuple[type[BaseModel], ...]) -> None:
    """The models' JSON schemas (and those they refer to) under components/schemas, as FastAPI puts the
    request and response models there."""
    _, definitions = models_json_schema(
        [(model, "serialization") for model in models], ref_template="#/components/schemas/{model}"
    )
    components.update(definitions.get("$defs", {}))


def _state_limits(components: dict[str, Any], max_input_chars: int, phoneme_symbols: Iterable[str]) -> None:
    """What the speech service checks and no model says: every text field's length, /dev/phonemize's
    language (either case), /dev/generate_from_phonemes's symbols (the vocabulary, and white space between
    words) with at least one symbol."""
    for model, name in (
        ("SpeechRequest", "input"),
        ("CaptionedSpeechRequest", "input"),
        ("PhonemeRequest", "text"),
        ("PhonemesRequest", "phonemes"),
    ):
        components[model]["properties"][name]["maxLength"] = max_input_chars
    language = components["PhonemeRequest"]["properties"]["language"]
    language["enum"] = [*LANGUAGES, *(code.upper() for code in LANGUAGES)]
    symbols = "".join(sorted({_class_char(symbol) for symbol in phoneme_symbols if not symbol.isspace()}))
    components["PhonemesRequest"]["properties"]["phonemes"]["pattern"] = rf"^\s*[{symbols}][{symbols}\s]*$"


def _class_char(symbol: str) -> str:
    """`symbol` as a member of a regular expression's character class (ECMA-262 and Python alike)."""
    return "\\" + symbol if symbol in "\\]^-[" else symbol
