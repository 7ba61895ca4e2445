"""The Wyoming service as Home Assistant meets it, on a real server over the registry weights: found over
zeroconf (`_wyoming._tcp`), described, a plain synthesize and a paragraph streamed a few words at a time
through the `wyoming` package's own client, the audio (resampled to 22,050 Hz, as a satellite may ask)
heard by whisper, and the stream's first audio before its synthesize-stop."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import jiwer
from wyoming.audio import AudioChunk, AudioStart
from wyoming.client import AsyncTcpClient
from wyoming.event import Event
from wyoming.info import Describe, Info
from wyoming.tts import Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop, SynthesizeVoice
from zeroconf import Zeroconf

from api.audio.encoder import wav_header
from api.live.discovery import SERVICE_TYPE
from scripts.harness import free_port, running_server
from scripts.hearing import normalize, transcribe

RATE = 22050
MAX_WER = 0.2
PLAIN = "The kitchen lights are now off, and the front door is locked for the night."
STREAMED = (
    "Tomorrow will be cloudy in the morning with a chance of light rain. In the afternoon the sun comes "
    "out and the temperature climbs to twenty two degrees."
)


async def read_until(client: AsyncTcpClient, last: str) -> list[Event]:
    events = []
    while True:
        event = await asyncio.wait_for(client.read_event(), 120)
        assert event is not None, events
        assert event.type != "error", event.data
        events.append(event)
        if event.type == last:
            return events


def heard(whisper: Any, events: list[Event]) -> str:
    audio = b"".join(AudioChunk.from_event(event).audio for event in events if event.type == "audio-chunk")
    return transcribe(whisper, wav_header(RATE, len(audio)) + audio)


def test_home_assistant_finds_describes_and_hears_the_service(
    registry_weights: Path,
    tmp_path: Path,
    whisper: Any,
) -> None:
    port = free_port()
    name = f"kokoro-test-{port}"
    env = {
        "KOKORO_ENGINE": "torch",
        "KOKORO_WYOMING": "true",
        "KOKORO_WYOMING_PORT": str(port),
        "KOKORO_WYOMING_SAMPLE_RATE": str(RATE),
        "KOKORO_WYOMING_ZEROCONF": name,
        "KOKORO_DATA_DIR": "none",
    }
    with running_server(registry_weights, tmp_path / "server.log", **env) as server:
        browser = Zeroconf(interfaces=["127.0.0.1"])
        try:
            found = browser.get_service_info(SERVICE_TYPE, f"{name}.{SERVICE_TYPE}", timeout=5000)
        finally:
            browser.close()
        assert found is not None, server.log_tail()
        assert found.port == port

        async def session() -> tuple[Info, list[Event], list[Event], list[Event]]:
            async with AsyncTcpClient("127.0.0.1", port) as client:
                await client.write_event(Describe().event())
                info = Info.from_event((await read_until(client, "info"))[0])
                await client.write_event(
                    Synthesize(text=PLAIN, voice=SynthesizeVoice(name="af_heart")).event()
                )
                plain = await read_until(client, "audio-stop")
                await client.write_event(SynthesizeStart(voice=SynthesizeVoice(language="en-US")).event())
                words = STREAMED.split(" ")
                reading = asyncio.create_task(read_until(client, "audio-chunk"))
                for at in range(0, len(words), 3):  # three words at a time, as an LLM writes
                    await client.write_event(SynthesizeChunk(text=" ".join(words[at : at + 3]) + " ").event())
                    await asyncio.sleep(0.05)
                    if reading.done():
                        break
                early = await reading  # before synthesize-stop
                for rest in range(at + 3, len(words), 3):
                    await client.write_event(
                        SynthesizeChunk(text=" ".join(words[rest : rest + 3]) + " ").event()
                    )
                await client.write_event(SynthesizeStop().event())
                streamed = early + await read_until(client, "synthesize-stopped")
                return info, plain, streamed, early

        info, plain, streamed, early = asyncio.run(session())

    (program,) = info.tts
    assert program.supports_synthesize_streaming
    assert {voice.name: voice.languages for voice in program.voices}["af_heart"] == ["en-US"]
    assert AudioStart.from_event(plain[0]).rate == RATE
    assert early[-1].type == "audio-chunk"  # audio came before the stream was stopped
    for events, text in ((plain, PLAIN), (streamed, STREAMED)):
        said = heard(whisper, events)
        error = jiwer.wer(normalize(text), normalize(said))
        assert error <= MAX_WER, (text, said, error)
