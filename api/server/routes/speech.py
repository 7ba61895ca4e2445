"""POST /v1/audio/speech."""

from __future__ import annotations

import asyncio
import contextlib
from contextlib import aclosing

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from api.audio.formats import CONTENT_TYPES
from api.protocol import SpeechRequest
from api.server.openapi import SPEECH_RESPONSES
from api.speech.job import SpeechJob
from api.speech.service import SpeechService
from api.speech.streaming import started

router = APIRouter()
# nginx's status for a request whose client closed the connection before the response.
CLIENT_CLOSED_REQUEST = 499


@router.post("/v1/audio/speech", response_model=None, response_class=Response, responses=SPEECH_RESPONSES)
async def create_speech(body: SpeechRequest, request: Request) -> Response:
    service: SpeechService = request.app.state.speech
    job = service.prepare(body)
    remember(request, job)
    headers = {"X-Request-Id": job.request_id}
    if body.stream_format == "sse":
        events = await started(service.events(job))
        return StreamingResponse(
            events, media_type="text/event-stream", headers={**headers, "Cache-Control": "no-cache"}
        )
    media_type = CONTENT_TYPES[body.response_format]
    if body.stream:
        stream = await started(service.audio(job))
        return StreamingResponse(stream, media_type=media_type, headers=headers)
    whole = await collect(service, job, request)
    if isinstance(whole, Response):
        return whole
    return Response(whole, media_type=media_type, headers=headers)


def remember(request: Request, job: SpeechJob) -> None:
    """What the access log reports once the response has ended."""
    sample_rate = request.app.state.speech.sample_rate
    request.state.audio_seconds = lambda: job.samples_out / sample_rate
    request.state.input = job.request.input


async def collect(service: SpeechService, job: SpeechJob, request: Request) -> Response | bytes:
    """The whole body, unless the client leaves first: then synthesis is cancelled (499, never sent)."""
    reading = asyncio.ensure_future(_read_all(service, job))
    watch = asyncio.ensure_future(_wait_for_disconnect(request))
    await asyncio.wait({reading, watch}, return_when=asyncio.FIRST_COMPLETED)
    watch.cancel()
    if reading.done():
        return reading.result()
    reading.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await reading
    return Response(status_code=CLIENT_CLOSED_REQUEST)


async def _read_all(service: SpeechService, job: SpeechJob) -> bytes:
    async with aclosing(service.audio(job)) as audio:
        return b"".join([data async for data in audio])


async def _wait_for_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
