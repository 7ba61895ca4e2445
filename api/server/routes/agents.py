"""The voice-agent vendors' endpoints (api/live/): Deepgram's `/v1/speak` (a WebSocket and a POST),
ElevenLabs' `/v1/text-to-speech/{voice_id}` (two WebSockets and two POSTs) and Cartesia's `/tts/websocket`
and `/tts/bytes`."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import APIRouter, Request, WebSocket
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel, Field
from starlette.websockets import WebSocketDisconnect

from api.audio.encoder import WAV_UNKNOWN_SIZE, wav_header
from api.audio.formats import AudioFormat
from api.audio.telephony import RawEncoding
from api.errors import APIError
from api.live import cartesia, elevenlabs
from api.live.common import speech_request
from api.live.deepgram import MEDIA_TYPES, DeepgramProtocol, SpeakParams, speak_params, warning
from api.live.session import LiveService
from api.live.transport import POLICY_VIOLATION
from api.live.websocket import WebSocketTransport
from api.protocol import SpeechRequest
from api.server.openapi import AGENT_RESPONSES
from api.server.routes.speech import remember
from api.speech.encoding import OffLoopEncoder
from api.speech.service import SpeechService
from api.speech.streaming import started

router = APIRouter()


class SpeakBody(BaseModel):
    text: str = Field(..., min_length=1, description="The text to speak.")


def speak_request(params: SpeakParams, text: str) -> SpeechRequest:
    return speech_request(
        input=text, voice=params.voice, speed=params.speed, response_format=AudioFormat.PCM, stream=True
    )


async def refuse_socket(websocket: WebSocket, body: dict[str, Any], exc: APIError) -> None:
    """A socket whose URL is refused before its session starts: the vendor's error message, then 1008."""
    await websocket.accept()
    with contextlib.suppress(WebSocketDisconnect, RuntimeError, OSError):
        await websocket.send_json(body)
        await websocket.close(POLICY_VIOLATION, exc.code or "invalid request")


async def stream_speech(
    request: Request,
    speech: SpeechRequest,
    encoder: Callable[[SpeechService], OffLoopEncoder],
    media_type: str,
    wav_rate: int | None = None,
) -> Response:
    """A vendor POST's answer: the audio as it is made, in `encoder`'s format (behind a streaming WAV header
    at `wav_rate` when given), under the same admission as /v1/audio/speech."""
    service: SpeechService = request.app.state.speech
    job = service.prepare(speech)
    remember(request, job)
    audio = await started(service.audio(job, encoder(service)))
    if wav_rate is not None:
        audio, media_type = _after(wav_header(wav_rate, WAV_UNKNOWN_SIZE), audio), "audio/wav"
    return StreamingResponse(audio, media_type=media_type, headers={"X-Request-Id": job.request_id})


async def _after(first: bytes, rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    yield first
    async for data in rest:
        yield data


@router.websocket("/v1/speak")
async def deepgram_socket(websocket: WebSocket) -> None:
    live: LiveService = websocket.app.state.live
    try:
        params = speak_params(websocket.query_params)
        live.speech.prepare(speak_request(params, "-"))  # the voice and speed, before the session starts
    except APIError as exc:
        await refuse_socket(websocket, warning(exc, kind="Error"), exc)
        return
    await live.serve(WebSocketTransport(websocket, live.settings), DeepgramProtocol(params))


@router.post("/v1/speak", response_model=None, response_class=Response, responses=AGENT_RESPONSES)
async def deepgram_speak(body: SpeakBody, request: Request) -> Response:
    """Deepgram's REST speech: `{"text"}` in, the audio streamed back in the query's encoding."""
    params = speak_params(request.query_params)
    wav = params.container == "wav" and params.encoding is RawEncoding.LINEAR16
    return await stream_speech(
        request,
        speak_request(params, body.text),
        lambda service: service.raw_encoder(params.encoding, params.rate),
        MEDIA_TYPES[params.encoding],
        wav_rate=params.rate if wav else None,
    )


@router.websocket("/v1/text-to-speech/{voice_id}/multi-stream-input")
async def elevenlabs_multi_socket(websocket: WebSocket, voice_id: str) -> None:
    await _elevenlabs_socket(websocket, voice_id, multi=True)


@router.websocket("/v1/text-to-speech/{voice_id}/stream-input")
async def elevenlabs_socket(websocket: WebSocket, voice_id: str) -> None:
    await _elevenlabs_socket(websocket, voice_id, multi=False)


async def _elevenlabs_socket(websocket: WebSocket, voice_id: str, *, multi: bool) -> None:
    live: LiveService = websocket.app.state.live
    voice = elevenlabs.voice_of(voice_id)
    try:
        fmt = elevenlabs.stream_params(websocket.query_params)
        live.speech.prepare(speech_request(input="-", voice=voice))
    except APIError as exc:
        await refuse_socket(websocket, elevenlabs.error_message(exc), exc)
        return
    protocol = elevenlabs.ElevenLabsProtocol(voice, fmt, multi=multi)
    await live.serve(WebSocketTransport(websocket, live.settings), protocol)


@router.post(
    "/v1/text-to-speech/{voice_id}", response_model=None, response_class=Response, responses=AGENT_RESPONSES
)
async def elevenlabs_speech(voice_id: str, body: elevenlabs.SpeechBody, request: Request) -> Response:
    """ElevenLabs' speech: `{"text", "model_id", "voice_settings"}` in, the audio in `output_format`."""
    return await _elevenlabs_speech(voice_id, body, request)


@router.post(
    "/v1/text-to-speech/{voice_id}/stream",
    response_model=None,
    response_class=Response,
    responses=AGENT_RESPONSES,
)
async def elevenlabs_speech_stream(voice_id: str, body: elevenlabs.SpeechBody, request: Request) -> Response:
    return await _elevenlabs_speech(voice_id, body, request)


async def _elevenlabs_speech(voice_id: str, body: elevenlabs.SpeechBody, request: Request) -> Response:
    fmt = elevenlabs.stream_params(request.query_params)
    speed = body.voice_settings.speed if body.voice_settings is not None else 1.0
    speech = speech_request(
        input=body.text, voice=elevenlabs.voice_of(voice_id), speed=speed, response_format=AudioFormat.PCM
    )
    return await stream_speech(
        request, speech, lambda service: service.offloop(fmt.encoder(service.sample_rate)), fmt.media_type
    )


@router.websocket("/tts/websocket")
async def cartesia_socket(websocket: WebSocket) -> None:
    live: LiveService = websocket.app.state.live
    await live.serve(WebSocketTransport(websocket, live.settings), cartesia.CartesiaProtocol(live.speech))


@router.post("/tts/bytes", response_model=None, response_class=Response, responses=AGENT_RESPONSES)
async def cartesia_bytes(body: cartesia.BytesRequest, request: Request) -> Response:
    """Cartesia's speech: one transcript in, the audio in `output_format` back as it is made."""
    encoding, rate = cartesia.bytes_format(body)
    speech = speech_request(
        input=body.transcript,
        voice=cartesia.voice_of(body.voice.id),
        speed=body.generation_config.speed,
        response_format=AudioFormat.PCM,
    )
    wav = body.output_format.container == "wav" and encoding is RawEncoding.LINEAR16
    return await stream_speech(
        request,
        speech,
        lambda service: service.raw_encoder(encoding, rate),
        "audio/pcm",
        wav_rate=rate if wav else None,
    )
