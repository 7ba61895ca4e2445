"""GET /v1/models and /v1/models/{id}, in OpenAI's shape."""

from __future__ import annotations

from fastapi import APIRouter

from api.errors import NotFoundError
from api.openapi import errors
from api.protocol import MODEL_IDS, ModelCard, ModelList, model_id

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
