"""A write the data volume refuses (full, over quota, failing) is answered 507 `insufficient_storage` in
OpenAI's shape, not 500 (the soak's disk fault found the 500s: book jobs and voice uploads on a full
volume); any other unexpected failure stays a 500."""

from __future__ import annotations

import errno
import sqlite3

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from api.server.http_errors import install_error_handlers, out_of_space


def raising(error: Exception) -> TestClient:
    app = FastAPI()
    install_error_handlers(app)

    @app.post("/write")
    async def write() -> None:
        raise error

    return TestClient(app, raise_server_exceptions=False)


def chained(outer: Exception, inner: Exception) -> Exception:
    try:
        try:
            raise inner
        except Exception as exc:
            raise outer from exc
    except Exception as exc:
        return exc


@pytest.mark.parametrize(
    "error",
    [
        OSError(errno.ENOSPC, "No space left on device"),
        OSError(errno.EDQUOT, "Disk quota exceeded"),
        sqlite3.OperationalError("database or disk is full"),
        sqlite3.OperationalError("disk I/O error"),
        chained(RuntimeError("could not save the voice"), OSError(errno.ENOSPC, "No space left on device")),
    ],
)
def test_a_refused_write_is_a_507(error: Exception) -> None:
    response = raising(error).post("/write")
    assert response.status_code == 507
    body = response.json()["error"]
    assert body["code"] == "insufficient_storage"
    assert body["type"] == "server_error"
    assert "speech is not affected" in body["message"]


@pytest.mark.parametrize(
    "error",
    [
        RuntimeError("a bug"),
        OSError(errno.EACCES, "Permission denied"),
        sqlite3.OperationalError("no such table"),
    ],
)
def test_other_failures_stay_500(error: Exception) -> None:
    assert not out_of_space(error)
    response = raising(error).post("/write")
    assert response.status_code == 500
    assert response.json()["error"]["code"] == "internal_error"
