"""Voice files users bring: a `.pt` or `.safetensors` voice tensor read without unpickling anything but
plain tensors, checked whole in memory, and written atomically.

What is accepted (docs/voices.md#your-own-voices): one float32 tensor of shape (510, 1, 256), Kokoro's own
voice packs, or (510, 256), the same numbers without the middle axis; in a `.pt` file (torch.save of the
bare tensor, or of a dict holding exactly one tensor), read with torch's weights-only loader, or in a
`.safetensors` file holding exactly one tensor. Nothing else: other dtypes are refused rather than cast, so
a client learns that its file is not what it thinks. Every saved voice is written as Kokoro's own packs
are: a bare float32 (510, 1, 256) tensor, torch.save'd.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load as load_safetensors

from api.errors import InvalidRequestError
from api.text.phonemize import LANGUAGES

# Kokoro's voice names start with a language letter (api.text.phonemize.LANGUAGES) and a gender letter:
# af_heart, bm_george, zf_xiaobei.
VOICE_GENDERS = {"f": "female", "m": "male"}
PACK_ROWS = 510
STYLE_DIM = 256
PACK_SHAPE = (PACK_ROWS, 1, STYLE_DIM)
# A float32 pack is 510 x 256 x 4 = 522,240 bytes; its container adds about 1.5 KiB (.pt) or 100 bytes
# (.safetensors). A larger file holds something else, or a tensor that views a larger storage.
MAX_VOICE_FILE_BYTES = 640 * 1024
# A .pt file is a zip archive; what it unpacks to is bounded too (a deflated entry could be a bomb).
MAX_UNPACKED_BYTES = 2 * MAX_VOICE_FILE_BYTES
# Kokoro's naming scheme: the language letter (it picks the G2P language, as for a built-in voice), the
# gender letter, an underscore, then letters, digits and underscores: never a path, always one mix term.
VOICE_NAME = re.compile(r"([a-z])([a-z])_[A-Za-z0-9_]{1,60}")
SAFETENSORS_HEADER_START = 8  # an 8-byte header length, then the JSON header, which starts with "{"


def check_voice_name(name: str) -> None:
    """Raises InvalidRequestError unless `name` follows Kokoro's scheme with a known language and gender."""
    match = VOICE_NAME.fullmatch(name)
    if match is None or match.group(1) not in LANGUAGES or match.group(2) not in VOICE_GENDERS:
        raise InvalidRequestError(
            f"Invalid voice name '{name}': use Kokoro's scheme, a language letter "
            f"({''.join(sorted(LANGUAGES))}), a gender letter (f or m), '_', then 1-60 letters, digits or "
            "underscores, e.g. 'af_narrator'.",
            param="name",
            code="invalid_voice_name",
        )


def read_voice_file(data: bytes) -> np.ndarray[Any, Any]:
    """The (510, 256) float32 pack in a .pt or .safetensors file's bytes; InvalidRequestError otherwise."""
    if len(data) > MAX_VOICE_FILE_BYTES:
        raise file_too_large()
    tensor = _safetensors_tensor(data) if _is_safetensors(data) else _torch_tensor(data)
    return checked_pack(tensor)


def file_too_large() -> InvalidRequestError:
    return InvalidRequestError(
        f"The voice file is larger than {MAX_VOICE_FILE_BYTES} bytes; a Kokoro voice (float32, 510 x 1 x "
        "256) is about 524,000.",
        param="file",
        code="file_too_large",
    )


def checked_pack(tensor: torch.Tensor) -> np.ndarray[Any, Any]:
    """The tensor as a (510, 256) float32 pack, if it is a finite float32 (510, 1, 256) or (510, 256)."""
    if tuple(tensor.shape) not in (PACK_SHAPE, (PACK_ROWS, STYLE_DIM)):
        raise _invalid(
            f"The voice tensor has shape {list(tensor.shape)}; Kokoro's voices are [510, 1, 256] (or "
            "[510, 256]).",
            "invalid_voice_shape",
        )
    if tensor.dtype != torch.float32:
        raise _invalid(
            f"The voice tensor is {str(tensor.dtype).removeprefix('torch.')}; it must be float32 "
            "(tensor.float() converts it).",
            "invalid_voice_dtype",
        )
    pack: np.ndarray[Any, Any] = tensor.detach().reshape(PACK_ROWS, STYLE_DIM).numpy().copy()
    if not np.isfinite(pack).all():
        raise _invalid("The voice tensor holds NaN or infinite values.", "invalid_voice_values")
    return pack


def pack_bytes(pack: np.ndarray[Any, Any]) -> bytes:
    """A pack as Kokoro's voice files are: torch.save of a bare float32 (510, 1, 256) tensor."""
    buffer = io.BytesIO()
    torch.save(torch.from_numpy(np.ascontiguousarray(pack, dtype=np.float32)).reshape(PACK_SHAPE), buffer)
    return buffer.getvalue()


def write_atomically(path: Path, data: bytes) -> None:
    """`data` at `path`, whole or not at all: written to a temporary file in the same directory, flushed to
    disk, then renamed over `path` (a reader, or a concurrent writer of the same name, never sees a part)."""
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
    _sync_directory(path.parent)


def _sync_directory(directory: Path) -> None:
    # The rename itself is durable once the directory is flushed (POSIX; a no-op where it cannot be opened).
    with contextlib.suppress(OSError):
        descriptor = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)


def _is_safetensors(data: bytes) -> bool:
    return data[SAFETENSORS_HEADER_START : SAFETENSORS_HEADER_START + 1] == b"{"


def _safetensors_tensor(data: bytes) -> torch.Tensor:
    try:
        tensors = load_safetensors(data)
    except (SafetensorError, ValueError, RuntimeError) as exc:
        raise _unreadable(f"it is not a valid safetensors file ({exc})") from exc
    return _only_tensor(tensors)


def _torch_tensor(data: bytes) -> torch.Tensor:
    if zipfile.is_zipfile(io.BytesIO(data)):
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            if sum(info.file_size for info in archive.infolist()) > MAX_UNPACKED_BYTES:
                raise file_too_large()
    try:
        loaded: Any = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as exc:  # the weights-only unpickler refuses anything but tensors and plain containers
        raise _unreadable(f"torch's weights-only loader refused it ({type(exc).__name__})") from exc
    if isinstance(loaded, torch.Tensor):
        return loaded
    if isinstance(loaded, dict):
        return _only_tensor(loaded)
    raise _unreadable(f"it holds a {type(loaded).__name__}, not a tensor")


def _only_tensor(tensors: dict[Any, Any]) -> torch.Tensor:
    values = list(tensors.values())
    if len(values) != 1 or not isinstance(values[0], torch.Tensor):
        raise _unreadable(f"it holds {len(values)} entries; a voice file holds exactly one tensor")
    tensor: torch.Tensor = values[0]
    return tensor


def _unreadable(why: str) -> InvalidRequestError:
    return _invalid(
        f"The file is not a voice tensor: {why}. Send a .pt file (torch.save of one tensor) or a "
        ".safetensors file with one tensor.",
        "invalid_voice_file",
    )


def _invalid(message: str, code: str) -> InvalidRequestError:
    return InvalidRequestError(message, param="file", code=code)
