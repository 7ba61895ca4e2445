"""/health (the process lives), /ready (the model is loaded and warmed up, in every worker, or unloaded while
idle and loaded again by the next request) and /metrics (Prometheus)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from pydantic import BaseModel

from api.engine.base import CompilingEngine
from api.engine.scheduling.lifecycle import EngineState
from api.server.openapi import METRICS_RESPONSES
from api.server.workers import WorkerBoard


class KernelsStatus(BaseModel):
    """The torch engine's compiled kernels: "compiled" (full speed), "compiling" (in the background; the
    calls that need a kernel not built yet run it eagerly, at least at the kokoro library's speed) or "eager"
    (not compiled)."""

    state: str
    compiled: int  # variants in use
    compiling: int = 0  # still being built in the background
    failed: int = 0  # could not be built (they run eagerly)
    seconds: float | None = None  # since the first was asked for: so far, or until the last was in use


class ReadyStatus(BaseModel):
    status: str
    engine: str
    stage: str | None = None  # what the start is doing, in words (while starting)
    kernels: KernelsStatus | None = None  # the compiled kernels, where the engine has them
    model_loaded: bool = False  # false while starting, unloaded while idle, reloading, failed
    in_flight: int = 0  # this worker's speech requests in synthesis
    waiting: int = 0  # and waiting for a slot
    error: str | None = None
    workers_ready: int | None = None  # with several workers: how many have their model loaded and warmed up
    workers: int | None = None  # of how many


READY_RESPONSES: dict[int | str, dict[str, object]] = {
    503: {
        "model": ReadyStatus,
        "description": "Not ready: starting (this worker, or another of the server's), failed (with "
        "`error`) or stopped.",
        "headers": {"Retry-After": {"description": "Seconds to wait.", "schema": {"type": "integer"}}},
    }
}

router = APIRouter()


def kernels_status(engine: object) -> dict[str, object] | None:
    status = engine.kernel_status() if isinstance(engine, CompilingEngine) else None
    if status is None:
        return None
    return KernelsStatus(
        state=status.state,
        compiled=status.compiled,
        compiling=status.pending,
        failed=status.failed,
        seconds=status.seconds,
    ).model_dump()


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
        "model_loaded": scheduler.state is EngineState.READY,
        "in_flight": admission.inflight,
        "waiting": admission.waiting,
    }
    if scheduler.state is EngineState.STARTING:
        body["stage"] = scheduler.stage
    kernels = kernels_status(scheduler.engine)
    if kernels is not None:
        body["kernels"] = kernels
    board: WorkerBoard | None = getattr(request.app.state, "workers", None)
    all_ready = True
    if board is not None:
        count = board.count()
        body.update(workers_ready=count.ready, workers=count.expected)
        all_ready = count.all_ready
    # A worker whose model was unloaded while idle is ready: the request that reaches it loads the model
    # again (a failing probe would take it out of the service, and no request would ever reach it).
    if scheduler.serves and all_ready:
        return JSONResponse(body)
    if scheduler.serves:
        body["status"] = EngineState.STARTING.value  # this worker is ready, another is not yet
    if scheduler.failure:
        body["error"] = scheduler.failure
    return JSONResponse(body, status_code=503, headers={"Retry-After": "5"})
