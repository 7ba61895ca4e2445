"""The weights directory the server reads, laid out like the hub repository hexgrad/Kokoro-82M.

```
config.json          model configuration (vocab, layer sizes)
kokoro-v1_0.pth      checkpoint: {component: {'module.' + key: tensor}}
voices/NAME.pt       one voice pack per voice: float32 tensor (510, 1, 256)
```

Also the checks every source applies before a file is put in place: sha256, voice-pack shape and the
model-relevant part of the config. Files are only ever written through `atomic_write`, so a reader
never sees half a file.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

CONFIG_FILE = "config.json"
CHECKPOINT_FILE = "kokoro-v1_0.pth"
# The int8 ONNX model (registry source only; the ONNX Runtime engine reads it).
ONNX_FILE = "kokoro-v1_0.int8.onnx"
VOICES_DIR = "voices"
VOICE_SUFFIX = ".pt"

# The model's positional limit is 512 tokens, two of which are the boundary tokens added around a chunk.
MAX_PHONEMES = 510
STYLE_WIDTH = 256
VOICE_PACK_SHAPE = (MAX_PHONEMES, 1, STYLE_WIDTH)

# The keys that change what the model computes; the rest (e.g. "multispeaker") are informational.
MODEL_CONFIG_KEYS = (
    "vocab",
    "n_token",
    "plbert",
    "istftnet",
    "hidden_dim",
    "style_dim",
    "n_layer",
    "max_dur",
    "dropout",
    "text_encoder_kernel_size",
    "n_mels",
)

OFFICIAL_VOICES: tuple[str, ...] = (
    "af_alloy", "af_aoede", "af_bella", "af_heart", "af_jessica", "af_kore", "af_nicole", "af_nova",
    "af_river", "af_sarah", "af_sky",
    "am_adam", "am_echo", "am_eric", "am_fenrir", "am_liam", "am_michael", "am_onyx", "am_puck", "am_santa",
    "bf_alice", "bf_emma", "bf_isabella", "bf_lily",
    "bm_daniel", "bm_fable", "bm_george", "bm_lewis",
    "ef_dora", "em_alex", "em_santa",
    "ff_siwis",
    "hf_alpha", "hf_beta", "hm_omega", "hm_psi",
    "if_sara", "im_nicola",
    "jf_alpha", "jf_gongitsune", "jf_nezumi", "jf_tebukuro", "jm_kumo",
    "pf_dora", "pm_alex", "pm_santa",
    "zf_xiaobei", "zf_xiaoni", "zf_xiaoxiao", "zf_xiaoyi",
    "zm_yunjian", "zm_yunxi", "zm_yunxia", "zm_yunyang",
)  # fmt: skip

_HASH_CHUNK = 1 << 20


class HashMismatchError(Exception):
    """A file's sha256 is not the one pinned or published for it."""

    def __init__(self, path: str | Path, expected: str, actual: str) -> None:
        super().__init__(f"{path}: sha256 mismatch: expected {expected}, got {actual}")
        self.path = str(path)
        self.expected = expected
        self.actual = actual


class ConfigMismatchError(ValueError):
    """A config.json whose model-relevant content differs from the Kokoro-82M config shipped with us."""


@dataclass(frozen=True)
class WeightsLayout:
    """Paths inside one weights directory, and whether everything the server needs is there."""

    root: Path

    @property
    def config_path(self) -> Path:
        return self.root / CONFIG_FILE

    @property
    def checkpoint_path(self) -> Path:
        return self.root / CHECKPOINT_FILE

    @property
    def onnx_path(self) -> Path:
        return self.root / ONNX_FILE

    @property
    def voices_dir(self) -> Path:
        return self.root / VOICES_DIR

    def voice_path(self, name: str) -> Path:
        return self.voices_dir / f"{name}{VOICE_SUFFIX}"

    def voice_names(self) -> list[str]:
        if not self.voices_dir.is_dir():
            return []
        return sorted(path.stem for path in self.voices_dir.glob(f"*{VOICE_SUFFIX}") if path.is_file())

    def missing(self) -> list[str]:
        """What is missing, relative to root; empty when the layout is complete."""
        missing = [name for name in (CONFIG_FILE, CHECKPOINT_FILE) if not (self.root / name).is_file()]
        if not self.voice_names():
            missing.append(f"{VOICES_DIR}/*{VOICE_SUFFIX} (no voice packs)")
        return missing

    def is_complete(self) -> bool:
        return not self.missing()


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while chunk := file.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def verify_sha256(path: Path, expected: str, *, name: str | Path | None = None) -> None:
    """Raise HashMismatchError (naming `name`, default `path`) unless the file hashes to `expected`."""
    actual = sha256_file(path)
    if actual != expected.lower():
        raise HashMismatchError(name if name is not None else path, expected.lower(), actual)


@contextmanager
def atomic_write(dest: Path) -> Iterator[Path]:
    """Yield a temporary path beside `dest`; on success it replaces `dest`, on any error it is removed.

    The temporary file lives in the same directory so the final `os.replace` is atomic.
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        os.replace(tmp, dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def check_voice_pack(tensor: object, name: str) -> torch.Tensor:
    """Return `tensor` if it is a usable voice pack, else raise ValueError saying what is wrong."""
    import torch  # here, not at the top: `python -m api` reads the layout before it may load torch

    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"voice {name!r}: expected a tensor, got {type(tensor).__name__}")
    if tuple(tensor.shape) != VOICE_PACK_SHAPE:
        raise ValueError(f"voice {name!r}: shape {tuple(tensor.shape)}, expected {VOICE_PACK_SHAPE}")
    if tensor.dtype != torch.float32:
        raise ValueError(f"voice {name!r}: dtype {tensor.dtype}, expected torch.float32")
    if not bool(torch.isfinite(tensor).all()):
        raise ValueError(f"voice {name!r}: contains NaN or infinite values")
    return tensor


def load_voice_pack(path: Path, name: str | None = None) -> torch.Tensor:
    """Load a voice pack (tensors only, no pickled code) and check it."""
    import torch

    tensor = torch.load(path, map_location="cpu", weights_only=True)
    return check_voice_pack(tensor, name or path.stem)


def shipped_config() -> dict[str, Any]:
    """The Kokoro-82M v1.0 config shipped in this package (api/data/kokoro-82m-config.json)."""
    text = (resources.files("api") / "data" / "kokoro-82m-config.json").read_text(encoding="utf-8")
    config: dict[str, Any] = json.loads(text)
    return config


def config_differences(config: Mapping[str, Any], reference: Mapping[str, Any]) -> list[str]:
    """The model-relevant keys whose values differ between `config` and `reference`."""
    return [key for key in MODEL_CONFIG_KEYS if config.get(key) != reference.get(key)]


def check_config(config: object, *, name: str = CONFIG_FILE) -> None:
    """Raise ConfigMismatchError unless `config` matches the shipped config in every model-relevant key."""
    if not isinstance(config, dict):
        raise ConfigMismatchError(f"{name}: expected a JSON object, got {type(config).__name__}")
    differing = config_differences(config, shipped_config())
    if differing:
        raise ConfigMismatchError(f"{name}: differs from the Kokoro-82M config in {', '.join(differing)}")


def load_config(path: Path) -> dict[str, Any]:
    """Parse a config.json (ValueError if it is not JSON) without judging its content."""
    config: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return config
