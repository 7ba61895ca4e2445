"""The voice library: custom voices added from a tensor file or saved from a mix, deleted, and any voice or
mix given back as a `.pt` file. The voice routes (api/server/routes/voices.py) call this and nothing else."""

from __future__ import annotations

from starlette.concurrency import run_in_threadpool

from api.engine.voice_files import check_voice_name, pack_bytes, read_voice_file
from api.engine.voices import VoiceStore
from api.errors import ForbiddenError, InvalidRequestError


class VoiceLibrary:
    """Checks what a client asks to add or remove (uploads on, a Kokoro-scheme name that is not a built-in
    voice's, a valid tensor) before the store writes anything; file reading and writing run off the loop."""

    def __init__(self, store: VoiceStore, *, uploads: bool) -> None:
        self.store = store
        self.uploads = uploads and store.custom_dir is not None

    async def add_file(self, name: str, data: bytes) -> None:
        self._check_name(name)
        pack = await run_in_threadpool(read_voice_file, data)
        await run_in_threadpool(self.store.save, name, pack)

    async def add_mix(self, name: str, spec: str) -> None:
        """Saves the mix's pack as it is now: a later change to its voices does not change it."""
        self._check_name(name)
        pack = await run_in_threadpool(self.store.resolve, spec)
        await run_in_threadpool(self.store.save, name, pack)

    async def remove(self, name: str) -> None:
        self._check_uploads()
        if self.store.is_builtin(name):
            raise InvalidRequestError(
                f"'{name}' is a built-in voice; only uploaded voices can be deleted.",
                param="name",
                code="builtin_voice",
            )
        await run_in_threadpool(self.store.delete, name)

    async def download(self, spec: str) -> bytes:
        """A voice or mix as Kokoro's voice files are (torch.save of a float32 (510, 1, 256) tensor)."""
        pack = await run_in_threadpool(self.store.resolve, spec)
        return pack_bytes(pack)

    def _check_name(self, name: str) -> None:
        self._check_uploads()
        check_voice_name(name)
        if self.store.is_builtin(name):
            raise InvalidRequestError(
                f"'{name}' is a built-in voice's name; choose another.", param="name", code="voice_name_taken"
            )

    def _check_uploads(self) -> None:
        if not self.uploads:
            raise ForbiddenError(
                "Voice uploads are turned off on this server (KOKORO_VOICE_UPLOADS, and a "
                "KOKORO_CUSTOM_VOICES_DIR to keep them in).",
                code="voice_uploads_disabled",
            )


def combined_spec(voices: str | list[str]) -> str:
    """Kokoro-FastAPI's combine body, a string `a+b` (weights and `-` allowed) or a list of voice names, as
    one mix spec."""
    names = [voices] if isinstance(voices, str) else voices
    names = [name.strip() for name in names if name.strip()]
    if not names:
        raise InvalidRequestError("Name at least one voice to combine.", param="voices", code="invalid_voice")
    return "+".join(names)
