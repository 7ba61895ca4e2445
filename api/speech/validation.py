"""What a speech request must pass before the first byte: pure checks that raise the domain's errors."""

from __future__ import annotations

from collections.abc import Mapping

from api.engine.base import Engine
from api.engine.scheduling.lifecycle import EngineState
from api.errors import InvalidRequestError, NotFoundError, ServiceUnavailableError
from api.protocol import MODEL_IDS, CaptionedSpeechRequest, SpeechRequest


def check_ready(state: EngineState, failure: str | None) -> None:
    """Raises ServiceUnavailableError while the model is loading or after it failed to load (`failure`)."""
    if state is EngineState.READY:
        return
    if state is EngineState.FAILED:
        raise ServiceUnavailableError(
            f"The model failed to load: {failure}", retry_after=60, code="model_unavailable"
        )
    raise ServiceUnavailableError("The model is still loading.", retry_after=5, code="model_loading")


def check_model(model: str) -> None:
    if model not in MODEL_IDS:
        raise NotFoundError(
            f"The model '{model}' does not exist. Available: {', '.join(MODEL_IDS)}.",
            param="model",
            code="model_not_found",
        )


def check_input(text: str, limit: int) -> None:
    """The input has something besides white space, and at most `limit` characters."""
    if not text.strip():
        raise InvalidRequestError("The input must contain text.", param="input", code="empty_input")
    if len(text) > limit:
        raise InvalidRequestError(
            f"The input is {len(text)} characters; the limit is {limit}.",
            param="input",
            code="string_too_long",
        )


def check_timestamps(request: SpeechRequest, engine: Engine) -> None:
    """Word timestamps need the engine's durations, and a response that can carry them."""
    if not engine.gives_durations:
        raise InvalidRequestError(
            f"Word timestamps need the model's durations, which the {engine.name} engine's model file "
            "does not give.",
            param="return_timestamps",
            code="timestamps_unavailable",
        )
    if request.stream_format != "sse" and not isinstance(request, CaptionedSpeechRequest):
        raise InvalidRequestError(
            "Word timestamps come with stream_format 'sse' here, or from /dev/captioned_speech.",
            param="return_timestamps",
            code="timestamps_need_sse",
        )


def check_phonemes(phonemes: str, vocab: Mapping[str, int]) -> None:
    """Every symbol of given phonemes is in the model's vocabulary (white space aside)."""
    unknown = sorted({symbol for symbol in phonemes if symbol not in vocab and not symbol.isspace()})
    if unknown:
        raise InvalidRequestError(
            f"Unknown phoneme symbols: {' '.join(unknown)}.", param="phonemes", code="invalid_phonemes"
        )
