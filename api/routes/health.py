"""/health (the process lives), /ready (the model is loaded and warmed up) and /metrics (Prometheus)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from api.engine.scheduler import EngineState

router = APIRouter()


@router.get("/health")
async def health() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    body, content_type = request.app.state.metrics.render()
    return Response(body, media_type=content_type)


@router.get("/ready")
async def ready(request: Request) -> JSONResponse:
    scheduler = request.app.state.speech.scheduler
    body = {"status": scheduler.state.value, "engine": scheduler.engine.name}
    if scheduler.state is EngineState.READY:
        return JSONResponse(body)
    if scheduler.failure:
        body["error"] = scheduler.failure
    return JSONResponse(body, status_code=503, headers={"Retry-After": "5"})
