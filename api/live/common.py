"""What the vendor adapters share: reading a JSON message, and query errors in the server's one shape."""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from api.errors import InvalidRequestError
from api.live.transport import Frame
from api.protocol import SpeechRequest


def json_message(frame: Frame) -> dict[str, Any]:
    """A client's message as a JSON object; InvalidRequestError for anything else."""
    text = frame.text
    if text is None:
        raise InvalidRequestError("Send messages as JSON text frames.", code="invalid_event")
    try:
        body = json.loads(text)
    except ValueError:
        raise InvalidRequestError("A message must be a JSON object.", code="invalid_event") from None
    if not isinstance(body, dict):
        raise InvalidRequestError("A message must be a JSON object.", code="invalid_event")
    return body


def invalid_parameters(exc: ValidationError) -> InvalidRequestError:
    """The first problem of a query or message that failed validation, naming the parameter."""
    first = exc.errors()[0]
    where = ".".join(str(part) for part in first["loc"])
    return InvalidRequestError(
        f"Invalid {where or 'request'}: {first['msg']}.", param=where or None, code="invalid_parameter"
    )


def speech_request(**fields: Any) -> SpeechRequest:
    """A SpeechRequest of a vendor's fields; what it refuses (an empty text) is a 400 naming the field."""
    try:
        return SpeechRequest(**fields)
    except ValidationError as exc:
        raise invalid_parameters(exc) from None
