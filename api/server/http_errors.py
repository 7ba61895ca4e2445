"""The one error shape over HTTP ({"error": {message, type, param, code}}): the domain errors of api/errors.py
rendered with their status from its one table, and the handlers that turn every failure into that shape."""

from __future__ import annotations

import errno
import logging
import sqlite3
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match, Route

from api.errors import APIError, InvalidRequestError, NotFoundError, StatusError, kind_of

logger = logging.getLogger(__name__)


def error_body(message: str, error_type: str, param: str | None, code: str | None) -> dict[str, Any]:
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


def error_response(error: APIError) -> JSONResponse:
    kind = kind_of(error)
    body = error_body(error.message, kind.type, error.param, error.code)
    return JSONResponse(body, status_code=kind.status, headers=error.headers())


def validation_error(exc: RequestValidationError) -> InvalidRequestError:
    first = exc.errors()[0] if exc.errors() else {}
    # loc is ("body", "speed") for a field; ("body", 7) for unparsable JSON (7 = the position).
    loc = [str(part) for part in first.get("loc", ()) if part != "body"]
    param = None if first.get("type") == "json_invalid" else ".".join(loc) or None
    message = first.get("msg", "Invalid request")
    if first.get("type") == "json_invalid":
        message = f"The request body is not valid JSON: {first.get('ctx', {}).get('error', message)}"
    if param:
        message = f"Invalid value for '{param}': {message}"
    return InvalidRequestError(message, param=param, code=first.get("type", "invalid_value"))


# A write refused because the volume is full (or over quota), as the OS or SQLite says it.
NO_SPACE_ERRNOS = {errno.ENOSPC, errno.EDQUOT}
SQLITE_WRITE_FAILURES = ("database or disk is full", "disk I/O error")
INSUFFICIENT_STORAGE = 507


def out_of_space(exc: BaseException) -> bool:
    """A failure that comes from the data volume refusing writes (full, over quota, or failing): the
    error itself or one it was raised from."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in NO_SPACE_ERRNOS:
            return True
        if isinstance(seen, sqlite3.OperationalError) and any(
            text in str(seen) for text in SQLITE_WRITE_FAILURES
        ):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def storage_error() -> StatusError:
    message = (
        "The server could not write to its data volume (full, or failing): book jobs and voice uploads "
        "wait until space is free again; speech is not affected."
    )
    return StatusError(message, status=INSUFFICIENT_STORAGE, code="insufficient_storage")


# Codes for the statuses raised as HTTPExceptions (by routing and the limits middleware).
HTTP_CODES = {405: "method_not_allowed", 408: "timeout", 413: "request_too_large"}


def _http_error(exc: StarletteHTTPException) -> APIError:
    if exc.status_code == 404:
        return NotFoundError(str(exc.detail), code="not_found")
    return StatusError(str(exc.detail), status=exc.status_code, code=HTTP_CODES.get(exc.status_code))


def allowed_methods(request: Request) -> list[str]:
    """Every method some route takes at this path: Starlette's 405 names only the first route's, and a path
    may have several (GET and POST /v1/audio/voices)."""
    methods: set[str] = set()
    for route in request.app.routes:
        if isinstance(route, Route) and route.methods and route.matches(request.scope)[0] is not Match.NONE:
            methods |= route.methods
    return sorted(methods)


def install_error_handlers(app: FastAPI) -> None:
    async def on_api_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, APIError)
        return error_response(exc)

    async def on_validation_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return error_response(validation_error(exc))

    async def on_http_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        response = error_response(_http_error(exc))
        response.headers.update(exc.headers or {})  # e.g. a 405's Allow
        if exc.status_code == 405:
            response.headers["Allow"] = ", ".join(allowed_methods(request))
        return response

    async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
        if out_of_space(exc):
            logger.error("%s %s: the data volume refused a write: %s", request.method, request.url.path, exc)
            return error_response(storage_error())
        logger.exception("unhandled error on %s %s", request.method, request.url.path)
        return error_response(APIError("The server failed to process the request.", code="internal_error"))

    async def on_os_error(request: Request, exc: Exception) -> JSONResponse:
        # Handled here, not only by on_unexpected: Starlette re-raises what reaches the Exception handler
        # after answering, and uvicorn then drops the connection that a client keeps alive.
        return await on_unexpected(request, exc)

    app.add_exception_handler(APIError, on_api_error)
    app.add_exception_handler(OSError, on_os_error)
    app.add_exception_handler(sqlite3.Error, on_os_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(Exception, on_unexpected)
