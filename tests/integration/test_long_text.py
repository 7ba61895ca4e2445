"""A whole chapter through a real server process (text pipeline, G2P, encoders; the tone engine stands in
for the model, which would need many minutes on a CPU): it streams completely and nothing is dropped."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from api.text.chunk import phonemes_of
from api.text.normalize import normalize_text
from api.text.phonemize import Phonemizer
from api.text.split import group_sentences
from scripts.harness import Server, running_server
from tests.fakes import shipped_vocab

SENTENCES = (
    "Chapter {n}. The rain had not stopped for {n} days, and the river was rising fast.",
    "Mrs. Alvarez counted 3,497 sandbags on the 2nd of March; by 6:30 PM there were more.",
    "Nobody in the village, not even the old ferryman who had lived there since 1962, remembered a flood",
    "like it — the water climbed over the wall, through the square and into the bakery.",
    "She wrote down the level every hour: 4.5 metres at noon, 5 at one, then 5.75 at two.",
    '"We leave tonight," said Dr. Okafor, "before the bridge closes."',
    "It cost them $120.50 in fuel and nearly 40% of what they had saved for the winter.",
)


def chapter(chars: int) -> str:
    paragraphs, n = [], 1
    while sum(len(p) for p in paragraphs) < chars:
        paragraphs.append(" ".join(s.format(n=n) for s in SENTENCES))
        n += 1
    text = "\n\n".join(paragraphs)
    return text[: text.rfind(".", 0, chars) + 1]


@pytest.fixture(scope="module")
def tone_server(random_weights: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    log = tmp_path_factory.mktemp("tone-server") / "server.log"
    with running_server(random_weights, log, module="tests.tone_server") as server:
        yield server


def sse_usage_and_audio(server: Server, text: str) -> tuple[dict[str, int], int]:
    body = {"input": text, "voice": "af_heart", "response_format": "pcm", "stream_format": "sse"}
    audio_bytes, usage = 0, None
    with httpx.stream("POST", f"{server.url}/v1/audio/speech", json=body, timeout=600) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            event = json.loads(line[6:])
            if event["type"] == "speech.audio.delta":
                audio_bytes += len(base64.b64decode(event["audio"]))
            else:
                usage = event["usage"]
    assert usage is not None, "the stream ended without speech.audio.done"
    return usage, audio_bytes // 2


def expected_tokens(text: str) -> int:
    """What the server should phonemize: the same normalization and G2P, done here."""
    phonemizer = Phonemizer()
    normalized = normalize_text(text)
    words = [w for piece in group_sentences(normalized, 400, 120) for w in phonemizer.words(piece, "a")]
    vocab = shipped_vocab()
    return sum(symbol in vocab for symbol in phonemes_of(words))


def test_a_chapter_streams_completely(tone_server: Server) -> None:
    text = chapter(20_000)
    assert len(text) > 19_000
    usage, samples = sse_usage_and_audio(tone_server, text)
    # Every phoneme was sent to the engine (chunk edges drop only the spaces between chunks).
    assert usage["input_tokens"] == pytest.approx(expected_tokens(text), rel=0.01)
    # The tone engine makes 1200 samples per token; pauses come on top of that.
    assert samples >= usage["input_tokens"] * 1200
    assert usage["output_tokens"] == -(-samples // 600)


def test_audio_grows_with_the_text(tone_server: Server) -> None:
    short_usage, short = sse_usage_and_audio(tone_server, chapter(5_000))
    long_usage, long = sse_usage_and_audio(tone_server, chapter(10_000))
    assert long / short == pytest.approx(long_usage["input_tokens"] / short_usage["input_tokens"], rel=0.05)
    assert 1.8 < long / short < 2.2
