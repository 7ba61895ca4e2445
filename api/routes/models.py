"""GET /v1/models and /v1/models/{id}, in OpenAI's shape."""

from __future__ import annotations

from fastapi import APIRouter

from api.errors import NotFoundError
from api.openapi import errors
from api.protocol import MODEL_IDS, ModelCard, ModelList

router = APIRouter()


@router.get("/v1/models", responses=errors(401))
async def list_models() -> ModelList:
    return ModelList(data=[ModelCard(id=model_id) for model_id in MODEL_IDS])


@router.get("/v1/models/{model_id}", responses=errors(401, 404))
async def get_model(model_id: str) -> ModelCard:
    if model_id not in MODEL_IDS:
        raise NotFoundError(f"The model '{model_id}' does not exist.", param="model", code="model_not_found")
    return ModelCard(id=model_id)
