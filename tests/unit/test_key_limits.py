"""Per-key limits: the pure decision over a key's state and the clock, the middleware over a bare ASGI app
with requests held open, and the server's 429 in OpenAI's shape."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.types import Receive, Scope, Send

from api.server.app import create_app, key_policy
from api.server.key_limits import (
    KeyLimitMiddleware,
    KeyPolicy,
    decide,
    default_share,
    finish,
    fresh_state,
)
from tests.fakes import FakeEngine, FakePhonemizer
from tests.unit.conftest import StartClient
from tests.unit.test_api import make_settings
from tests.unit.test_security import SPEECH


@pytest.fixture
def make_client(tmp_path: Path, start_client: StartClient) -> Any:
    def make(**settings: Any) -> Any:
        engine, phonemizer = FakeEngine(), FakePhonemizer()
        return start_client(
            create_app(make_settings(tmp_path, **settings), engine=engine, phonemizer=phonemizer)
        )  # type: ignore[arg-type]

    return make


def test_a_key_at_its_share_is_refused_until_one_of_its_requests_ends() -> None:
    policy = KeyPolicy(max_inflight=2)
    state = fresh_state(policy, 0.0)
    for _ in range(2):
        state, refusal = decide(policy, state, 0.0, 3.2)
        assert refusal is None
    full, refusal = decide(policy, state, 0.0, 3.2)
    assert refusal is not None
    assert (refusal.reason, refusal.retry_after, full.inflight) == ("concurrency", 4, 2)
    state, refusal = decide(policy, finish(full), 1.0, 3.2)
    assert refusal is None
    assert state.inflight == 2


def test_a_rate_allows_its_burst_then_refills_with_the_clock() -> None:
    policy = KeyPolicy(max_inflight=None, rate_per_s=0.5, burst=3)  # 30 a minute, 3 at once
    state = fresh_state(policy, 0.0)
    for _ in range(3):
        state, refusal = decide(policy, finish(state), 0.0, 1.0)
        assert refusal is None
    state, refusal = decide(policy, finish(state), 0.0, 1.0)
    assert refusal is not None
    assert (refusal.reason, refusal.retry_after) == ("rate", 2)  # one token takes 2 s at 0.5 a second
    assert "30 speech requests a minute" in refusal.message
    _, refusal = decide(policy, state, 1.0, 1.0)
    assert refusal is not None
    assert refusal.retry_after == 1
    state, refusal = decide(policy, state, 2.0, 1.0)
    assert refusal is None
    # The bucket never holds more than its burst, however long the key was quiet.
    state, _ = decide(policy, finish(state), 1000.0, 1.0)
    assert state.tokens == 2


def test_a_refusal_takes_nothing() -> None:
    policy = KeyPolicy(max_inflight=1, rate_per_s=1.0, burst=1)
    state, _ = decide(policy, fresh_state(policy, 0.0), 0.0, 1.0)
    refused, refusal = decide(policy, state, 0.5, 1.0)
    assert refusal is not None
    assert (refused.inflight, refused.tokens) == (1, 0.5)


def test_the_default_share_divides_the_slots_among_two_or_more_keys() -> None:
    assert default_share(4, 1) is None
    assert default_share(4, 0) is None
    assert default_share(4, 2) == 2
    assert default_share(4, 3) == 1
    assert default_share(4, 9) == 1


def test_a_policy_refuses_nonsense() -> None:
    with pytest.raises(ValueError, match="max_inflight"):
        KeyPolicy(max_inflight=0)
    with pytest.raises(ValueError, match="burst"):
        KeyPolicy(max_inflight=None, rate_per_s=1.0, burst=0.5)
    assert not KeyPolicy(max_inflight=None).bounded


class HeldApp:
    """A speech endpoint whose responses wait for `release`."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.started = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.started += 1
        await self.release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"audio"})


class Labelled:
    """Stands in for ApiKeyMiddleware: the key's label from a header."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        for name, value in scope["headers"]:
            if name == b"x-label":
                scope.setdefault("state", {})["api_key"] = value.decode()
        await self.app(scope, receive, send)


def test_one_key_at_its_share_leaves_the_others_their_slots() -> None:
    asyncio.run(one_key_at_its_share())


async def one_key_at_its_share() -> None:
    inner = HeldApp()
    policy = KeyPolicy(max_inflight=2)
    app = Labelled(KeyLimitMiddleware(inner, policy, {"/v1/audio/speech"}, lambda: 2.5, hold_s=0.2))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:

        def post(label: str, path: str = "/v1/audio/speech") -> Any:
            return asyncio.ensure_future(client.post(path, headers={"x-label": label}))

        held = [post("alice"), post("alice")]
        while inner.started < 2:
            await asyncio.sleep(0)
        asked = time.monotonic()
        refused = await client.post("/v1/audio/speech", headers={"x-label": "alice"})
        assert time.monotonic() - asked >= 0.2  # held: a loop on its 429s cannot spin
        assert refused.status_code == 429
        assert refused.headers["retry-after"] == "3"
        assert refused.json()["error"]["code"] == "rate_limit_exceeded"
        assert inner.started == 2  # refused before it reached the app
        others = [post("bob"), post("bob"), post("alice", "/v1/models"), post("")]
        while inner.started < 6:
            await asyncio.sleep(0)
        inner.release.set()
        assert [(await answer).status_code for answer in [*held, *others]] == [200] * 6
        again = await client.post("/v1/audio/speech", headers={"x-label": "alice"})
        assert again.status_code == 200


def test_a_key_over_its_rate_gets_openais_429_and_the_other_key_is_served(make_client: Any) -> None:
    client = make_client(api_keys="alice:sk-a,bob:sk-b", key_rate_per_minute=6, key_rate_burst=1)
    alice = {"Authorization": "Bearer sk-a"}
    assert client.post("/v1/audio/speech", json=SPEECH, headers=alice).status_code == 200
    refused = client.post("/v1/audio/speech", json=SPEECH, headers=alice)
    assert refused.status_code == 429
    assert refused.json() == {
        "error": {
            "message": "This API key is over its rate of 6 speech requests a minute on this server.",
            "type": "requests",
            "param": None,
            "code": "rate_limit_exceeded",
        }
    }
    assert 1 <= int(refused.headers["retry-after"]) <= 10
    bob = {"Authorization": "Bearer sk-b"}
    assert client.post("/v1/audio/speech", json=SPEECH, headers=bob).status_code == 200
    assert client.get("/v1/audio/voices", headers=alice).status_code == 200  # only speech is limited
    metrics = client.get("/metrics").text
    assert 'kokoro_requests_key_limited_total{key="alice",reason="rate"} 1.0' in metrics
    assert 'kokoro_requests_by_key_total{key="alice",status="429"} 1.0' in metrics


def test_keyless_servers_ignore_the_key_limits(make_client: Any) -> None:
    client = make_client(key_rate_per_minute=1, key_rate_burst=1)
    assert [client.post("/v1/audio/speech", json=SPEECH).status_code for _ in range(3)] == [200] * 3


def test_the_policy_follows_the_settings(tmp_path: Path) -> None:
    assert key_policy(make_settings(tmp_path, max_inflight=6), 2) == KeyPolicy(3, 0.0, 1.0)
    assert key_policy(make_settings(tmp_path), 1).max_inflight is None
    assert key_policy(make_settings(tmp_path, key_max_inflight=0), 3).max_inflight is None
    limited = key_policy(make_settings(tmp_path, key_max_inflight=5, key_rate_per_minute=120), 2)
    assert limited == KeyPolicy(5, 2.0, 20.0)
