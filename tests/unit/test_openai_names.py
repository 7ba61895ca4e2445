"""OpenAI's newer names: the voices marin and cedar, dated model snapshots, `voice` as {"id": ...}."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from fastapi.testclient import TestClient
from openai import OpenAI

from api.protocol import OPENAI_VOICES, model_id
from api.server.app import create_app
from tests.fakes import FakeEngine, FakePhonemizer
from tests.unit.test_api import assert_error, make_settings, wait_ready

# Each voice its own constant pack, so the fake engine's tone tells them apart.
EXTRA_VOICES = ("af_kore", "am_fenrir")


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    settings = make_settings(tmp_path)
    for i, name in enumerate(EXTRA_VOICES):
        torch.save(torch.full((510, 1, 256), 0.05 + 0.3 * i), tmp_path / "voices" / f"{name}.pt")
    app = create_app(settings, engine=FakeEngine(), phonemizer=FakePhonemizer())  # type: ignore[arg-type]
    with TestClient(app) as client:
        wait_ready(client)
        yield client


def pcm(client: TestClient, **body: Any) -> bytes:
    request = {"model": "tts-1", "input": "Hello there.", "response_format": "pcm", **body}
    response = client.post("/v1/audio/speech", json=request)
    assert response.status_code == 200, response.text
    return response.content


@pytest.mark.parametrize(("openai", "kokoro"), [("marin", "af_kore"), ("cedar", "am_fenrir")])
def test_marin_and_cedar_speak_with_their_kokoro_voices(client: TestClient, openai: str, kokoro: str) -> None:
    assert OPENAI_VOICES[openai] == kokoro
    audio = pcm(client, voice=openai)
    assert audio == pcm(client, voice=kokoro)
    assert audio != pcm(client, voice="af_heart")


def test_marin_and_cedar_differ(client: TestClient) -> None:
    assert pcm(client, voice="marin") != pcm(client, voice="cedar")


@pytest.mark.parametrize(
    ("name", "model"),
    [
        ("gpt-4o-mini-tts-2025-03-20", "gpt-4o-mini-tts"),
        ("gpt-4o-mini-tts-2025-12-15", "gpt-4o-mini-tts"),
        ("tts-1-2024-02-29", "tts-1"),
        ("tts-1-hd-2025-01-31", "tts-1-hd"),
        ("tts-1-1106", "tts-1"),
        ("tts-1-hd-1106", "tts-1-hd"),
        ("tts-1", "tts-1"),
    ],
)
def test_dated_snapshots_are_their_model(client: TestClient, name: str, model: str) -> None:
    assert model_id(name) == model
    assert pcm(client, model=name) == pcm(client, model=model)
    card = client.get(f"/v1/models/{name}")
    assert card.status_code == 200, card.text
    assert card.json()["id"] == name


@pytest.mark.parametrize(
    "name",
    [
        "gpt-4o-mini-tts-2025-13-01",  # no 13th month
        "tts-1-2023-02-30",
        "tts-1-20250320",
        "gpt-4o-mini-tts-2025-03-20-x",
        "whisper-1-2025-03-20",
        "kokoro-2025-03-20",
        "tts-1-0101",
    ],
)
def test_other_dated_names_are_unknown_models(client: TestClient, name: str) -> None:
    assert model_id(name) == name
    response = client.post("/v1/audio/speech", json={"model": name, "input": "Hello.", "voice": "af_heart"})
    assert_error(response, 404, "model")
    assert_error(client.get(f"/v1/models/{name}"), 404, "model")
    assert client.get("/v1/models").json()["data"][0]["id"] == "kokoro"  # the list stays undated


@pytest.mark.parametrize("voice", ["af_bella", "shimmer", "marin", "af_bella(2)+af_sky(1)"])
def test_voice_object_is_its_id(client: TestClient, voice: str) -> None:
    assert pcm(client, voice={"id": voice}) == pcm(client, voice=voice)


def test_voice_object_on_the_other_endpoints(client: TestClient) -> None:
    captioned = [
        client.post(
            "/dev/captioned_speech",
            json={"input": "Hello there.", "voice": voice, "response_format": "pcm", "stream": False},
        )
        for voice in ({"id": "cedar"}, "cedar")
    ]
    assert all(response.status_code == 200 for response in captioned), captioned[0].text
    assert captioned[0].json() == captioned[1].json()
    generated = [
        client.post("/dev/generate_from_phonemes", json={"phonemes": "hello there", "voice": voice})
        for voice in ({"id": "marin"}, "marin")
    ]
    assert all(response.status_code == 200 for response in generated), generated[0].text
    assert generated[0].content == generated[1].content


@pytest.mark.parametrize(
    ("voice", "status"),
    [
        ({"id": "af_nobody"}, 400),  # looked up like a name
        ({"id": ""}, 400),
        ({"id": 7}, 400),
        ({"name": "af_bella"}, 400),
        ({"id": "af_bella", "extra": 1}, 400),
    ],
)
def test_bad_voice_objects_are_400_on_voice(client: TestClient, voice: object, status: int) -> None:
    response = client.post("/v1/audio/speech", json={"input": "Hello.", "voice": voice})
    assert_error(response, status, "voice")


def test_openapi_documents_the_voice_object(client: TestClient) -> None:
    schemas = client.get("/openapi.json").json()["components"]["schemas"]
    voice = schemas["SpeechRequest"]["properties"]["voice"]
    refs = {option.get("$ref") for option in voice["anyOf"]}
    assert "#/components/schemas/VoiceRef" in refs
    assert schemas["VoiceRef"]["required"] == ["id"]


def test_openai_sdk_sends_a_voice_object_and_a_snapshot(client: TestClient) -> None:
    sdk = OpenAI(base_url="http://testserver/v1", api_key="unused", http_client=client, max_retries=0)
    response = sdk.audio.speech.create(
        model="gpt-4o-mini-tts-2025-12-15", voice={"id": "cedar"}, input="Hello there.", response_format="pcm"
    )
    assert response.content == pcm(client, voice="am_fenrir")
