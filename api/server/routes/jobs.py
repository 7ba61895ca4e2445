"""Book jobs: POST /v1/audio/jobs (JSON text or Markdown, or a .txt/.md/.epub file) answers 202 at once;
GET lists them or shows one (state, progress, ETA, chapters); …/audio serves the finished file (Range
requests too), …/captions its SRT or VTT; DELETE cancels a job and removes its files."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response
from pydantic import ValidationError
from starlette.datastructures import UploadFile

from api.audio.formats import BOOK_CONTENT_TYPES, BookFormat
from api.books.service import BookService
from api.errors import InvalidRequestError
from api.protocol import BookJob, BookJobDeleted, BookJobList, BookJobRequest
from api.server.openapi import errors
from api.server.routes.voices import parse_form, read_bounded

router = APIRouter()

# The fields of the multipart form beside `file`.
_FORM_FIELDS = ("voice", "speed", "lang_code", "response_format", "captions", "title")


def _form_field(name: str) -> dict[str, Any]:
    """A form field as the server reads it: text (a number or a boolean spelled as JSON's would be, or as
    yes/no), held to the JSON field's choices and length where those are the text's own."""
    schema: dict[str, Any] = {"type": "string", "description": BookJobRequest.model_fields[name].description}
    if name == "response_format":
        schema["enum"] = [fmt.value for fmt in BookFormat]
    if name == "title":
        schema["maxLength"] = next(rule.max_length for rule in BookJobRequest.model_fields[name].metadata)
    return schema


_FORM_SCHEMA = {
    "type": "object",
    "required": ["file"],
    "properties": {
        "file": {"type": "string", "format": "binary", "description": "A .txt, .md or .epub book."},
        **{name: _form_field(name) for name in _FORM_FIELDS},
    },
    "additionalProperties": False,
}
_CREATE_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/BookJobRequest"}},
            "multipart/form-data": {"schema": _FORM_SCHEMA},
        },
    }
}
_BINARY = {"schema": {"type": "string", "format": "binary"}}
# The finished files' content types, and each caption format's: as served, so as documented.
_AUDIO = {content_type: _BINARY for content_type in sorted(set(BOOK_CONTENT_TYPES.values()))}
CAPTION_TYPES = {"srt": "application/x-subrip", "vtt": "text/vtt"}
_CAPTIONS = {content_type: {"schema": {"type": "string"}} for content_type in CAPTION_TYPES.values()}


def books(request: Request) -> BookService:
    service: BookService | None = request.app.state.books
    if service is None:
        raise InvalidRequestError(
            "Book jobs are off on this server (no KOKORO_JOBS_DATABASE, and KOKORO_DATA_DIR is none).",
            code="jobs_disabled",
        )
    return service


@router.post(
    "/v1/audio/jobs",
    status_code=202,
    responses={
        202: {
            "model": BookJob,
            "description": "The job, queued; its state and progress at its `Location`.",
            "headers": {"Location": {"description": "The job's URL.", "schema": {"type": "string"}}},
        },
        **errors(400, 401, 413),
    },
    openapi_extra=_CREATE_BODY,
)
async def create_job(request: Request) -> JSONResponse:
    service = books(request)
    content_type = request.headers.get("content-type", "")
    body = await read_bounded(request, service.max_body_bytes)
    if content_type.startswith("multipart/form-data"):
        fields, filename, data = await _form(request, body)
        job = await service.create_from_file(data, filename, _fields(fields))
    else:
        job = await service.create(_fields(body))
    return JSONResponse(
        job.model_dump(mode="json"), status_code=202, headers={"Location": f"/v1/audio/jobs/{job.id}"}
    )


@router.get("/v1/audio/jobs", responses=errors(400, 401))
async def list_jobs(request: Request, limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> BookJobList:
    return BookJobList(data=await books(request).recent(limit))


@router.get("/v1/audio/jobs/{job_id}", responses=errors(400, 401, 404))
async def get_job(job_id: str, request: Request) -> BookJob:
    return await books(request).get(job_id)


@router.get(
    "/v1/audio/jobs/{job_id}/audio",
    response_class=FileResponse,
    responses={
        200: {"content": _AUDIO},
        206: {"description": "A range.", "content": _AUDIO},
        **errors(400, 401, 404, 409),
    },
)
async def job_audio(job_id: str, request: Request) -> FileResponse:
    path, media_type, filename = await books(request).audio(job_id)
    return FileResponse(path, media_type=media_type, filename=filename)


@router.get(
    "/v1/audio/jobs/{job_id}/captions",
    response_class=Response,
    responses={
        200: {"content": _CAPTIONS},
        **errors(400, 401, 404, 409),
    },
)
async def job_captions(
    job_id: str,
    request: Request,
    format: Literal["srt", "vtt"] = "vtt",  # noqa: A002 - the query's name
) -> Response:
    text = await books(request).captions(job_id, format)
    return Response(text, media_type=f"{CAPTION_TYPES[format]}; charset=utf-8")


@router.delete("/v1/audio/jobs/{job_id}", responses=errors(400, 401, 404))
async def delete_job(job_id: str, request: Request) -> BookJobDeleted:
    await books(request).delete(job_id)
    return BookJobDeleted(id=job_id)


async def _form(request: Request, body: bytes) -> tuple[dict[str, str], str, bytes]:
    form = await parse_form(request, body, max_fields=len(_FORM_FIELDS))
    file = form.get("file")
    if not isinstance(file, UploadFile):
        raise InvalidRequestError(
            "The form needs a `file` (.txt, .md or .epub).", param="file", code="missing_file"
        )
    fields = {name: value for name, value in form.items() if isinstance(value, str)}
    unknown = sorted(set(fields) - set(_FORM_FIELDS))
    if unknown:
        raise InvalidRequestError(
            f"Unknown form fields: {', '.join(unknown)}.", param=unknown[0], code="unknown_field"
        )
    return fields, file.filename or "", await file.read()


def _fields(data: bytes | dict[str, str]) -> BookJobRequest:
    """The request's fields (a JSON body, or a form's fields with a placeholder input), validated."""
    try:
        if isinstance(data, bytes):
            return BookJobRequest.model_validate_json(data)
        # A form's fields are all strings: read as JSON would be in lax mode ("true", "1.2").
        return BookJobRequest.model_validate({"input": "-", **data}, strict=False)
    except ValidationError as exc:
        raise RequestValidationError(exc.errors(include_url=False)) from exc
