"""Kokoro-FastAPI's POST /dev/unload and POST /dev/reload: free this worker's model now (once nothing is
queued or running), or load it again now rather than at the next request. Behind the API keys when set."""

from __future__ import annotations

from fastapi import APIRouter, Request
from pydantic import BaseModel

from api.engine.scheduling.scheduler import Scheduler
from api.errors import InvalidRequestError
from api.server.openapi import errors

router = APIRouter()


class EngineStatus(BaseModel):
    status: str  # the engine's state when the answer was sent: the unload or reload happens on its thread
    engine: str


def _status(scheduler: Scheduler) -> EngineStatus:
    return EngineStatus(status=scheduler.state.value, engine=scheduler.engine.name)


@router.post("/dev/unload", status_code=202, responses=errors(400, 401))
async def unload(request: Request) -> EngineStatus:
    scheduler: Scheduler = request.app.state.speech.scheduler
    if not scheduler.can_unload:
        raise InvalidRequestError(
            f"The {scheduler.engine.name} engine cannot be unloaded here (the shared engine's model lives in "
            "its own process).",
            code="unload_unsupported",
        )
    scheduler.unload()
    return _status(scheduler)


@router.post("/dev/reload", status_code=202, responses=errors(401))
async def reload(request: Request) -> EngineStatus:
    scheduler: Scheduler = request.app.state.speech.scheduler
    scheduler.reload()
    return _status(scheduler)
