"""Pipecat's TTS services for Deepgram, ElevenLabs, Cartesia and OpenAI, unchanged, pointed at a real server
over the registry weights by base URL (docs/api.md#voice-agents), as test_voice_agents.py does LiveKit's
plugins: text in word by word as an LLM writes it, the audio heard by whisper, a barge-in that leaves no
audio of the interrupted text. pipecat-ai 1.14 needs Python 3.11 or later: on 3.10 these are skipped."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("pipecat", reason="pipecat-ai 1.14 needs Python 3.11 or later (not installed on 3.10)")

from pipecat.frames.frames import (  # noqa: E402
    InterruptionFrame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    LLMTextFrame,
    TTSAudioRawFrame,
    TTSSpeakFrame,
    TTSTextFrame,
)
from pipecat.pipeline.task import PipelineParams  # noqa: E402
from pipecat.services.cartesia.tts import CartesiaTTSService  # noqa: E402
from pipecat.services.deepgram.tts import DeepgramTTSService  # noqa: E402
from pipecat.services.elevenlabs.tts import ElevenLabsTTSService  # noqa: E402
from pipecat.services.openai.tts import OpenAITTSService  # noqa: E402
from pipecat.tests.utils import SleepFrame, run_test  # noqa: E402

from scripts.bench.live import LONG_TEXT, queue_depth  # noqa: E402
from tests.integration.conftest import RegistryServers  # noqa: E402
from tests.integration.test_voice_agents import (  # noqa: E402
    ANSWER,
    KEY,
    SPEAKING_S,
    TEXT,
    cleared,
    heard,
    only_the_answer,
)

# Pipecat ends an audio context after 3 s without audio; on 2 cores a long phrase can take longer to
# synthesize than that (docs/api.md#voice-agents).
STOP_FRAME_TIMEOUT_S = 10.0


PIPECAT: dict[str, Callable[[str], Any]] = {
    "deepgram": lambda url: DeepgramTTSService(
        api_key=KEY,
        base_url=url.replace("http://", "ws://"),
        settings=DeepgramTTSService.Settings(voice="af_heart"),
        stop_frame_timeout_s=STOP_FRAME_TIMEOUT_S,
    ),
    "elevenlabs": lambda url: ElevenLabsTTSService(
        api_key=KEY,
        url=url.replace("http://", "ws://"),
        settings=ElevenLabsTTSService.Settings(voice="af_heart"),
        stop_frame_timeout_s=STOP_FRAME_TIMEOUT_S,
    ),
    "cartesia": lambda url: CartesiaTTSService(
        api_key=KEY,
        url=url.replace("http://", "ws://") + "/tts/websocket",
        settings=CartesiaTTSService.Settings(voice="af_heart"),
        stop_frame_timeout_s=STOP_FRAME_TIMEOUT_S,
    ),
}


def reply(text: str, words: bool = False) -> list[Any]:
    """An LLM's answer as Pipecat's frames: its text whole, or word by word."""
    pieces = [text + " "] if not words else [word + " " for word in text.split(" ")]
    return [
        LLMFullResponseStartFrame(),
        *(LLMTextFrame(text=piece) for piece in pieces),
        LLMFullResponseEndFrame(),
    ]


def pipecat_run(service: Any, frames: list[Any], rate: int) -> list[Any]:
    """The service in Pipecat's own test pipeline; it ends once the audio has (EndFrame waits behind it)."""
    params = PipelineParams(audio_out_sample_rate=rate)
    down, _ = asyncio.run(
        run_test(
            service, frames_to_send=[*frames, SleepFrame(sleep=0.5)], pipeline_params=params, start_timeout=10
        )
    )
    return list(down)


def audio_of(frames: list[Any]) -> bytes:
    return b"".join(frame.audio for frame in frames if isinstance(frame, TTSAudioRawFrame))


@pytest.mark.parametrize("vendor", ["deepgram", "elevenlabs"])
def test_pipecat_service_streams_words_in_and_speech_out(
    registry_servers: RegistryServers, whisper: Any, vendor: str
) -> None:
    server = registry_servers("torch")
    down = pipecat_run(PIPECAT[vendor](server.url), reply(TEXT, words=True), 16000)
    pcm = audio_of(down)
    heard(whisper, pcm, 16000, TEXT, f"Pipecat {vendor}, 16 kHz")
    if vendor == "elevenlabs":  # word timings from the alignment
        timed = [frame for frame in down if isinstance(frame, TTSTextFrame) and frame.pts]
        print("word timings:", [(frame.text.strip(), round(frame.pts / 1e9, 2)) for frame in timed])
        assert [frame.text.strip(" ,.") for frame in timed] == [word.strip(",.") for word in TEXT.split()]
        times = [frame.pts for frame in timed]
        assert times == sorted(times)
        assert (times[-1] - times[0]) / 1e9 <= len(pcm) / 2 / 16000


@pytest.mark.parametrize("vendor", sorted(PIPECAT))
def test_pipecat_barge_in_leaves_nothing_of_the_interrupted_answer(
    registry_servers: RegistryServers, whisper: Any, vendor: str
) -> None:
    """An interruption mid-answer (Deepgram's service sends Clear, Cartesia's cancel, ElevenLabs' closes the
    context and opens the next): the server drops the rest at once, and only the next answer is heard."""
    server = registry_servers("torch")
    clears = cleared(server)
    frames = [
        *reply(LONG_TEXT),
        SleepFrame(sleep=SPEAKING_S),
        InterruptionFrame(),
        SleepFrame(sleep=1),
        *reply(ANSWER),
    ]
    down = pipecat_run(PIPECAT[vendor](server.url), frames, 24000)
    # Pipecat queues audio frames behind its system frames, so the order of `down` cannot tell what arrived
    # before the interruption: the server's log says the answer was dropped.
    assert cleared(server) == clears + 1
    assert queue_depth(server.url) == 0.0
    cut = next(index for index, frame in enumerate(down) if isinstance(frame, InterruptionFrame))
    only_the_answer(whisper, audio_of(down[cut:]), 24000, f"Pipecat {vendor} after an interruption")


def test_pipecat_openai_service(registry_servers: RegistryServers, whisper: Any) -> None:
    """Pipecat's OpenAITTSService takes only OpenAI's voice names, which the server maps to its voices."""
    server = registry_servers("torch")
    service = OpenAITTSService(
        api_key=KEY, base_url=f"{server.url}/v1", voice="nova", model="gpt-4o-mini-tts"
    )
    pcm = audio_of(pipecat_run(service, [TTSSpeakFrame(text=TEXT)], 24000))
    heard(whisper, pcm, 24000, TEXT, "Pipecat OpenAITTSService nova")
