"""The voice-agent frameworks' own TTS plugins, unchanged, pointed at a real server over the registry weights
by base URL (docs/api.md#voice-agents): LiveKit's `livekit-plugins-deepgram` and Pipecat's
`DeepgramTTSService`. Text goes in word by word as an LLM writes it; the audio that comes back is heard by
whisper; a barge-in mid-utterance leaves no audio of the cleared text."""

from __future__ import annotations

import asyncio
import io
import json
import wave
from typing import Any

import aiohttp
import numpy as np
import pytest
from livekit.agents import APIConnectOptions
from livekit.plugins import deepgram as livekit_deepgram
from websockets.asyncio.client import connect

from scripts.bench.bench_live import LONG_TEXT, queue_depth
from tests.integration.conftest import RegistryServers
from tests.integration.test_intelligibility import MAX_WER, transcribe, whisper, word_error_rate

__all__ = ["whisper"]  # the fixture, shared with test_intelligibility

TEXT = (
    "The river ran quietly past the old mill. Children waved from the bridge as the boats went by, "
    "and the evening light turned the water gold."
)
KEY = "agent-test-key"
CONNECT = APIConnectOptions(max_retry=0, timeout=60)
STOP_FRAME_TIMEOUT_S = 10.0


def wav_of(pcm: bytes, rate: int) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as file:
        file.setnchannels(1)
        file.setsampwidth(2)
        file.setframerate(rate)
        file.writeframes(pcm)
    return out.getvalue()


def heard(whisper: Any, pcm: bytes, rate: int, text: str, label: str) -> str:
    said = transcribe(whisper, wav_of(pcm, rate))
    wer = word_error_rate([(text, said)])
    print(f"{label}: WER {wer:.3f}: {said}")
    assert wer <= MAX_WER, said
    return str(said)


async def livekit_stream(url: str, text: str, rate: int) -> bytes:
    async with aiohttp.ClientSession() as http:
        tts = livekit_deepgram.TTS(
            model="af_heart", sample_rate=rate, base_url=f"{url}/v1/speak", api_key=KEY, http_session=http
        )
        stream = tts.stream(conn_options=CONNECT)
        for word in text.split(" "):  # as an LLM's tokens arrive
            stream.push_text(word + " ")
            await asyncio.sleep(0.01)
        stream.flush()
        stream.end_input()
        pcm = b"".join([bytes(event.frame.data) async for event in stream])
        await stream.aclose()
        await tts.aclose()
        return pcm


def test_livekit_deepgram_plugin_streams_words_in_and_speech_out(
    registry_servers: RegistryServers, whisper: Any
) -> None:
    server = registry_servers("torch")
    pcm = asyncio.run(livekit_stream(server.url, TEXT, 16000))
    assert len(pcm) / 2 / 16000 > 4.0
    heard(whisper, pcm, 16000, TEXT, "LiveKit deepgram.TTS stream, 16 kHz")


def test_livekit_deepgram_plugin_non_streaming(registry_servers: RegistryServers, whisper: Any) -> None:
    server = registry_servers("torch")

    async def chunked() -> bytes:
        async with aiohttp.ClientSession() as http:
            tts = livekit_deepgram.TTS(
                model="af_heart", base_url=f"{server.url}/v1/speak", api_key=KEY, http_session=http
            )
            pcm = b"".join(
                [bytes(event.frame.data) async for event in tts.synthesize(TEXT, conn_options=CONNECT)]
            )
            await tts.aclose()
            return pcm

    heard(whisper, asyncio.run(chunked()), 24000, TEXT, "LiveKit deepgram.TTS synthesize, 24 kHz")


def test_deepgram_clear_drops_the_rest_of_the_utterance(
    registry_servers: RegistryServers, whisper: Any
) -> None:
    """Barge-in as Pipecat's Deepgram service does it (Clear) on the raw socket: after `Cleared`, nothing of
    the cleared text; the next utterance is heard as itself."""
    server = registry_servers("torch")
    url = (
        server.url.replace("http://", "ws://")
        + "/v1/speak?model=af_heart&encoding=linear16&sample_rate=24000"
    )

    async def barge_in() -> tuple[list[str], bytes]:
        async with connect(url, additional_headers={"Authorization": f"Token {KEY}"}) as ws:
            assert json.loads(await ws.recv())["type"] == "Metadata"
            await ws.send(json.dumps({"type": "Speak", "text": LONG_TEXT}))
            await ws.send(json.dumps({"type": "Flush"}))
            while not isinstance(await ws.recv(), bytes):  # its first audio: the utterance is speaking
                pass
            await ws.send(json.dumps({"type": "Clear"}))
            before: list[str] = []
            while not isinstance(message := await ws.recv(), str) or json.loads(message)["type"] != "Cleared":
                before.append("audio" if isinstance(message, bytes) else json.loads(message)["type"])
            assert queue_depth(server.url) == 0.0
            await ws.send(json.dumps({"type": "Speak", "text": "Yes, go on."}))
            await ws.send(json.dumps({"type": "Flush"}))
            after = bytearray()
            while isinstance(message := await ws.recv(), bytes):
                after += message
            assert json.loads(message) == {"type": "Flushed", "sequence_id": 1}
            return before, bytes(after)

    before, after = asyncio.run(barge_in())
    assert set(before) <= {"audio"}
    said = heard(whisper, after, 24000, "Yes, go on.", "after Clear")
    assert not set(LONG_TEXT.lower().split()) & set(said.lower().replace(",", "").split()) - {"on"}


# A-law and 16-bit PCM at other rates go through the same resampler and codecs (tests/unit/test_telephony.py).
@pytest.mark.parametrize(("encoding", "rate"), [("mulaw", 8000)])
def test_telephony_encodings_are_heard(
    registry_servers: RegistryServers, whisper: Any, encoding: str, rate: int
) -> None:
    server = registry_servers("torch")
    import av

    response = aiohttp_post(
        f"{server.url}/v1/speak?model=af_heart&encoding={encoding}&sample_rate={rate}", TEXT
    )
    if encoding == "linear16":
        pcm = response
    else:
        codec = av.CodecContext.create(f"pcm_{encoding}", "r")
        codec.sample_rate = rate
        codec.layout = "mono"
        frames = codec.decode(av.Packet(response))
        pcm = np.concatenate([frame.to_ndarray().reshape(-1) for frame in frames]).astype("<i2").tobytes()
    heard(whisper, pcm, rate, TEXT, f"POST /v1/speak {encoding} {rate} Hz")


def aiohttp_post(url: str, text: str) -> bytes:
    import httpx

    response = httpx.post(url, json={"text": text}, headers={"Authorization": f"Token {KEY}"}, timeout=120)
    assert response.status_code == 200, response.text
    return response.content


async def pipecat_deepgram(url: str, text: str, rate: int) -> bytes:
    """Pipecat's DeepgramTTSService in its own test pipeline: an LLM's words in, audio frames out."""
    from pipecat.frames.frames import (
        LLMFullResponseEndFrame,
        LLMFullResponseStartFrame,
        LLMTextFrame,
        TTSAudioRawFrame,
    )
    from pipecat.pipeline.task import PipelineParams
    from pipecat.services.deepgram.tts import DeepgramTTSService
    from pipecat.tests.utils import SleepFrame, run_test

    service = DeepgramTTSService(
        api_key=KEY,
        base_url=url.replace("http://", "ws://"),
        encoding="linear16",
        settings=DeepgramTTSService.Settings(voice="af_heart"),
        # Pipecat ends an audio context after 3 s without audio; on 2 cores a long phrase can take longer to
        # synthesize than that (docs/api.md#voice-agents).
        stop_frame_timeout_s=STOP_FRAME_TIMEOUT_S,
    )
    words = [LLMTextFrame(text=word + " ") for word in text.split(" ")]
    frames = [LLMFullResponseStartFrame(), *words, LLMFullResponseEndFrame(), SleepFrame(sleep=0.5)]
    down, _ = await run_test(
        service,
        frames_to_send=frames,
        pipeline_params=PipelineParams(audio_out_sample_rate=rate),
        start_timeout=10,
    )
    return b"".join(frame.audio for frame in down if isinstance(frame, TTSAudioRawFrame))


def test_pipecat_deepgram_service_streams_words_in_and_speech_out(
    registry_servers: RegistryServers, whisper: Any
) -> None:
    server = registry_servers("torch")
    pcm = asyncio.run(pipecat_deepgram(server.url, TEXT, 16000))
    heard(whisper, pcm, 16000, TEXT, "Pipecat DeepgramTTSService, 16 kHz")


@pytest.mark.parametrize("model", ["gpt-4o-mini-tts", "tts-1"])
def test_livekit_openai_plugin_sse_and_audio(
    registry_servers: RegistryServers, whisper: Any, model: str
) -> None:
    """LiveKit's openai.TTS asks for SSE (`speech.audio.delta`) unless the model is tts-1 or tts-1-hd."""
    from livekit.plugins import openai as livekit_openai

    server = registry_servers("torch")

    async def synthesize() -> bytes:
        tts = livekit_openai.TTS(
            model=model, voice="af_heart", base_url=f"{server.url}/v1", api_key=KEY, response_format="pcm"
        )
        pcm = b"".join(
            [bytes(event.frame.data) async for event in tts.synthesize(TEXT, conn_options=CONNECT)]
        )
        await tts.aclose()
        return pcm

    heard(whisper, asyncio.run(synthesize()), 24000, TEXT, f"LiveKit openai.TTS {model}")


def test_pipecat_openai_service(registry_servers: RegistryServers, whisper: Any) -> None:
    """Pipecat's OpenAITTSService takes only OpenAI's voice names, which the server maps to its voices."""
    from pipecat.frames.frames import TTSAudioRawFrame, TTSSpeakFrame
    from pipecat.pipeline.task import PipelineParams
    from pipecat.services.openai.tts import OpenAITTSService
    from pipecat.tests.utils import SleepFrame, run_test

    server = registry_servers("torch")

    async def speak() -> bytes:
        service = OpenAITTSService(
            api_key=KEY, base_url=f"{server.url}/v1", voice="nova", model="gpt-4o-mini-tts"
        )
        down, _ = await run_test(
            service,
            frames_to_send=[TTSSpeakFrame(text=TEXT), SleepFrame(sleep=0.5)],
            pipeline_params=PipelineParams(audio_out_sample_rate=24000),
            start_timeout=10,
        )
        return b"".join(frame.audio for frame in down if isinstance(frame, TTSAudioRawFrame))

    heard(whisper, asyncio.run(speak()), 24000, TEXT, "Pipecat OpenAITTSService nova")


def test_pipecat_deepgram_barge_in_leaves_nothing_of_the_cleared_text(
    registry_servers: RegistryServers, whisper: Any
) -> None:
    """An interruption mid-answer: Pipecat's service sends Clear; the audio after it is the next answer."""
    from pipecat.frames.frames import (
        InterruptionFrame,
        LLMFullResponseEndFrame,
        LLMFullResponseStartFrame,
        LLMTextFrame,
        TTSAudioRawFrame,
    )
    from pipecat.pipeline.task import PipelineParams
    from pipecat.services.deepgram.tts import DeepgramTTSService
    from pipecat.tests.utils import SleepFrame, run_test

    server = registry_servers("torch")
    answer = "Yes, go on."

    async def interrupted() -> tuple[bytes, bytes]:
        service = DeepgramTTSService(
            api_key=KEY,
            base_url=server.url.replace("http://", "ws://"),
            settings=DeepgramTTSService.Settings(voice="af_heart"),
            stop_frame_timeout_s=STOP_FRAME_TIMEOUT_S,
        )
        reply = [LLMFullResponseStartFrame(), LLMTextFrame(text=LONG_TEXT), LLMFullResponseEndFrame()]
        second = [LLMFullResponseStartFrame(), LLMTextFrame(text=answer), LLMFullResponseEndFrame()]
        frames = [
            *reply,
            SleepFrame(sleep=2.5),
            InterruptionFrame(),
            SleepFrame(sleep=1),
            *second,
            SleepFrame(sleep=0.5),
        ]
        down, _ = await run_test(
            service,
            frames_to_send=frames,
            pipeline_params=PipelineParams(audio_out_sample_rate=24000),
            start_timeout=10,
        )
        cut = next(i for i, frame in enumerate(down) if isinstance(frame, InterruptionFrame))
        before = b"".join(frame.audio for frame in down[:cut] if isinstance(frame, TTSAudioRawFrame))
        after = b"".join(frame.audio for frame in down[cut:] if isinstance(frame, TTSAudioRawFrame))
        return before, after

    before, after = asyncio.run(interrupted())
    assert before  # it was speaking when interrupted
    assert queue_depth(server.url) == 0.0
    said = heard(whisper, after, 24000, answer, "Pipecat DeepgramTTSService after an interruption")
    assert not set(LONG_TEXT.lower().split()) & set(
        said.lower().replace(",", "").replace(".", "").split()
    ) - {"on"}


async def livekit_elevenlabs_stream(url: str, text: str) -> bytes:
    from livekit.plugins import elevenlabs as livekit_elevenlabs

    async with aiohttp.ClientSession() as http:
        tts = livekit_elevenlabs.TTS(
            voice_id="af_heart", encoding="pcm_16000", base_url=f"{url}/v1", api_key=KEY, http_session=http
        )
        stream = tts.stream(conn_options=CONNECT)
        for word in text.split(" "):
            stream.push_text(word + " ")
            await asyncio.sleep(0.01)
        stream.flush()
        stream.end_input()
        pcm = b"".join([bytes(event.frame.data) async for event in stream])
        await stream.aclose()
        await tts.aclose()
        return pcm


def test_livekit_elevenlabs_plugin_streams_words_in_and_speech_out(
    registry_servers: RegistryServers, whisper: Any
) -> None:
    server = registry_servers("torch")
    pcm = asyncio.run(livekit_elevenlabs_stream(server.url, TEXT))
    heard(whisper, pcm, 16000, TEXT, "LiveKit elevenlabs.TTS multi-stream-input, pcm_16000")


def test_livekit_elevenlabs_plugin_non_streaming(registry_servers: RegistryServers, whisper: Any) -> None:
    from livekit.plugins import elevenlabs as livekit_elevenlabs

    server = registry_servers("torch")

    async def chunked() -> bytes:
        async with aiohttp.ClientSession() as http:
            tts = livekit_elevenlabs.TTS(
                voice_id="af_heart",
                encoding="pcm_24000",
                base_url=f"{server.url}/v1",
                api_key=KEY,
                http_session=http,
            )
            pcm = b"".join(
                [bytes(event.frame.data) async for event in tts.synthesize(TEXT, conn_options=CONNECT)]
            )
            await tts.aclose()
            return pcm

    heard(whisper, asyncio.run(chunked()), 24000, TEXT, "LiveKit elevenlabs.TTS synthesize, pcm_24000")


async def pipecat_elevenlabs(url: str, frames: list[Any], rate: int) -> list[Any]:
    from pipecat.pipeline.task import PipelineParams
    from pipecat.services.elevenlabs.tts import ElevenLabsTTSService
    from pipecat.tests.utils import run_test

    service = ElevenLabsTTSService(
        api_key=KEY,
        url=url.replace("http://", "ws://"),
        settings=ElevenLabsTTSService.Settings(voice="af_heart"),
        stop_frame_timeout_s=STOP_FRAME_TIMEOUT_S,
    )
    down, _ = await run_test(
        service,
        frames_to_send=frames,
        pipeline_params=PipelineParams(audio_out_sample_rate=rate),
        start_timeout=10,
    )
    return list(down)


def test_pipecat_elevenlabs_service_speaks_with_word_timings(
    registry_servers: RegistryServers, whisper: Any
) -> None:
    from pipecat.frames.frames import (
        LLMFullResponseEndFrame,
        LLMFullResponseStartFrame,
        LLMTextFrame,
        TTSAudioRawFrame,
        TTSTextFrame,
    )
    from pipecat.tests.utils import SleepFrame

    server = registry_servers("torch")
    words = [LLMTextFrame(text=word + " ") for word in TEXT.split(" ")]
    frames = [LLMFullResponseStartFrame(), *words, LLMFullResponseEndFrame(), SleepFrame(sleep=0.5)]
    down = asyncio.run(pipecat_elevenlabs(server.url, frames, 16000))
    pcm = b"".join(frame.audio for frame in down if isinstance(frame, TTSAudioRawFrame))
    heard(whisper, pcm, 16000, TEXT, "Pipecat ElevenLabsTTSService, pcm_16000")
    timed = [frame for frame in down if isinstance(frame, TTSTextFrame) and frame.pts]
    spoken_words = [frame.text.strip() for frame in timed]
    print("Pipecat word timings:", [(frame.text.strip(), round(frame.pts / 1e9, 2)) for frame in timed])
    assert [word.strip(",.") for word in spoken_words] == [word.strip(",.") for word in TEXT.split()]
    times = [frame.pts for frame in timed]
    assert times == sorted(times)
    assert (times[-1] - times[0]) / 1e9 <= len(pcm) / 2 / 16000


def test_pipecat_elevenlabs_barge_in_leaves_nothing_of_the_cleared_text(
    registry_servers: RegistryServers, whisper: Any
) -> None:
    from pipecat.frames.frames import (
        InterruptionFrame,
        LLMFullResponseEndFrame,
        LLMFullResponseStartFrame,
        LLMTextFrame,
        TTSAudioRawFrame,
    )
    from pipecat.tests.utils import SleepFrame

    server = registry_servers("torch")
    answer = "Yes, go on."
    reply = [LLMFullResponseStartFrame(), LLMTextFrame(text=LONG_TEXT), LLMFullResponseEndFrame()]
    second = [LLMFullResponseStartFrame(), LLMTextFrame(text=answer), LLMFullResponseEndFrame()]
    frames = [
        *reply,
        SleepFrame(sleep=2.5),
        InterruptionFrame(),
        SleepFrame(sleep=1),
        *second,
        SleepFrame(sleep=0.5),
    ]
    clears = server.log().count(" cleared (")
    down = asyncio.run(pipecat_elevenlabs(server.url, frames, 24000))
    # The interrupted context was dropped on the server (Pipecat queues audio frames behind its system
    # frames, so the order of `down` cannot tell what arrived before the interruption).
    assert server.log().count(" cleared (") == clears + 1
    cut = next(i for i, frame in enumerate(down) if isinstance(frame, InterruptionFrame))
    after = b"".join(frame.audio for frame in down[cut:] if isinstance(frame, TTSAudioRawFrame))
    assert queue_depth(server.url) == 0.0
    said = heard(whisper, after, 24000, answer, "Pipecat ElevenLabsTTSService after an interruption")
    assert not set(LONG_TEXT.lower().split()) & set(
        said.lower().replace(",", "").replace(".", "").split()
    ) - {"on"}


def test_livekit_cartesia_plugin_stream_and_bytes(registry_servers: RegistryServers, whisper: Any) -> None:
    from livekit.plugins import cartesia as livekit_cartesia

    server = registry_servers("torch")

    async def both() -> tuple[bytes, bytes]:
        async with aiohttp.ClientSession() as http:
            tts = livekit_cartesia.TTS(
                voice="af_heart", sample_rate=16000, base_url=server.url, api_key=KEY, http_session=http
            )
            stream = tts.stream(conn_options=CONNECT)
            for word in TEXT.split(" "):
                stream.push_text(word + " ")
                await asyncio.sleep(0.01)
            stream.flush()
            stream.end_input()
            streamed = b"".join([bytes(event.frame.data) async for event in stream])
            await stream.aclose()
            chunked = b"".join(
                [bytes(event.frame.data) async for event in tts.synthesize(TEXT, conn_options=CONNECT)]
            )
            await tts.aclose()
            return streamed, chunked

    streamed, chunked = asyncio.run(both())
    heard(whisper, streamed, 16000, TEXT, "LiveKit cartesia.TTS stream, 16 kHz")
    heard(whisper, chunked, 16000, TEXT, "LiveKit cartesia.TTS synthesize (/tts/bytes), 16 kHz")


def test_pipecat_cartesia_barge_in_leaves_nothing_of_the_cancelled_text(
    registry_servers: RegistryServers, whisper: Any
) -> None:
    """Pipecat's CartesiaTTSService speaks an answer, is interrupted mid-answer (it sends cancel), then
    speaks the next: heard as itself."""
    from pipecat.frames.frames import (
        InterruptionFrame,
        LLMFullResponseEndFrame,
        LLMFullResponseStartFrame,
        LLMTextFrame,
        TTSAudioRawFrame,
    )
    from pipecat.pipeline.task import PipelineParams
    from pipecat.services.cartesia.tts import CartesiaTTSService
    from pipecat.tests.utils import SleepFrame, run_test

    server = registry_servers("torch")
    answer = "Yes, go on."

    async def interrupted() -> list[Any]:
        service = CartesiaTTSService(
            api_key=KEY,
            url=server.url.replace("http://", "ws://") + "/tts/websocket",
            settings=CartesiaTTSService.Settings(voice="af_heart"),
            stop_frame_timeout_s=STOP_FRAME_TIMEOUT_S,
        )
        reply = [LLMFullResponseStartFrame(), LLMTextFrame(text=LONG_TEXT), LLMFullResponseEndFrame()]
        second = [LLMFullResponseStartFrame(), LLMTextFrame(text=answer), LLMFullResponseEndFrame()]
        frames = [
            *reply,
            SleepFrame(sleep=2.5),
            InterruptionFrame(),
            SleepFrame(sleep=1),
            *second,
            SleepFrame(sleep=0.5),
        ]
        params = PipelineParams(audio_out_sample_rate=24000)
        down, _ = await run_test(service, frames_to_send=frames, pipeline_params=params, start_timeout=10)
        return list(down)

    clears = server.log().count(" cleared (")
    down = asyncio.run(interrupted())
    assert server.log().count(" cleared (") == clears + 1  # the cancel dropped the answer on the server
    cut = next(i for i, frame in enumerate(down) if isinstance(frame, InterruptionFrame))
    after = b"".join(frame.audio for frame in down[cut:] if isinstance(frame, TTSAudioRawFrame))
    assert queue_depth(server.url) == 0.0
    said = heard(whisper, after, 24000, answer, "Pipecat CartesiaTTSService after an interruption")
    assert not set(LONG_TEXT.lower().split()) & set(
        said.lower().replace(",", "").replace(".", "").split()
    ) - {"on"}
