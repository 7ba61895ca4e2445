"""/health (the process lives), /ready (the model is loaded and warmed up) and /metrics (Prometheus)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from pydantic import BaseModel

from api.engine.scheduler import EngineState
from api.openapi import METRICS_RESPONSES


class ReadyStatus(BaseModel):
    status: str
    engine: str
    in_flight: int = 0  # this worker's speech requests in synthesis
    waiting: int = 0  # and waiting for a slot
    error: str | None = None


READY_RESPONSES: dict[int | str, dict[str, object]] = {
    503: {
        "model": ReadyStatus,
        "description": "Not ready: starting, failed (with `error`) or stopped.",
        "headers": {"Retry-After": {"description": "Seconds to wait.", "schema": {"type": "integer"}}},
    }
}

router = APIRouter()


@router.get("/health")
async def health() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/metrics", response_class=PlainTextResponse, responses=METRICS_RESPONSES)
async def metrics(request: Request) -> Response:
    body, content_type = request.app.state.metrics.render()
    return Response(body, media_type=content_type)


@router.get("/ready", response_model=ReadyStatus, responses=READY_RESPONSES)
async def ready(request: Request) -> JSONResponse:
    scheduler = request.app.state.speech.scheduler
    admission = request.app.state.admission
    body: dict[str, object] = {
        "status": scheduler.state.value,
        "engine": scheduler.engine.name,
        "in_flight": admission.inflight,
        "waiting": admission.waiting,
    }
    if scheduler.state is EngineState.READY:
        return JSONResponse(body)
    if scheduler.failure:
        body["error"] = scheduler.failure
    return JSONResponse(body, status_code=503, headers={"Retry-After": "5"})
