"""Real weights from the package registries, through the real server, on both engines: whisper tiny.en
must understand what the server says (word error rate at most 10%)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from itertools import groupby
from pathlib import Path
from typing import Any

import httpx
import pytest

from api.weights.layout import OFFICIAL_VOICES
from scripts.hearing import MAX_WER, SENTENCES, VOICE_SENTENCE, say, transcribe, word_error_rate
from tests.integration.conftest import RegistryServers, Server, start_server, stop_server

# One voice of each language and gender (the first of each name prefix: 17 of the 54 official voices) reads
# one English sentence (with English G2P), every other one on each engine. Every voice file is the
# registry's, checked byte for byte against its pinned hash, and the server reads each the same way; all 54
# on both engines in turns were heard without an error with this sentence and with the ten words of "Good
# morning, and welcome to the weather report for today." (AMX Xeon, 2026-11-28), and cost 3.8 minutes of
# lane 1 on a slower Xeon (docs/journal/test-suite.md, entry 43).
VOICES = tuple(next(group) for _, group in groupby(OFFICIAL_VOICES, key=lambda name: name[:2]))
# Each engine says these sentences, each alone: all of them on torch (the batched test below compares its
# batch with them), every other one on ONNX (the normalization above the engines is the same for both).
ENGINE_SENTENCES = {"torch": SENTENCES, "onnx": SENTENCES[0::2]}
# Whisper's transcripts of what a server says (the `heard_sentences` fixture).
Hear = Callable[[Server, tuple[str, ...]], list[str]]


@pytest.fixture(params=["torch", "onnx"])
def real_server(request: pytest.FixtureRequest, registry_servers: RegistryServers) -> Server:
    return registry_servers(request.param)


def heard_while_speaking(whisper: Any, wavs: Iterable[bytes]) -> list[str]:
    """Whisper's transcriptions of `wavs`, made as they arrive: given a pool's map, the server speaks the
    next ones while whisper hears the last (the two share 2 cores; this cut each sweep by a third)."""
    return [transcribe(whisper, wav) for wav in wavs]


@pytest.fixture(scope="module")
def heard_sentences(whisper: Any) -> Hear:
    """Whisper's transcripts of the engine's ENGINE_SENTENCES, each said alone by its server, made once per
    server and sentences: the batched test compares its batch with the default torch server's (that server
    runs one chunk per call)."""
    heard: dict[tuple[str, tuple[str, ...]], list[str]] = {}

    def hear(server: Server, sentences: tuple[str, ...]) -> list[str]:
        key = (server.url, sentences)
        if key not in heard:
            with ThreadPoolExecutor(max_workers=2) as pool:
                spoken = pool.map(lambda text: say(server, text), sentences)
                heard[key] = heard_while_speaking(whisper, spoken)
        return heard[key]

    return hear


def test_sentences_are_understood(
    real_server: Server, heard_sentences: Hear, request: pytest.FixtureRequest
) -> None:
    sentences = ENGINE_SENTENCES[request.node.callspec.params["real_server"]]
    pairs = list(zip(sentences, heard_sentences(real_server, sentences), strict=True))
    for reference, heard in pairs:
        wer = word_error_rate([(reference, heard)])
        print(f"said:  {reference}\nheard: {heard.strip()}\n  WER {wer:.2f}")
    wer = word_error_rate(pairs)
    print(f"overall WER {wer:.3f}")
    assert wer <= MAX_WER


def test_streamed_speech_is_understood(registry_servers: RegistryServers, whisper: Any) -> None:
    """Streaming is the same above either engine (ONNX's streamed timestamps are checked in
    test_timestamps.py): the torch server's."""
    text = " ".join(SENTENCES[:3])
    heard = transcribe(whisper, say(registry_servers("torch"), text, stream=True))
    wer = word_error_rate([(text, heard)])
    print(f"streamed, WER {wer:.3f}: {heard}")
    assert wer <= MAX_WER


def test_a_voice_of_each_language_and_gender_is_understood(
    real_server: Server, whisper: Any, request: pytest.FixtureRequest
) -> None:
    engine = request.node.callspec.params["real_server"]
    voices = VOICES[0::2] if engine == "onnx" else VOICES[1::2]
    pairs = []
    with ThreadPoolExecutor(max_workers=2) as pool:
        spoken = pool.map(lambda voice: say(real_server, VOICE_SENTENCE, voice=voice, lang_code="a"), voices)
        heard_by_voice = zip(voices, heard_while_speaking(whisper, spoken), strict=True)
    for voice, heard in heard_by_voice:
        wer = word_error_rate([(VOICE_SENTENCE, heard)])
        print(f"{engine} {voice}: WER {wer:.2f} {heard.strip()}")
        assert wer <= 0.25, f"{voice} is hard to understand: {heard}"
        pairs.append((VOICE_SENTENCE, heard))
    assert word_error_rate(pairs) <= MAX_WER


def batch_sizes(server: Server) -> tuple[float, float]:
    """(number of engine calls, chunks in them) from the server's batch-size histogram."""
    metrics = httpx.get(f"{server.url}/metrics", timeout=10).text
    values = dict(re.findall(r"^kokoro_engine_batch_size_(count|sum) (\S+)$", metrics, flags=re.MULTILINE))
    return float(values["count"]), float(values["sum"])


def test_batched_speech_is_understood_as_well(
    registry_weights: Path,
    registry_servers: RegistryServers,
    whisper: Any,
    heard_sentences: Hear,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """The same sentences, sent together to a PyTorch server that batches them, against each said alone by
    the default torch server (one chunk per call on a CPU): the batched path is really taken (the engine
    ran fewer calls than chunks) and the WER does not change."""
    sentences = SENTENCES[:5]
    alone = heard_sentences(registry_servers("torch"), ENGINE_SENTENCES["torch"])[: len(sentences)]
    single = list(zip(sentences, alone, strict=True))
    log = tmp_path_factory.mktemp("server-batched") / "server.log"
    # A long batch timeout lets every concurrent first chunk join the first batch on this slow machine.
    server = start_server(
        registry_weights,
        log,
        KOKORO_ENGINE="torch",
        KOKORO_MAX_BATCH_SIZE="8",
        KOKORO_BATCH_TIMEOUT_MS="3000",
        # Every sentence in synthesis at once (the default admits 4 and queues the fifth, which could
        # wait past max_wait_s on a busy 2-core machine and get a 503).
        KOKORO_MAX_INFLIGHT="8",
    )
    try:
        with ThreadPoolExecutor(max_workers=len(sentences)) as pool:
            together = list(pool.map(lambda text: say(server, text), sentences))
        calls, chunks = batch_sizes(server)
    finally:
        stop_server(server)
    assert chunks >= len(sentences)
    assert calls < chunks, f"{calls} engine calls for {chunks} chunks: nothing was batched"
    batched = [(text, transcribe(whisper, wav)) for text, wav in zip(sentences, together, strict=True)]
    for (text, heard_batched), (_, heard_single) in zip(batched, single, strict=True):
        print(f"said:    {text}\nbatched: {heard_batched.strip()}\nalone:   {heard_single.strip()}")
    assert word_error_rate(batched) == word_error_rate(single) <= MAX_WER
