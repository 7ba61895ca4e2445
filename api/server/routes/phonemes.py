"""Kokoro-FastAPI's phoneme endpoints: POST /dev/phonemize (text -> phonemes and token ids, as the speech
path makes them) and POST /dev/generate_from_phonemes (phonemes -> audio)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from api.audio.formats import CONTENT_TYPES
from api.protocol import PhonemeRequest, PhonemeResponse, PhonemesRequest
from api.server.openapi import SPEECH_RESPONSES, errors
from api.server.routes.speech import collect, remember
from api.speech.service import SpeechService
from api.speech.streaming import started

router = APIRouter()


@router.post("/dev/phonemize", responses=errors(400, 401, 503))
async def phonemize(body: PhonemeRequest, request: Request) -> PhonemeResponse:
    service: SpeechService = request.app.state.speech
    phonemes, tokens = await service.phonemize(body.text, body.language.lower())
    return PhonemeResponse(phonemes=phonemes, tokens=tokens)


@router.post(
    "/dev/generate_from_phonemes", response_model=None, response_class=Response, responses=SPEECH_RESPONSES
)
async def generate_from_phonemes(body: PhonemesRequest, request: Request) -> Response:
    service: SpeechService = request.app.state.speech
    job = service.prepare_phonemes(body)
    remember(request, job)
    headers = {"X-Request-Id": job.request_id}
    media_type = CONTENT_TYPES[body.response_format]
    if body.stream:
        return StreamingResponse(await started(service.audio(job)), media_type=media_type, headers=headers)
    whole = await collect(service, job, request)
    if isinstance(whole, Response):
        return whole
    return Response(whole, media_type=media_type, headers=headers)
