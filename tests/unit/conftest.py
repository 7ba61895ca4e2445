"""Fixtures the unit test modules share."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from tests.unit.test_api import wait_ready

StartClient = Callable[[FastAPI], TestClient]


@pytest.fixture
def start_client() -> Iterator[StartClient]:
    """Start an app's TestClient (lifespan entered, /ready awaited); each is closed after the test."""
    with contextlib.ExitStack() as stack:

        def start(app: FastAPI) -> TestClient:
            client = stack.enter_context(TestClient(app))
            wait_ready(client)
            return client

        yield start
