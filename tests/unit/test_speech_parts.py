"""The speech service's pure parts, with no event loop, engine or model: the checks a request passes
before the first byte, the pipeline's per-chunk decisions, and the SSE framing of a response."""

from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import AsyncGenerator
from typing import Any

import numpy as np
import pytest

from api.engine.base import ChunkAudio
from api.engine.scheduling.entries import BACKGROUND_PRIORITY, FIRST_CHUNK_PRIORITY, LATER_CHUNK_PRIORITY
from api.engine.scheduling.lifecycle import EngineState
from api.errors import InvalidRequestError, NotFoundError, ServiceUnavailableError
from api.protocol import (
    MAX_SPEED,
    MIN_SPEED,
    MODEL_IDS,
    CaptionedSpeechRequest,
    SpeechAudioDelta,
    SpeechAudioDone,
    SpeechRequest,
    Usage,
)
from api.speech.captions import WordTime
from api.speech.job import Piece, SpeechJob
from api.speech.pipeline import Pending, louder, next_origin, priority, speed
from api.speech.streaming import speech_events, sse, started
from api.speech.validation import check_input, check_model, check_phonemes, check_ready, check_timestamps
from api.text.chunk import Ending
from api.text.markup import Part, Script
from api.text.plan import PlannedChunk, PlannedPause, PlannedWord
from tests.fakes import FakeEngine


def job_of(**request: Any) -> SpeechJob:
    speech = SpeechRequest(input="Hello.", **request)
    return SpeechJob(speech, "r1", np.zeros((510, 1, 256)), "a", Script("Hello.", (Part(0, 6),)))


def chunk(rate: float = 1.0, words: tuple[PlannedWord, ...] = ()) -> PlannedChunk:
    return PlannedChunk(tokens=(1, 2, 3), ending=Ending.SENTENCE, text="hi", words=words, rate=rate)


# --- validation ------------------------------------------------------------------------------------------


def test_ready_passes_only_a_ready_engine() -> None:
    check_ready(EngineState.READY, None)
    with pytest.raises(ServiceUnavailableError) as failed:
        check_ready(EngineState.FAILED, "OSError: no weights")
    assert (failed.value.code, failed.value.retry_after) == ("model_unavailable", 60)
    assert "OSError: no weights" in failed.value.message
    for state in (EngineState.STARTING, EngineState.STOPPED):
        with pytest.raises(ServiceUnavailableError) as loading:
            check_ready(state, None)
        assert (loading.value.code, loading.value.retry_after) == ("model_loading", 5)


def test_an_unknown_model_is_not_found() -> None:
    for model in MODEL_IDS:
        check_model(model)
    with pytest.raises(NotFoundError) as exc:
        check_model("tts-2")
    assert (exc.value.param, exc.value.code) == ("model", "model_not_found")


def test_the_input_needs_text_within_its_limit() -> None:
    check_input("x" * 10, 10)
    with pytest.raises(InvalidRequestError) as blank:
        check_input(" \n\t", 10)
    assert blank.value.code == "empty_input"
    with pytest.raises(InvalidRequestError) as long:
        check_input("x" * 11, 10)
    assert (long.value.param, long.value.code) == ("input", "string_too_long")
    assert "11 characters" in long.value.message


def test_unknown_phonemes_are_named_once_each_in_order() -> None:
    vocab = {"h": 1, "ə": 2}
    check_phonemes("hə hə\n", vocab)
    with pytest.raises(InvalidRequestError) as exc:
        check_phonemes("hzəxz", vocab)
    assert exc.value.message == "Unknown phoneme symbols: x z."
    assert exc.value.param == "phonemes"


def test_timestamps_need_durations_and_a_stream_that_carries_them() -> None:
    engine = FakeEngine()
    check_timestamps(SpeechRequest(input="hi", stream_format="sse", return_timestamps=True), engine)
    check_timestamps(CaptionedSpeechRequest(input="hi", return_timestamps=True), engine)
    with pytest.raises(InvalidRequestError) as audio:
        check_timestamps(SpeechRequest(input="hi", return_timestamps=True), engine)
    assert audio.value.code == "timestamps_need_sse"
    engine.gives_durations = False
    with pytest.raises(InvalidRequestError) as unavailable:
        check_timestamps(SpeechRequest(input="hi", stream_format="sse", return_timestamps=True), engine)
    assert unavailable.value.code == "timestamps_unavailable"


# --- the pipeline's decisions ----------------------------------------------------------------------------


def test_a_chunks_speed_is_the_requests_times_its_rate_within_the_models() -> None:
    assert speed(job_of(speed=1.5), chunk(rate=0.8)) == pytest.approx(1.2)
    assert speed(job_of(speed=MAX_SPEED), chunk(rate=2.0)) == MAX_SPEED
    assert speed(job_of(speed=MIN_SPEED), chunk(rate=0.5)) == MIN_SPEED


def test_only_a_requests_first_chunk_is_urgent_and_a_books_never() -> None:
    job = job_of()
    job.chunks_total = 1
    assert priority(job) == FIRST_CHUNK_PRIORITY
    job.chunks_total = 2
    assert priority(job) == LATER_CHUNK_PRIORITY
    job.background, job.chunks_total = True, 1
    assert priority(job) == BACKGROUND_PRIORITY


def test_the_next_origin_is_the_first_spoken_word_of_the_next_chunk() -> None:
    loop = asyncio.new_event_loop()
    try:
        done: asyncio.Future[ChunkAudio] = loop.create_future()
        words = (PlannedWord(origin=(0, 1), tokens=None), PlannedWord(origin=(2, 7), tokens=(0, 3)))
        following: Pending = deque([(done, PlannedPause(0.5)), (done, chunk(words=words))])
        assert next_origin(following) == (2, 7)
        assert next_origin(deque([(done, PlannedPause(0.5))])) is None
        assert next_origin(deque([(done, chunk(words=words[:1]))])) is None
    finally:
        loop.close()


def test_louder_scales_and_clips_and_leaves_unit_gain_alone() -> None:
    samples = np.array([0.1, -0.4, 0.6], dtype=np.float32)
    assert louder(samples, 1.0) is samples
    assert louder(samples, 2.0).tolist() == pytest.approx([0.2, -0.8, 1.0])


# --- the response stream ---------------------------------------------------------------------------------


def test_an_sse_event_is_one_data_line_without_empty_fields() -> None:
    assert sse(SpeechAudioDelta(audio="AAA=")) == b'data: {"type": "speech.audio.delta", "audio": "AAA="}\n\n'
    done = json.loads(sse(SpeechAudioDone(usage=Usage(input_tokens=3)))[len(b"data: ") :])
    assert done["type"] == "speech.audio.done"
    assert done["usage"]["input_tokens"] == 3


def test_speech_events_carry_each_pieces_words_then_the_usage() -> None:
    job = job_of()
    job.captions = object()  # type: ignore[assignment]  # only whether there are captions matters here
    job.usage.input_tokens = 7
    word = WordTime(word="hi", start_time=0.0, end_time=0.25)

    async def pieces() -> AsyncGenerator[Piece, None]:
        yield Piece(b"\x01\x02", [word])
        yield Piece(b"\x03", [])

    async def collect() -> list[dict[str, Any]]:
        return [json.loads(event[len(b"data: ") :]) async for event in speech_events(job, pieces())]

    first, second, done = asyncio.run(collect())
    assert first["audio"] == "AQI="
    assert first["timestamps"] == [vars(word)]
    assert second["audio"] == "Aw=="
    assert second["timestamps"] == []
    assert done == {"type": "speech.audio.done", "usage": {**done["usage"], "input_tokens": 7}}


def test_started_runs_a_stream_to_its_first_bytes_before_returning() -> None:
    ran: list[str] = []

    async def stream() -> AsyncGenerator[bytes, None]:
        ran.append("first")
        yield b"a"
        ran.append("rest")
        yield b"b"

    async def failing() -> AsyncGenerator[bytes, None]:
        raise InvalidRequestError("nothing to speak", code="empty_input")
        yield b""  # pragma: no cover - makes this a generator

    async def run() -> list[bytes]:
        resumed = await started(stream())
        assert ran == ["first"]
        with pytest.raises(InvalidRequestError):
            await started(failing())
        return [data async for data in resumed]

    assert asyncio.run(run()) == [b"a", b"b"]
    assert ran == ["first", "rest"]
