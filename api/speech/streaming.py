"""A speech response's byte stream: started before the response so that early failures keep their status,
and framed as server-sent events when the request asks for them."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing

from api.protocol import SpeechAudioDelta, SpeechAudioDone, WordTimestamp
from api.speech.job import Piece, SpeechJob


async def started(stream: AsyncGenerator[bytes, None]) -> AsyncIterator[bytes]:
    """Run a stream up to its first bytes before the response starts, so that failures before any audio
    still get a proper status; the returned iterator yields those bytes, then the rest."""
    try:
        first = await anext(stream)
    except StopAsyncIteration:
        first = b""

    async def resumed() -> AsyncIterator[bytes]:
        async with aclosing(stream):
            yield first
            async for data in stream:
                yield data

    return resumed()


async def speech_events(job: SpeechJob, pieces: AsyncGenerator[Piece, None]) -> AsyncGenerator[bytes, None]:
    """Server-sent events: speech.audio.delta per encoded piece (with its words' timestamps when the job
    has captions), then speech.audio.done with the job's usage."""
    async with aclosing(pieces):
        async for piece in pieces:
            timestamps = None
            if job.captions is not None:
                timestamps = [WordTimestamp(**vars(word)) for word in piece.words]
            audio = base64.b64encode(piece.data).decode("ascii")
            yield sse(SpeechAudioDelta(audio=audio, timestamps=timestamps))
    yield sse(SpeechAudioDone(usage=job.usage))


def sse(event: SpeechAudioDelta | SpeechAudioDone) -> bytes:
    """One server-sent event: json.dumps' spacing, as these events have always been written; a delta
    without timestamps has none."""
    return f"data: {json.dumps(event.model_dump(exclude_none=True))}\n\n".encode()
