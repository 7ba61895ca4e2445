"""The live WebSocket: /v1/audio/speech/live (docs/api.md#live-text)."""

from __future__ import annotations

from fastapi import APIRouter, WebSocket

from api.live.session import LiveService
from api.live.websocket import WebSocketTransport

router = APIRouter()


@router.websocket("/v1/audio/speech/live")
async def live_speech(websocket: WebSocket) -> None:
    service: LiveService = websocket.app.state.live
    await service.serve(WebSocketTransport(websocket, service.settings))
