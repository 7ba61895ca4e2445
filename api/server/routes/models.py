"""GET /v1/models and /v1/models/{id}, in OpenAI's shape; GET /v1/audio/models, in the shape Open WebUI
reads to fill its TTS model menu."""

from __future__ import annotations

from fastapi import APIRouter

from api.errors import NotFoundError
from api.protocol import MODEL_IDS, AudioModel, AudioModelList, ModelCard, ModelList, model_id
from api.server.openapi import errors

router = APIRouter()


@router.get("/v1/models", responses=errors(401))
async def list_models() -> ModelList:
    return ModelList(data=[ModelCard(id=name) for name in MODEL_IDS])


@router.get("/v1/models/{name}", responses=errors(401, 404))
async def get_model(name: str) -> ModelCard:
    """A model id, or a dated snapshot name of one (answered with the name asked for, as OpenAI does)."""
    if model_id(name) not in MODEL_IDS:
        raise NotFoundError(f"The model '{name}' does not exist.", param="model", code="model_not_found")
    return ModelCard(id=name)


@router.get("/v1/audio/models", responses=errors(401))
async def list_audio_models() -> AudioModelList:
    """The ids this server takes as `model` (Open WebUI's TTS settings list them)."""
    return AudioModelList(models=[AudioModel(id=name, name=name) for name in MODEL_IDS])
