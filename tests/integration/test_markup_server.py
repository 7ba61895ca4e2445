"""Speech markup through real server processes: an SSML break is its length in silence (real weights);
two speakers equal their single-voice renderings; SSML bombs are refused at once without memory; a
lexicon changes /dev/phonemize, and speaking those phonemes equals speaking the text (kokoro's model code
with random weights, seeded)."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.integration.conftest import LEXICON, RegistryServers, Server

# The batching tests' tolerance for a chunk synthesized in a batch against alone (float32 audio).
TOLERANCE = 1e-4


def pcm(server: Server, path: str = "/v1/audio/speech", **body: Any) -> np.ndarray:
    response = httpx.post(
        f"{server.url}{path}", json={"response_format": "pcm", "stream": False, **body}, timeout=600
    )
    assert response.status_code == 200, response.text
    return np.frombuffer(response.content, dtype="<i2").astype(np.float32) / 32768


def rss_mib(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+)", status).group(1)) / 1024  # type: ignore[union-attr]


def test_two_speakers_equal_their_single_voice_renderings(server: Server) -> None:
    both = pcm(server, input="[voice:af_heart] Hello there. [voice:am_adam] General Kenobi.", voice="af_sky")
    first = pcm(server, input="Hello there.", voice="af_heart")
    second = pcm(server, input="General Kenobi.", voice="am_adam")
    assert len(both) == len(first) + len(second)
    # One int16 step is 3e-5: the tolerance is the batching tests' plus the 16-bit rounding.
    assert float(np.abs(both - np.concatenate([first, second])).max()) <= TOLERANCE + 2 / 32768


@pytest.mark.parametrize(
    "document",
    [
        '<?xml version="1.0"?><!DOCTYPE speak [<!ENTITY lol "lol">'
        + "".join(
            f'<!ENTITY lol{i} "{("&lol" + (str(i - 1) if i > 1 else "") + ";") * 10}">' for i in range(1, 10)
        )
        + "]><speak>&lol9;</speak>",
        '<!DOCTYPE speak [<!ENTITY xxe SYSTEM "file:///etc/passwd">]><speak>&xxe;</speak>',
    ],
    ids=["billion-laughs", "external-entity"],
)
def test_ssml_bombs_are_refused_at_once_without_memory(server: Server, document: str) -> None:
    before = rss_mib(server.process.pid)
    started = time.monotonic()
    response = httpx.post(f"{server.url}/v1/audio/speech", json={"input": document}, timeout=30)
    elapsed = time.monotonic() - started
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_ssml"
    assert elapsed < 1.0
    assert rss_mib(server.process.pid) - before < 5


def test_lexicon_changes_phonemes_and_phonemes_speak_like_the_text(server: Server) -> None:
    text = "I like tomato soup."
    response = httpx.post(f"{server.url}/dev/phonemize", json={"text": text, "language": "a"}, timeout=60)
    assert response.status_code == 200, response.text
    phonemes = response.json()["phonemes"]
    assert LEXICON["tomato"] in phonemes
    assert len(response.json()["tokens"]) == len(phonemes)
    spoken = pcm(server, input=text, voice="af_heart")
    generated = pcm(server, "/dev/generate_from_phonemes", phonemes=phonemes, voice="af_heart")
    assert len(generated) == len(spoken)
    assert float(np.abs(generated - spoken).max()) <= TOLERANCE + 2 / 32768


@pytest.fixture
def onnx_server(registry_servers: RegistryServers) -> Server:
    return registry_servers("onnx")


def speech_runs(audio: np.ndarray, window_s: float = 0.01) -> list[tuple[float, float]]:
    """(start, end) seconds of each stretch where 10 ms windows reach 2% of the peak (the trim's level)."""
    size = int(window_s * 24000)
    frames = np.abs(audio[: len(audio) // size * size]).reshape(-1, size).max(axis=1)
    loud = frames >= 0.02 * frames.max()
    runs, start = [], None
    for index, on in enumerate(loud):
        if on and start is None:
            start = index
        if not on and start is not None:
            runs.append((start * window_s, index * window_s))
            start = None
    if start is not None:
        runs.append((start * window_s, len(loud) * window_s))
    return runs


def test_an_ssml_break_is_its_length_in_silence(onnx_server: Server) -> None:
    ssml = '<speak>The first part ends here.<break time="1.5s"/>And the second part starts now.</speak>'
    runs = speech_runs(pcm(onnx_server, input=ssml, voice="af_heart"))
    gaps = [later[0] - earlier[1] for earlier, later in zip(runs, runs[1:], strict=False)]
    print(f"silences between speech: {[round(gap, 3) for gap in gaps]}")
    assert abs(max(gaps) - 1.5) <= 0.05
