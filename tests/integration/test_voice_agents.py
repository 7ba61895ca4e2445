"""The voice-agent frameworks' own TTS plugins, unchanged, pointed at a real server over the registry weights
by base URL (docs/api.md#voice-agents): LiveKit's Deepgram, ElevenLabs, Cartesia and OpenAI plugins here,
Pipecat's services for the same four in test_pipecat.py. Text goes in word by word as an LLM writes it; the
audio that comes back is heard by whisper; a barge-in mid-answer leaves no audio of the interrupted text."""

from __future__ import annotations

import asyncio
import io
import json
import wave
from collections.abc import Callable
from typing import Any

import aiohttp
import av
import httpx
import numpy as np
import pytest
from livekit.agents import APIConnectOptions
from livekit.plugins import cartesia as livekit_cartesia
from livekit.plugins import deepgram as livekit_deepgram
from livekit.plugins import elevenlabs as livekit_elevenlabs
from livekit.plugins import openai as livekit_openai
from websockets.asyncio.client import connect

from scripts.bench.live import LONG_TEXT, queue_depth
from scripts.harness import Server
from scripts.hearing import MAX_WER, transcribe, word_error_rate
from tests.integration.conftest import RegistryServers

TEXT = (
    "The river ran quietly past the old mill. Children waved from the bridge as the boats went by, "
    "and the evening light turned the water gold."
)
ANSWER = "Yes, go on."  # what is said after a barge-in
KEY = "agent-test-key"
CONNECT = APIConnectOptions(max_retry=0, timeout=60)
# How long the interrupted answer speaks before the barge-in.
SPEAKING_S = 2.5


def wav_of(pcm: bytes, rate: int) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as file:
        file.setnchannels(1)
        file.setsampwidth(2)
        file.setframerate(rate)
        file.writeframes(pcm)
    return out.getvalue()


def heard(whisper: Any, pcm: bytes, rate: int, text: str, label: str) -> str:
    said = str(transcribe(whisper, wav_of(pcm, rate)))
    wer = word_error_rate([(text, said)])
    print(f"{label}: WER {wer:.3f}: {said}")
    assert wer <= MAX_WER, said
    return said


def only_the_answer(whisper: Any, pcm: bytes, rate: int, label: str) -> None:
    """What came after a barge-in is the next answer, and none of the interrupted one."""
    said = heard(whisper, pcm, rate, ANSWER, label)
    words = set(said.lower().replace(",", "").replace(".", "").split())
    assert not set(LONG_TEXT.lower().split()) & words - {"on"}


# --- LiveKit -----------------------------------------------------------------------------------------------

LIVEKIT: dict[str, Callable[[str, aiohttp.ClientSession], Any]] = {
    "deepgram": lambda url, http: livekit_deepgram.TTS(
        model="af_heart", sample_rate=16000, base_url=f"{url}/v1/speak", api_key=KEY, http_session=http
    ),
    "elevenlabs": lambda url, http: livekit_elevenlabs.TTS(
        voice_id="af_heart", encoding="pcm_16000", base_url=f"{url}/v1", api_key=KEY, http_session=http
    ),
    "cartesia": lambda url, http: livekit_cartesia.TTS(
        voice="af_heart", sample_rate=16000, base_url=url, api_key=KEY, http_session=http
    ),
}


async def livekit_speech(vendor: str, url: str, text: str) -> tuple[bytes, bytes]:
    """The plugin's stream (words pushed as an LLM's tokens arrive) and its non-streaming synthesize."""
    async with aiohttp.ClientSession() as http:
        tts = LIVEKIT[vendor](url, http)
        stream = tts.stream(conn_options=CONNECT)
        for word in text.split(" "):
            stream.push_text(word + " ")
            await asyncio.sleep(0.01)
        stream.flush()
        stream.end_input()
        streamed = b"".join([bytes(event.frame.data) async for event in stream])
        await stream.aclose()
        whole = b"".join(
            [bytes(event.frame.data) async for event in tts.synthesize(text, conn_options=CONNECT)]
        )
        await tts.aclose()
        return streamed, whole


@pytest.mark.parametrize("vendor", sorted(LIVEKIT))
def test_livekit_plugin_streams_words_in_and_speech_out(
    registry_servers: RegistryServers, whisper: Any, vendor: str
) -> None:
    streamed, whole = asyncio.run(livekit_speech(vendor, registry_servers("torch").url, TEXT))
    heard(whisper, streamed, 16000, TEXT, f"LiveKit {vendor} stream, 16 kHz")
    heard(whisper, whole, 16000, TEXT, f"LiveKit {vendor} synthesize, 16 kHz")


def test_livekit_openai_plugin_over_sse(registry_servers: RegistryServers, whisper: Any) -> None:
    """LiveKit's openai.TTS asks for SSE (`speech.audio.delta`) unless the model is tts-1 or tts-1-hd (whose
    plain audio stream the OpenAI SDK's tests cover, tests/integration/test_openai_sdk.py)."""
    model = "gpt-4o-mini-tts"
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


def cleared(server: Server) -> int:
    return server.log().count(" cleared (")


# --- The protocols' own barge-in and telephony, over their sockets and POSTs ----------------------------


def test_deepgram_clear_drops_the_rest_of_the_utterance(
    registry_servers: RegistryServers, whisper: Any
) -> None:
    """Deepgram's Clear on the raw socket: after `Cleared` nothing of the cleared text arrives; the next
    utterance is heard as itself."""
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
            await ws.send(json.dumps({"type": "Speak", "text": ANSWER}))
            await ws.send(json.dumps({"type": "Flush"}))
            after = bytearray()
            while isinstance(message := await ws.recv(), bytes):
                after += message
            assert json.loads(message) == {"type": "Flushed", "sequence_id": 1}
            return before, bytes(after)

    before, after = asyncio.run(barge_in())
    assert set(before) <= {"audio"}
    only_the_answer(whisper, after, 24000, "Deepgram after Clear")


def test_mulaw_at_8khz_is_heard(registry_servers: RegistryServers, whisper: Any) -> None:
    """Telephony's G.711 μ-law; A-law and 16-bit PCM at other rates go through the same resampler and
    codecs (tests/unit/test_telephony.py)."""
    server = registry_servers("torch")
    response = httpx.post(
        f"{server.url}/v1/speak?model=af_heart&encoding=mulaw&sample_rate=8000",
        json={"text": TEXT},
        headers={"Authorization": f"Token {KEY}"},
        timeout=120,
    )
    assert response.status_code == 200, response.text
    codec = av.CodecContext.create("pcm_mulaw", "r")
    assert isinstance(codec, av.AudioCodecContext)
    codec.sample_rate = 8000
    codec.layout = "mono"
    frames = codec.decode(av.Packet(response.content))
    pcm = np.concatenate([frame.to_ndarray().reshape(-1) for frame in frames]).astype("<i2").tobytes()
    heard(whisper, pcm, 8000, TEXT, "POST /v1/speak mulaw 8000 Hz")
