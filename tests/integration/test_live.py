"""Live text through a real server with the real weights: text typed as an LLM writes it (a few characters
at a time, 30 ms apart) is heard by whisper as written, with nothing lost or doubled where phrases join,
and its word timings come in order, in the words typed; a clear empties the engine's queue."""

from __future__ import annotations

import asyncio
import io
import json
import wave
from typing import Any

from websockets.asyncio.client import connect

from scripts.bench.live import LONG_TEXT, llm_tokens, queue_depth, speak_live, ws_url
from scripts.hearing import MAX_WER, transcribe, word_error_rate
from tests.integration.conftest import RegistryServers

# Three sentences whose phrases join mid-sentence too (a clause cut), with a title, money and a number
# that arrive in pieces ('Dr.' + ' Smi' + 'th', '$3,' + '497.50').
TEXT = (
    "Dr. Smith paid $3,497.50 for the old piano, and it sounds wonderful in the evening. "
    "The children play it every day after school. It will last for many years."
)
TOKEN_S = 0.03


def wav_of(pcm: bytes) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as file:
        file.setnchannels(1)
        file.setsampwidth(2)
        file.setframerate(24000)
        file.writeframes(pcm)
    return out.getvalue()


def test_text_typed_as_an_llm_writes_it_is_heard_as_written(
    registry_servers: RegistryServers, whisper: Any
) -> None:
    server = registry_servers("torch")
    tokens = llm_tokens(TEXT)
    assert "".join(tokens) == TEXT
    assert any(not token.startswith(" ") for token in tokens[1:])  # words arrive in pieces
    session = {"voice": "af_heart", "return_timestamps": True, "response_format": "pcm"}
    heard = asyncio.run(speak_live(server.url, tokens, TOKEN_S, session=session))
    assert not heard.errors
    assert heard.done is not None
    print(f"first audio {heard.arrivals[0] - heard.sent['first']:.2f} s after the first token")

    said = transcribe(whisper, wav_of(bytes(heard.audio)))
    wer = word_error_rate([(TEXT, said)])
    print(f"live, WER {wer:.3f}: {said}")
    assert wer <= MAX_WER

    words = [stamp["word"] for stamp in heard.timestamps]
    assert words == TEXT.split()  # each typed word once, as typed
    starts = [stamp["start_time"] for stamp in heard.timestamps]
    assert starts == sorted(starts)
    assert all(stamp["start_time"] <= stamp["end_time"] for stamp in heard.timestamps)
    assert heard.timestamps[-1]["end_time"] <= len(heard.audio) / 48000 + 0.05


def test_clear_empties_the_engine_queue(registry_servers: RegistryServers) -> None:
    server = registry_servers("torch")

    async def barge_in() -> list[str]:
        async with connect(ws_url(server.url)) as ws:
            await ws.send(json.dumps({"type": "input_text.append", "text": LONG_TEXT + " And"}))
            while json.loads(await ws.recv())["type"] != "speech.audio.delta":
                pass
            await ws.send(json.dumps({"type": "input_text.clear"}))
            types = []
            while (kind := json.loads(await ws.recv())["type"]) != "input_text.cleared":
                types.append(kind)
            assert queue_depth(server.url) == 0.0
            await ws.send(json.dumps({"type": "input_text.append", "text": "Yes?"}))
            await ws.send(json.dumps({"type": "input_text.done"}))
            after = []
            while (kind := json.loads(await ws.recv())["type"]) != "speech.audio.done":
                after.append(kind)
            assert after
            assert set(after) == {"speech.audio.delta"}
            return types

    assert set(asyncio.run(barge_in())) <= {"speech.audio.delta"}
