"""The HTTP layer over a fake engine and phonemizer: shapes, statuses, formats, errors."""

from __future__ import annotations

import base64
import io
import json
import time
from collections.abc import Iterator
from pathlib import Path

import av
import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient
from pydantic import TypeAdapter

from api.engine.base import KernelStatus
from api.protocol import SpeechAudioDelta, SpeechAudioDone, SpeechStreamEvent
from api.server.app import create_app
from api.settings import Settings
from tests.fakes import FakeEngine, FakePhonemizer, shipped_vocab

VOICES = ("af_heart", "af_bella", "af_sky", "am_adam", "bf_emma", "af_alloy", "ef_dora", "jf_alpha")
FORMATS = ("mp3", "opus", "aac", "flac", "wav", "pcm")
CONTENT_TYPES = {
    "mp3": "audio/mpeg",
    "opus": "audio/ogg",
    "aac": "audio/aac",
    "flac": "audio/flac",
    "wav": "audio/wav",
    "pcm": "audio/pcm",
}


def make_settings(tmp_path: Path, **overrides: object) -> Settings:
    voices = tmp_path / "voices"
    voices.mkdir(exist_ok=True)
    for i, name in enumerate(VOICES):
        torch.save(torch.full((510, 1, 256), 0.1 * (i + 1)), voices / f"{name}.pt")
    overrides.setdefault("data_dir", tmp_path / "data")
    return Settings(weights_dir=tmp_path, fetch_weights=False, **overrides)  # type: ignore[arg-type]


def wait_ready(client: TestClient) -> None:
    deadline = time.monotonic() + 10
    while client.get("/ready").status_code != 200 and time.monotonic() < deadline:
        time.sleep(0.01)


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine()


@pytest.fixture
def client(tmp_path: Path, engine: FakeEngine) -> Iterator[TestClient]:
    app = create_app(make_settings(tmp_path), engine=engine, phonemizer=FakePhonemizer())  # type: ignore[arg-type]
    with TestClient(app) as client:
        wait_ready(client)
        yield client


def speak(client: TestClient, **body: object) -> object:
    return client.post("/v1/audio/speech", json={"model": "tts-1", "input": "Hello there.", **body})


def decoded_seconds(data: bytes) -> float:
    with av.open(io.BytesIO(data)) as container:
        samples = sum(frame.samples for frame in container.decode(audio=0))
        return samples / container.streams.audio[0].sample_rate


def assert_error(response: object, status: int, param: str | None) -> dict[str, object]:
    assert response.status_code == status, response.text  # type: ignore[attr-defined]
    body = response.json()  # type: ignore[attr-defined]
    assert set(body) == {"error"}
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param
    assert error["message"]
    return error  # type: ignore[no-any-return]


def test_health_and_ready(client: TestClient) -> None:
    assert client.get("/health").json() == {"status": "ok"}
    assert client.get("/ready").json()["status"] == "ready"


def test_not_ready_while_loading(tmp_path: Path) -> None:
    app = create_app(make_settings(tmp_path), engine=FakeEngine(load_delay=1.0), phonemizer=FakePhonemizer())  # type: ignore[arg-type]
    with TestClient(app) as client:
        assert client.get("/health").status_code == 200
        ready = client.get("/ready")
        assert ready.status_code == 503
        response = speak(client)
        assert_error(response, 503, None)
        assert int(response.headers["Retry-After"]) >= 1  # type: ignore[attr-defined]
        wait_ready(client)
        assert speak(client).status_code == 200  # type: ignore[attr-defined]


def test_ready_says_what_the_start_is_doing(tmp_path: Path) -> None:
    """While the model loads, /ready's body names the stage (503); once ready it has none, and an engine
    without compiled kernels reports no `kernels`."""
    app = create_app(make_settings(tmp_path), engine=FakeEngine(load_delay=1.0), phonemizer=FakePhonemizer())  # type: ignore[arg-type]
    with TestClient(app) as client:
        starting = client.get("/ready")
        assert starting.status_code == 503
        assert "loading the model" in starting.json()["stage"]
        wait_ready(client)
        body = client.get("/ready").json()
        assert "stage" not in body or body["stage"] is None
        assert body.get("kernels") is None


class CompilingFakeEngine(FakeEngine):
    """A fake engine whose kernels compile in the background: 3 in use, 2 still compiling."""

    def kernel_status(self) -> KernelStatus:
        return KernelStatus("compiling", compiled=3, pending=2, seconds=12.5)


def test_ready_tells_how_far_the_background_compile_is(tmp_path: Path) -> None:
    """Ready (200) while the kernels compile in the background, and /ready says how far it is."""
    app = create_app(make_settings(tmp_path), engine=CompilingFakeEngine(), phonemizer=FakePhonemizer())  # type: ignore[arg-type]
    with TestClient(app) as client:
        wait_ready(client)
        ready = client.get("/ready")
        assert ready.status_code == 200
        kernels = ready.json()["kernels"]
        assert kernels == {"state": "compiling", "compiled": 3, "compiling": 2, "failed": 0, "seconds": 12.5}


def test_models(client: TestClient) -> None:
    listing = client.get("/v1/models").json()
    assert listing["object"] == "list"
    assert {m["id"] for m in listing["data"]} == {"kokoro", "tts-1", "tts-1-hd", "gpt-4o-mini-tts"}
    assert all(m["object"] == "model" and m["owned_by"] and m["created"] for m in listing["data"])
    assert client.get("/v1/models/tts-1").json()["id"] == "tts-1"
    assert_error(client.get("/v1/models/whisper-1"), 404, "model")


def test_voices(client: TestClient) -> None:
    voices = client.get("/v1/audio/voices").json()["voices"]
    assert [v["id"] for v in voices] == sorted(VOICES)
    assert all(v["name"] == v["id"] for v in voices)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("stream", [True, False])
def test_every_format_streaming_and_not(client: TestClient, fmt: str, stream: bool) -> None:
    text = "Hello there. This is a test of the emergency broadcast system."
    response = speak(client, input=text, response_format=fmt, stream=stream)
    assert response.status_code == 200  # type: ignore[attr-defined]
    assert response.headers["content-type"] == CONTENT_TYPES[fmt]  # type: ignore[attr-defined]
    data = response.content  # type: ignore[attr-defined]
    if stream:
        assert "content-length" not in response.headers  # type: ignore[attr-defined]
    else:
        assert int(response.headers["content-length"]) == len(data)  # type: ignore[attr-defined]
    reference = speak(client, input=text, response_format="pcm", stream=False).content  # type: ignore[attr-defined]
    expected = len(reference) / 2 / 24000
    assert expected > 2.5  # about 61 tokens of 50 ms each, plus the pause after the sentence
    seconds = len(data) / 2 / 24000 if fmt == "pcm" else decoded_seconds(data)
    assert seconds == pytest.approx(expected, abs=0.13)


def test_default_format_is_mp3(client: TestClient) -> None:
    response = client.post("/v1/audio/speech", json={"input": "Hi.", "voice": "af_heart"})
    assert response.headers["content-type"] == "audio/mpeg"


def test_speed_shortens_audio(client: TestClient) -> None:
    slow = speak(client, response_format="pcm", speed=0.5).content  # type: ignore[attr-defined]
    fast = speak(client, response_format="pcm", speed=2.0).content  # type: ignore[attr-defined]
    assert len(slow) == pytest.approx(4 * len(fast), rel=0.01)


def test_sse_events(client: TestClient) -> None:
    response = speak(client, response_format="pcm", stream_format="sse", input="One. Two. Three.")
    assert response.headers["content-type"].startswith("text/event-stream")  # type: ignore[attr-defined]
    events = [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: ")]  # type: ignore[attr-defined]
    assert [e["type"] for e in events[:-1]] == ["speech.audio.delta"] * (len(events) - 1)
    assert len(events) >= 2
    audio = b"".join(base64.b64decode(e["audio"]) for e in events[:-1])
    done = events[-1]
    assert done["type"] == "speech.audio.done"
    usage = done["usage"]
    assert usage["input_tokens"] > 0
    assert usage["output_tokens"] > 0
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    assert usage["output_tokens"] == len(audio) // 2 // 600
    # Every event is one of the protocol's event models, and written as it always was (json.dumps' spacing,
    # no "timestamps" key unless asked).
    data = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]  # type: ignore[attr-defined]
    events_adapter = TypeAdapter(SpeechStreamEvent)
    parsed = [events_adapter.validate_json(line) for line in data]
    assert [type(event) for event in parsed] == [SpeechAudioDelta] * (len(parsed) - 1) + [SpeechAudioDone]
    assert data[0].startswith('{"type": "speech.audio.delta", "audio": "')
    assert all("timestamps" not in event for event in events[:-1])


def test_the_openapi_document_describes_the_sse_events(client: TestClient) -> None:
    document = client.get("/openapi.json").json()
    stream = document["paths"]["/v1/audio/speech"]["post"]["responses"]["200"]["content"]["text/event-stream"]
    refs = [choice["$ref"] for choice in stream["schema"]["properties"]["data"]["contentSchema"]["oneOf"]]
    assert refs == ["#/components/schemas/SpeechAudioDelta", "#/components/schemas/SpeechAudioDone"]
    schemas = document["components"]["schemas"]
    assert schemas["SpeechAudioDelta"]["properties"]["type"]["const"] == "speech.audio.delta"
    assert schemas["SpeechAudioDone"]["properties"]["usage"]["$ref"] == "#/components/schemas/Usage"
    assert "WordTimestamp" in schemas
    assert "Usage" in schemas


def test_the_openapi_document_states_the_limits_the_server_enforces(client: TestClient) -> None:
    """A request that fits the document is not refused for its language, its phonemes or its length (the
    fuzzer's positive checks rely on it), and one outside them is."""
    import re

    from api.text.phonemize import LANGUAGES

    schemas = client.get("/openapi.json").json()["components"]["schemas"]
    limit = client.app.state.settings.max_input_chars  # type: ignore[attr-defined]
    for model, field in (
        ("SpeechRequest", "input"),
        ("PhonemeRequest", "text"),
        ("PhonemesRequest", "phonemes"),
    ):
        assert schemas[model]["properties"][field]["maxLength"] == limit
    languages = schemas["PhonemeRequest"]["properties"]["language"]["enum"]
    assert sorted(languages) == sorted([*LANGUAGES, *(code.upper() for code in LANGUAGES)])
    for language in (code for code in languages if code.lower() in FakePhonemizer.languages):
        response = client.post("/dev/phonemize", json={"text": "hello", "language": language})
        assert response.status_code == 200, (language, response.json())
    refused = client.post("/dev/phonemize", json={"text": "hello", "language": "q"})
    assert assert_error(refused, 400, "language")["code"] == "unsupported_language"
    pattern = re.compile(schemas["PhonemesRequest"]["properties"]["phonemes"]["pattern"])
    vocab = "".join(symbol for symbol in shipped_vocab() if not symbol.isspace())
    every_symbol = " ".join(vocab[i : i + 5] for i in range(0, len(vocab), 5))
    assert pattern.fullmatch(every_symbol)
    spoken = client.post(
        "/dev/generate_from_phonemes", json={"phonemes": every_symbol[:limit], "stream": False}
    )
    assert spoken.status_code == 200, spoken.json()
    for outside in ("həlˈO #", "   ", "həlˈO\u0301"):
        assert not pattern.fullmatch(outside)
        assert client.post("/dev/generate_from_phonemes", json={"phonemes": outside}).status_code == 400


def test_openai_voice_names_and_mixes(client: TestClient, engine: FakeEngine) -> None:
    assert speak(client, voice="alloy").status_code == 200  # type: ignore[attr-defined]
    assert speak(client, voice="af_bella(2)+af_sky(1)", response_format="pcm").status_code == 200  # type: ignore[attr-defined]
    # af_bella holds 0.2 and af_sky 0.3 in every cell: the mix is (2 * 0.2 + 0.3) / 3.
    assert float(engine.calls[-1].style[0]) == pytest.approx((2 * 0.2 + 0.3) / 3, abs=1e-6)


def test_voice_prefix_picks_the_language(client: TestClient) -> None:
    assert speak(client, voice="ef_dora").status_code == 200  # type: ignore[attr-defined]
    error = assert_error(speak(client, voice="jf_alpha"), 400, "lang_code")
    assert "j" in str(error["message"])


def test_unknown_voice(client: TestClient) -> None:
    error = assert_error(speak(client, voice="af_nobody"), 400, "voice")
    assert "af_nobody" in str(error["message"])
    assert "af_bella" in str(error["message"])


@pytest.mark.parametrize("voice", ["../../etc/passwd", "/etc/passwd", "..\\x", "voices/af_heart"])
def test_voice_paths_never_reach_the_filesystem(client: TestClient, voice: str) -> None:
    assert_error(speak(client, voice=voice), 400, "voice")


@pytest.mark.parametrize("speed", [0.1, 4.5, "fast"])
def test_bad_speed(client: TestClient, speed: object) -> None:
    assert_error(speak(client, speed=speed), 400, "speed")


def test_bad_format(client: TestClient) -> None:
    error = assert_error(speak(client, response_format="ogg"), 400, "response_format")
    assert "mp3" in str(error["message"])


def test_bad_stream_format(client: TestClient) -> None:
    assert_error(speak(client, stream_format="chunks"), 400, "stream_format")


@pytest.mark.parametrize("text", ["", "   \n "])
def test_empty_input(client: TestClient, text: str) -> None:
    assert_error(speak(client, input=text), 400, "input")


def test_missing_input(client: TestClient) -> None:
    assert_error(client.post("/v1/audio/speech", json={"model": "tts-1"}), 400, "input")


def test_input_over_the_limit(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, max_input_chars=50)
    app = create_app(settings, engine=FakeEngine(), phonemizer=FakePhonemizer())  # type: ignore[arg-type]
    with TestClient(app) as client:
        wait_ready(client)
        error = assert_error(speak(client, input="x" * 51), 400, "input")
        assert "50" in str(error["message"])
        assert speak(client, input="x" * 50).status_code == 200  # type: ignore[attr-defined]


def test_nothing_to_speak(client: TestClient) -> None:
    assert_error(speak(client, input="🙂🙂🙂"), 400, "input")


def test_invalid_json(client: TestClient) -> None:
    headers = {"content-type": "application/json"}
    response = client.post("/v1/audio/speech", content=b"{not json", headers=headers)
    assert_error(response, 400, None)


def test_unknown_model(client: TestClient) -> None:
    assert_error(speak(client, model="whisper-1"), 404, "model")


def test_instructions_are_accepted(client: TestClient) -> None:
    assert speak(client, instructions="Speak like a pirate.").status_code == 200  # type: ignore[attr-defined]


def test_unknown_path_and_method(client: TestClient) -> None:
    assert_error(client.get("/v1/nothing"), 404, None)
    response = client.get("/v1/audio/speech")
    assert response.status_code == 405
    assert set(response.json()["error"]) == {"message", "type", "param", "code"}


def test_engine_failure_non_streaming_is_a_500(tmp_path: Path) -> None:
    engine = FakeEngine(fail_token=FakePhonemizer().vocab["z"])
    app = create_app(make_settings(tmp_path), engine=engine, phonemizer=FakePhonemizer())  # type: ignore[arg-type]
    with TestClient(app, raise_server_exceptions=False) as client:
        wait_ready(client)
        error = assert_error(speak(client, input="Zebra.", stream=False), 500, None)
        assert error["type"] == "server_error"
        # Failing on the first chunk of a stream still gets a status, since no byte has gone out.
        assert_error(speak(client, input="Zebra.", stream=True), 500, None)


def test_engine_failure_mid_stream_aborts_the_stream(tmp_path: Path) -> None:
    engine = FakeEngine(fail_token=FakePhonemizer().vocab["z"])
    app = create_app(
        make_settings(
            tmp_path, first_chunk_tokens=3, chunk_min_tokens=5, chunk_max_tokens=10, chunk_hard_max_tokens=20
        ),
        engine=engine,  # type: ignore[arg-type]
        phonemizer=FakePhonemizer(),
    )
    text = "Fine words. More fine words. Even more. Zebra zone. After."
    with TestClient(app, raise_server_exceptions=True) as client:
        wait_ready(client)
        received = bytearray()

        def read_stream() -> None:
            body = {"input": text, "response_format": "pcm"}
            with client.stream("POST", "/v1/audio/speech", json=body) as response:
                assert response.status_code == 200
                for data in response.iter_bytes():
                    received.extend(data)

        with pytest.raises(Exception, match="response already started|fake engine failure"):
            read_stream()
        # Audio before the failing chunk arrived; the stream then broke instead of ending cleanly.
        assert 0 < len(received) < 2 * 1200 * len(text)


def test_streams_are_deterministic_with_lossless_formats(client: TestClient) -> None:
    a = speak(client, response_format="flac", stream=True).content  # type: ignore[attr-defined]
    b = speak(client, response_format="flac", stream=False).content  # type: ignore[attr-defined]
    assert _pcm(a) == _pcm(b)


def _pcm(data: bytes) -> bytes:
    with av.open(io.BytesIO(data)) as container:
        return b"".join(np.asarray(frame.to_ndarray()).tobytes() for frame in container.decode(audio=0))
