"""Settings come from KOKORO_* environment variables."""

from __future__ import annotations

import pytest

from api.settings import Settings


def test_environment_overrides_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KOKORO_MAX_INFLIGHT", "7")
    monkeypatch.setenv("KOKORO_ENGINE", "onnx")
    settings = Settings()
    assert settings.max_inflight == 7
    assert settings.engine == "onnx"
    assert settings.seed == 0


def test_seed_none_means_fresh_noise(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KOKORO_SEED", "none")
    assert Settings().seed is None


def test_bad_values_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KOKORO_ENGINE", "tensorrt")
    with pytest.raises(ValueError, match="engine"):
        Settings()
