"""POST /dev/captioned_speech: Kokoro-FastAPI's audio with word timestamps, as one JSON object or as one
JSON line per audio piece."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncGenerator
from contextlib import aclosing

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from api.audio.formats import CONTENT_TYPES
from api.errors import InvalidRequestError
from api.protocol import CaptionedSpeechRequest, CaptionedSpeechResponse
from api.server.openapi import CAPTIONED_RESPONSES
from api.server.routes.speech import remember
from api.speech.captions import WordTime
from api.speech.job import Piece, SpeechJob
from api.speech.service import SpeechService
from api.speech.streaming import started
from api.text.subtitles import TimedWord, render

router = APIRouter()


@router.post(
    "/dev/captioned_speech",
    response_model=None,
    responses={**CAPTIONED_RESPONSES, 200: {**CAPTIONED_RESPONSES[200], "model": CaptionedSpeechResponse}},
)
async def create_captioned_speech(body: CaptionedSpeechRequest, request: Request) -> Response:
    if body.return_download_link:
        raise InvalidRequestError(
            "Download links are not supported; the audio is in the response.",
            param="return_download_link",
            code="unsupported_parameter",
        )
    service: SpeechService = request.app.state.speech
    job = service.prepare(body.model_copy(update={"return_timestamps": True, "stream_format": "audio"}))
    remember(request, job)
    headers = {"X-Request-Id": job.request_id}
    content_type = CONTENT_TYPES[body.response_format]
    if body.stream:
        lines = await started(_lines(service, job, body, content_type))
        return StreamingResponse(lines, media_type="application/x-ndjson", headers=headers)
    audio = bytearray()
    words: list[WordTime] = []
    async with aclosing(service.pieces(job)) as pieces:
        async for piece in pieces:
            audio += piece.data
            words += piece.words
    content = _payload(bytes(audio), content_type, words if body.return_timestamps else None)
    if body.subtitle_format is not None:
        content["subtitles"] = _subtitles(words, body.subtitle_format)
    return JSONResponse(content, headers=headers)


async def _lines(
    service: SpeechService, job: SpeechJob, body: CaptionedSpeechRequest, content_type: str
) -> AsyncGenerator[bytes, None]:
    words: list[WordTime] = []
    async with aclosing(service.pieces(job)) as pieces:
        async for piece in pieces:
            words += piece.words
            yield _line(_piece_payload(piece, content_type, body.return_timestamps))
    if body.subtitle_format is not None:
        last = _payload(b"", content_type, [] if body.return_timestamps else None)
        last["subtitles"] = _subtitles(words, body.subtitle_format)
        yield _line(last)


def _piece_payload(piece: Piece, content_type: str, timestamps: bool) -> dict[str, object]:
    return _payload(piece.data, content_type, piece.words if timestamps else None)


def _payload(audio: bytes, content_type: str, words: list[WordTime] | None) -> dict[str, object]:
    return {
        "audio": base64.b64encode(audio).decode("ascii"),
        "audio_format": content_type,
        "timestamps": None if words is None else [vars(word) for word in words],
    }


def _subtitles(words: list[WordTime], fmt: str) -> str:
    timed = [TimedWord(word.word, word.start_time, word.end_time) for word in words]
    return render(timed, "srt" if fmt == "srt" else "vtt")


def _line(payload: dict[str, object]) -> bytes:
    return (json.dumps(payload, ensure_ascii=False, separators=(",", ":")) + "\n").encode()
