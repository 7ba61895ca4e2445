"""Speech markup over HTTP and in parts: voice tags, SSML through the service, the lexicon, the phoneme
endpoints (fake engine; the real G2P where phonemes matter)."""

from __future__ import annotations

import io
import json
import wave
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from api.audio.joins import MARGIN_S
from api.server.app import create_app
from api.text.lexicon import Lexicon, LexiconError
from api.text.markup import Part, read_script
from api.text.tracked import Tracked
from tests.fakes import FakeEngine, FakePhonemizer
from tests.unit.test_api import make_settings, wait_ready


def script(text: str, **options: Any) -> list[tuple[str, str | None, float]]:
    settings = {"input_format": "auto", "voice_tags": True, "ssml": True, **options}
    read = read_script(text, **settings)
    return [(read.text[part.start : part.end].strip(), part.voice, part.rate) for part in read.parts]


def test_voice_tags_switch_the_speaker_for_what_follows() -> None:
    text = "Hi. [voice:am_adam] Hello there. [voice: af_bella(2)+af_sky(1) ] Bye. [voice:] Back."
    assert script(text) == [
        ("Hi.", None, 1.0),
        ("Hello there.", "am_adam", 1.0),
        ("Bye.", "af_bella(2)+af_sky(1)", 1.0),
        ("Back.", None, 1.0),
    ]


def test_voice_tags_off_leave_the_text_alone() -> None:
    text = "Hi [voice:am_adam] there"
    assert script(text, voice_tags=False) == [(text, None, 1.0)]


def test_ssml_is_detected_unless_turned_off() -> None:
    ssml = '<speak>Hi <voice name="am_adam">there</voice></speak>'
    assert [voice for _, voice, _ in script(ssml)] == [None, "am_adam"]
    assert script(ssml, ssml=False) == [(ssml, None, 1.0)]
    assert script(ssml, input_format="text") == [(ssml, None, 1.0)]


def test_lexicon_case_rules_and_longest_match(tmp_path: Path) -> None:
    lexicon = Lexicon({"nginx": "ˈɛnʤɪnˈɛks", "Nice": "nˈis", "New York": "nu jˈɔɹk", "New": "nˈu"})
    shielded: list[str] = []

    def shield(markup: str) -> str:
        shielded.append(markup)
        return markup

    out = lexicon.apply(Tracked.of("NGINX in New York is nice, Nice too; newish."), shield).text
    assert out == "[NGINX](/ˈɛnʤɪnˈɛks/) in [New York](/nu jˈɔɹk/) is nice, [Nice](/nˈis/) too; newish."
    assert len(shielded) == 3
    tsv = tmp_path / "lexicon.tsv"
    tsv.write_text("# names\nKokoro\tkˈOkəɹO\n\n")
    assert Lexicon.load(tsv).phonemes_for("Kokoro") == "kˈOkəɹO"
    (tmp_path / "bad.tsv").write_text("no tab here\n")
    with pytest.raises(LexiconError, match="bad.tsv:1"):
        Lexicon.load(tmp_path / "bad.tsv")
    with pytest.raises(LexiconError):
        Lexicon({"x": "a/b"})
    (tmp_path / "lexicon.json").write_text(json.dumps({"SQL": "ˈɛs kjˈu ˈɛl"}))
    assert len(Lexicon.load(tmp_path / "lexicon.json")) == 1


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    engine = FakeEngine()
    app = create_app(make_settings(tmp_path), engine=engine, phonemizer=FakePhonemizer())  # type: ignore[arg-type]
    with TestClient(app) as client:
        wait_ready(client)
        client.engine = engine  # type: ignore[attr-defined]
        yield client


def speak(client: TestClient, text: str, **extra: Any) -> Any:
    body = {"input": text, "voice": "af_heart", "response_format": "wav", "stream": False, **extra}
    return client.post("/v1/audio/speech", json=body)


def samples(wav_bytes: bytes) -> np.ndarray:
    with wave.open(io.BytesIO(wav_bytes)) as wav:
        return np.frombuffer(wav.readframes(wav.getnframes()), dtype="<i2").astype(np.float32) / 32768


def test_each_speaker_gets_its_own_chunks_and_style(client: TestClient) -> None:
    response = speak(client, "hello there [voice:am_adam] general kenobi")
    assert response.status_code == 200, response.text
    calls = client.engine.calls  # type: ignore[attr-defined]
    styles = [float(item.style[0]) for item in calls]
    assert len(calls) == 2
    assert styles[0] != styles[1]  # af_heart's pack, then am_adam's


def test_an_unknown_voice_in_a_tag_is_a_400_on_input(client: TestClient) -> None:
    response = speak(client, "hello [voice:nobody] there")
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "input"
    assert "nobody" in error["message"]


def test_ssml_break_prosody_and_voice_reach_the_engine(client: TestClient) -> None:
    ssml = (
        '<speak>hello <break time="1.5s"/> <prosody rate="slow">slow words</prosody>'
        '<voice name="am_adam">other voice</voice></speak>'
    )
    response = speak(client, ssml, speed=1.2)
    assert response.status_code == 200, response.text
    calls = client.engine.calls  # type: ignore[attr-defined]
    assert [round(item.speed, 3) for item in calls] == [1.2, 0.96, 1.2]
    audio = np.abs(samples(response.content))
    # The longest silent run is the break, less the quiet margins kept around real speech (a tone has
    # none to trim, so here they are tone): 1.5 - 2 x 0.04 s of digital silence, the chunk before it
    # followed by no punctuation pause of its own.
    silent = audio < 1e-3
    longest = max(len(run) for run in "".join("1" if s else "0" for s in silent).split("0"))
    assert abs(longest / 24000 - (1.5 - 2 * MARGIN_S)) < 0.005


def test_the_billion_laughs_document_is_refused_at_once(client: TestClient) -> None:
    entities = "".join(f'<!ENTITY lol{i} "{("&lol" + str(i - 1) + ";") * 10}">' for i in range(1, 10))
    bomb = f'<?xml version="1.0"?><!DOCTYPE speak [<!ENTITY lol0 "lol">{entities}]><speak>&lol9;</speak>'
    response = speak(client, bomb)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_ssml"


def test_malformed_ssml_says_where(client: TestClient) -> None:
    response = speak(client, '<speak>hi <break time="1s"></speak>')
    assert response.status_code == 400
    assert "line 1, column" in response.json()["error"]["message"]


def test_phonemize_and_generate_from_phonemes(client: TestClient) -> None:
    phonemized = client.post("/dev/phonemize", json={"text": "hello world", "language": "a"})
    assert phonemized.status_code == 200, phonemized.text
    body = phonemized.json()
    assert body["phonemes"] == "hello world"  # the fake G2P keeps the letters
    assert len(body["tokens"]) == len("hello world")
    generated = client.post(
        "/dev/generate_from_phonemes", json={"phonemes": body["phonemes"], "voice": "af_heart"}
    )
    assert generated.status_code == 200
    assert generated.headers["content-type"] == "audio/wav"
    spoken = speak(client, "hello world")
    assert np.array_equal(samples(generated.content), samples(spoken.content))
    bad = client.post("/dev/generate_from_phonemes", json={"phonemes": "hello ☃", "voice": "af_heart"})
    assert bad.status_code == 400
    assert bad.json()["error"]["param"] == "phonemes"


def test_timestamps_skip_voice_tags(client: TestClient) -> None:
    body = {"input": "hello there [voice:am_adam] general kenobi", "voice": "af_heart", "stream": False}
    words = [item["word"] for item in client.post("/dev/captioned_speech", json=body).json()["timestamps"]]
    assert words == ["hello", "there", "general", "kenobi"]


def test_part_defaults() -> None:
    assert Part(0, 3) == Part(0, 3, None, 1.0)
