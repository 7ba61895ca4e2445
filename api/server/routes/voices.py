"""The voices: GET /v1/audio/voices lists them (language and gender, so a client can filter); POST adds a
custom one (a tensor file, or a mix saved under a name); DELETE removes a custom one; GET
/v1/audio/voices/{voice} and Kokoro-FastAPI's POST /v1/audio/voices/combine give any voice or mix back as
a .pt file."""

from __future__ import annotations

import re
from collections.abc import AsyncGenerator
from typing import Annotated, Any

from fastapi import APIRouter, Body, Request
from fastapi.responses import Response
from pydantic import BaseModel
from starlette.datastructures import FormData, UploadFile
from starlette.formparsers import FormParser, MultiPartException, MultiPartParser

from api.engine.voice_files import MAX_VOICE_FILE_BYTES, VOICE_GENDERS, file_too_large
from api.errors import InvalidRequestError
from api.protocol import Voice, VoiceList
from api.server.openapi import errors
from api.text.phonemize import LANGUAGES
from api.voices.library import VoiceLibrary, combined_spec

router = APIRouter()

# A form's framing, its name field and a mix spec, beyond the file itself.
FORM_OVERHEAD_BYTES = 16 * 1024
PT_MEDIA_TYPE = "application/octet-stream"
_FILENAME_UNSAFE = re.compile(r"[^A-Za-z0-9_+().-]")
# VOICE_NAME with its letters spelled out, as check_voice_name holds a new voice's name to.
_NAME_PATTERN = f"^[{''.join(sorted(LANGUAGES))}][{''.join(sorted(VOICE_GENDERS))}]_[A-Za-z0-9_]{{1,60}}$"

_UPLOAD_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["name"],
                    # A file or a voice to save, never both (each alone matches one branch), and no more.
                    "oneOf": [{"required": ["file"]}, {"required": ["voice"]}],
                    "additionalProperties": False,
                    "properties": {
                        "name": {
                            "type": "string",
                            "pattern": _NAME_PATTERN,
                            "description": "The new voice's name, e.g. af_narrator.",
                            "example": "af_narrator",
                        },
                        "file": {
                            "type": "string",
                            "format": "binary",
                            "description": "A .pt or .safetensors file: one float32 tensor [510, 1, 256].",
                        },
                        "voice": {
                            "type": "string",
                            "description": "Or a voice or mix to save under `name`.",
                            "example": "af_heart(2)+am_adam(1)",
                        },
                    },
                }
            }
        },
    }
}
_PT_FILE: dict[int | str, dict[str, Any]] = {
    200: {"content": {PT_MEDIA_TYPE: {"schema": {"type": "string", "format": "binary"}}}}
}


class VoiceDeleted(BaseModel):
    id: str
    object: str = "voice"
    deleted: bool = True


def library(request: Request) -> VoiceLibrary:
    voices: VoiceLibrary = request.app.state.voices
    return voices


@router.get("/v1/audio/voices", responses=errors(401))
async def list_voices(request: Request) -> VoiceList:
    names = library(request).store.names()
    return VoiceList(voices=[Voice.named(name) for name in names])


@router.post("/v1/audio/voices", status_code=201, responses=errors(400, 401, 403), openapi_extra=_UPLOAD_BODY)
async def add_voice(request: Request) -> Voice:
    form = await read_form(request)
    name, file, spec = form.get("name"), form.get("file"), form.get("voice")
    if not isinstance(name, str):
        raise InvalidRequestError("The form needs a `name` field.", param="name", code="missing_name")
    if isinstance(file, UploadFile) == isinstance(spec, str):
        raise InvalidRequestError(
            "Send either a `file` (a voice tensor) or a `voice` (a voice or mix to save), not both or "
            "neither.",
            param="file",
            code="invalid_form",
        )
    if isinstance(file, UploadFile):
        await library(request).add_file(name, await file.read())
    else:
        await library(request).add_mix(name, str(spec))
    return Voice.named(name)


@router.delete("/v1/audio/voices/{name}", responses=errors(400, 401, 403, 404))
async def delete_voice(name: str, request: Request) -> VoiceDeleted:
    await library(request).remove(name)
    return VoiceDeleted(id=name)


@router.post("/v1/audio/voices/combine", response_class=Response, responses={**_PT_FILE, **errors(400, 401)})
async def combine_voices(voices: Annotated[str | list[str], Body()], request: Request) -> Response:
    spec = combined_spec(voices)
    return pt_file(spec, await library(request).download(spec))


@router.get("/v1/audio/voices/{voice}", response_class=Response, responses={**_PT_FILE, **errors(400, 401)})
async def download_voice(voice: str, request: Request) -> Response:
    return pt_file(voice, await library(request).download(voice))


def pt_file(spec: str, data: bytes) -> Response:
    filename = _FILENAME_UNSAFE.sub("", spec) or "voice"
    headers = {"Content-Disposition": f'attachment; filename="{filename}.pt"', "Cache-Control": "no-cache"}
    return Response(data, media_type=PT_MEDIA_TYPE, headers=headers)


async def read_form(request: Request) -> FormData:
    """The form (multipart, or URL-encoded for a mix), its body read up to the voice file limit and no
    further."""
    content_type = request.headers.get("content-type", "")
    multipart = content_type.startswith("multipart/form-data")
    if not multipart and not content_type.startswith("application/x-www-form-urlencoded"):
        raise InvalidRequestError(
            "Send the voice as multipart/form-data with the fields `name` and `file` (or `voice`).",
            code="invalid_content_type",
        )
    body = await read_bounded(request, MAX_VOICE_FILE_BYTES + FORM_OVERHEAD_BYTES)
    return await parse_form(request, body, multipart=multipart, max_fields=2)


async def parse_form(request: Request, body: bytes, *, multipart: bool = True, max_fields: int) -> FormData:
    """`body` (already read) as a form: multipart with one file at most, or URL-encoded; 400 if malformed."""

    async def replay() -> AsyncGenerator[bytes, None]:
        yield body
        yield b""  # the end, as a request stream gives it: Starlette 1.7 drops the last field without

    try:
        if not multipart:
            return await FormParser(request.headers, replay()).parse()
        return await MultiPartParser(request.headers, replay(), max_files=1, max_fields=max_fields).parse()
    except MultiPartException as exc:
        raise InvalidRequestError(f"The form is malformed: {exc.message}", code="invalid_form") from exc


async def read_bounded(request: Request, limit: int) -> bytes:
    """The request body, refused (400) as soon as it is over `limit` bytes, its rest never read."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise file_too_large()
    parts, size = [], 0
    async for part in request.stream():
        size += len(part)
        if size > limit:
            raise file_too_large()
        parts.append(part)
    return b"".join(parts)
