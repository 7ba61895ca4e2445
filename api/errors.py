"""The errors every layer raises, as domain exceptions: what went wrong, never how a transport says it.

Each kind maps to one OpenAI error type and status in `KINDS`, the one table: the HTTP layer
(api/server/http_errors.py) and the live protocols (api/live/) read it, and nothing below them knows about
statuses. This module imports nothing but the standard library, so every layer may raise these.
"""

from __future__ import annotations

from dataclasses import dataclass


class APIError(Exception):
    """An error the client sees: a message, and which parameter and code it is about."""

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code

    def headers(self) -> dict[str, str]:
        return {}


class InvalidRequestError(APIError):
    """The input cannot be used as given."""


class ForbiddenError(APIError):
    """The input is valid but not allowed (a built-in voice cannot be deleted)."""


class NotFoundError(APIError):
    """What the input names does not exist."""


class ConflictError(APIError):
    """The resource is not in the state the request needs (a book job's audio before it is done)."""


class SynthesisError(APIError):
    """The engine failed on valid input."""


class ServiceUnavailableError(APIError):
    """No capacity now; try again in `retry_after` seconds."""

    def __init__(self, message: str, *, retry_after: int, code: str | None = "overloaded") -> None:
        super().__init__(message, code=code)
        self.retry_after = max(1, retry_after)

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after)}


class StatusError(APIError):
    """An error that carries its own status: routing's 405, the limits middleware's 408 and 413."""

    def __init__(self, message: str, *, status: int, code: str | None = None) -> None:
        super().__init__(message, code=code)
        self.status = status


@dataclass(frozen=True)
class Kind:
    status: int
    type: str  # OpenAI's error `type`


INVALID = "invalid_request_error"
SERVER = "server_error"

# The one exception -> status map, most specific first: an error takes the first kind it is an instance of.
KINDS: dict[type[APIError], Kind] = {
    InvalidRequestError: Kind(400, INVALID),
    ForbiddenError: Kind(403, INVALID),
    NotFoundError: Kind(404, INVALID),
    ConflictError: Kind(409, INVALID),
    SynthesisError: Kind(500, SERVER),
    ServiceUnavailableError: Kind(503, SERVER),
    APIError: Kind(500, SERVER),
}


def kind_of(error: APIError) -> Kind:
    if isinstance(error, StatusError):
        return Kind(error.status, INVALID if error.status < 500 else SERVER)
    return next(kind for cls, kind in KINDS.items() if isinstance(error, cls))
