"""GET /v1/audio/voices: every voice, with its language and gender, so a client can filter."""

from __future__ import annotations

from fastapi import APIRouter, Request

from api.openapi import errors
from api.protocol import Voice, VoiceList

router = APIRouter()


@router.get("/v1/audio/voices", responses=errors(401))
async def list_voices(request: Request) -> VoiceList:
    names = request.app.state.speech.voices.names()
    return VoiceList(voices=[Voice.named(name) for name in names])
