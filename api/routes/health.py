"""/health (the process lives) and /ready (the model is loaded and warmed up)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from api.engine.scheduler import EngineState

router = APIRouter()


@router.get("/health")
async def health() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/ready")
async def ready(request: Request) -> JSONResponse:
    scheduler = request.app.state.speech.scheduler
    body = {"status": scheduler.state.value, "engine": scheduler.engine.name}
    if scheduler.state is EngineState.READY:
        return JSONResponse(body)
    if scheduler.failure:
        body["error"] = scheduler.failure
    return JSONResponse(body, status_code=503, headers={"Retry-After": "5"})
