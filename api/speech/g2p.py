"""The G2P thread: normalization and phonemization run on one thread of their own (misaki's G2P objects are
not thread-safe), off the event loop; and /dev/phonemize, which runs the speech path's G2P on a text."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import TypeVar

from api.settings import Settings
from api.text.chunk import Word, phonemes_of
from api.text.lexicon import Lexicon
from api.text.normalize import NormalizationOptions, normalize_tracked
from api.text.phonemize import Phonemizer
from api.text.tracked import Tracked

T = TypeVar("T")


class G2P:
    """Owns the G2P thread and the phonemizer it runs: normalizes text (the lexicon and the server's date
    order included) and turns it into words with phonemes, one call at a time."""

    def __init__(self, phonemizer: Phonemizer, lexicon: Lexicon | None, settings: Settings) -> None:
        self.phonemizer = phonemizer
        self.lexicon = lexicon
        self.date_order = settings.date_order
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="g2p")

    def close(self) -> None:
        self._thread.shutdown(wait=False, cancel_futures=True)

    async def normalized(
        self, text: str, *, lang_code: str, options: NormalizationOptions | None = None, offset: int = 0
    ) -> Tracked:
        """`text` normalized in `lang_code`, its positions counted from `offset` in the input."""
        normalize = partial(
            normalize_tracked,
            options=options,
            lang_code=lang_code,
            date_order=self.date_order,
            offset=offset,
            lexicon=self.lexicon,
        )
        return await self._run(normalize, text)

    async def words(self, lang_code: str, text: str) -> list[Word]:
        return await self._run(partial(self.phonemizer.words, text, lang_code))

    async def phonemize(self, text: str, lang_code: str, vocab: Mapping[str, int]) -> tuple[str, list[int]]:
        """Kokoro-FastAPI's /dev/phonemize: the text normalized (lexicon included) and phonemized as the
        speech path does it; its phonemes and their token ids."""
        normalized = await self.normalized(text, lang_code=lang_code)
        phonemes = phonemes_of(await self.words(lang_code, normalized.text))
        return phonemes, [vocab[symbol] for symbol in phonemes if symbol in vocab]

    async def _run(self, call: Callable[..., T], *args: object) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._thread, call, *args)
