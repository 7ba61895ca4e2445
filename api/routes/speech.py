"""POST /v1/audio/speech."""

from __future__ import annotations

from contextlib import aclosing

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from api.audio.formats import CONTENT_TYPES
from api.protocol import SpeechRequest
from api.speech import SpeechService, first_and_rest

router = APIRouter()


@router.post("/v1/audio/speech", response_model=None)
async def create_speech(body: SpeechRequest, request: Request) -> Response:
    service: SpeechService = request.app.state.speech
    job = service.prepare(body)
    headers = {"X-Request-Id": job.request_id}
    if body.stream_format == "sse":
        _, events = await first_and_rest(service.events(job))
        return StreamingResponse(
            events, media_type="text/event-stream", headers={**headers, "Cache-Control": "no-cache"}
        )
    media_type = CONTENT_TYPES[body.response_format]
    if body.stream:
        _, audio = await first_and_rest(service.audio(job))
        return StreamingResponse(audio, media_type=media_type, headers=headers)
    return Response(await _collect(service, job, request), media_type=media_type, headers=headers)


async def _collect(service: SpeechService, job: object, request: Request) -> bytes:
    parts = []
    async with aclosing(service.audio(job)) as audio:  # type: ignore[arg-type]
        async for data in audio:
            parts.append(data)
            if await request.is_disconnected():
                break
    return b"".join(parts)
