"""Encoding off the event loop: every response's encoder runs on a shared pool of encode threads."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from api.audio.encoder import AudioEncoder, create_encoder
from api.audio.formats import AudioFormat
from api.audio.telephony import RawEncoder, RawEncoding
from api.settings import Settings


class OffLoopEncoder:
    """One response's encoder, run on the encode threads one call at a time. Closed only once no call
    is running: a client that leaves mid-stream cancels the await, not the call, and closing a PyAV
    encoder while it encodes crashed the whole process (found by scripts/bench/soak.py)."""

    def __init__(self, encoder: AudioEncoder, threads: ThreadPoolExecutor) -> None:
        self._encoder = encoder
        self._threads = threads
        self._running: Future[bytes] | None = None

    async def encode(self, samples: np.ndarray[Any, Any]) -> bytes:
        return await self._run(self._encoder.encode, samples)

    async def finish(self) -> bytes:
        return await self._run(self._encoder.finish)

    def close(self) -> None:
        running = self._running
        if running is not None and not running.done():
            running.add_done_callback(lambda _: self._encoder.close())
        else:
            self._encoder.close()

    async def _run(self, call: Callable[..., bytes], *args: object) -> bytes:
        self._running = self._threads.submit(call, *args)
        return await asyncio.wrap_future(self._running)


class Encoders:
    """Makes the responses' encoders (a format's, with the server's MP3 settings, or headerless audio for
    the voice-agent protocols), each an OffLoopEncoder over the one pool of encode threads."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._threads = ThreadPoolExecutor(
            max_workers=max(4, settings.max_inflight), thread_name_prefix="encode"
        )

    def close(self) -> None:
        self._threads.shutdown(wait=False, cancel_futures=True)

    def formatted(self, response_format: AudioFormat, rate: int, *, streaming: bool) -> OffLoopEncoder:
        """An encoder of `response_format` for audio at `rate`; `streaming`: its bytes go out as made."""
        encoder = create_encoder(
            response_format,
            rate,
            streaming=streaming,
            mp3_kbps=self.settings.mp3_kbps,
            mp3_quality=self.settings.mp3_quality,
        )
        return self.offloop(encoder)

    def raw(self, encoding: RawEncoding, rate: int, source_rate: int) -> OffLoopEncoder:
        """Headerless audio at `rate`, resampled from `source_rate`."""
        return self.offloop(RawEncoder(encoding, rate, source_rate))

    def offloop(self, encoder: AudioEncoder) -> OffLoopEncoder:
        return OffLoopEncoder(encoder, self._threads)
