"""The real OpenAI Python SDK against the real server."""

from __future__ import annotations

import io

import av
import pytest
from openai import OpenAI

from scripts.harness import Server


@pytest.fixture
def client(server: Server) -> OpenAI:
    return OpenAI(base_url=f"{server.url}/v1", api_key="not-needed", max_retries=0)


def seconds(data: bytes) -> float:
    with av.open(io.BytesIO(data)) as container:
        rate = container.streams.audio[0].sample_rate
        return sum(frame.samples for frame in container.decode(audio=0)) / rate


def test_create(client: OpenAI) -> None:
    response = client.audio.speech.create(model="tts-1", voice="alloy", input="Hello from the SDK.")
    assert seconds(response.content) > 0.5  # mp3 by default


def test_create_every_openai_voice(client: OpenAI) -> None:
    for voice in ("alloy", "ash", "ballad", "coral", "echo", "fable", "nova", "onyx", "sage", "shimmer"):
        response = client.audio.speech.create(
            model="gpt-4o-mini-tts", voice=voice, input="Hi.", response_format="pcm"
        )
        assert len(response.content) > 4800, voice


def test_streaming_response(client: OpenAI) -> None:
    pieces = []
    with client.audio.speech.with_streaming_response.create(
        model="tts-1-hd", voice="af_heart", input="One sentence. And another one.", response_format="wav"
    ) as response:
        assert response.headers["content-type"] == "audio/wav"
        pieces.extend(response.iter_bytes())
    assert seconds(b"".join(pieces)) > 1.0


def test_errors_surface_as_sdk_exceptions(client: OpenAI) -> None:
    import openai

    with pytest.raises(openai.BadRequestError) as info:
        client.audio.speech.create(model="tts-1", voice="nobody", input="Hi.")  # type: ignore[arg-type]
    assert "nobody" in str(info.value)
    with pytest.raises(openai.NotFoundError):
        client.audio.speech.create(model="tts-9", voice="alloy", input="Hi.")
