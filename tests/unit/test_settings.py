"""Settings come from KOKORO_* environment variables."""

from __future__ import annotations

import pytest

from api.engine.scheduling.batching import BatchOverrides
from api.server.app import batch_overrides
from api.settings import Settings
from api.speech.planning import chunk_limits


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


def test_batching_defaults_to_the_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    assert batch_overrides(Settings()) == BatchOverrides()
    monkeypatch.setenv("KOKORO_MAX_BATCH_SIZE", "8")
    monkeypatch.setenv("KOKORO_BATCH_TIMEOUT_MS", "12.5")
    monkeypatch.setenv("KOKORO_MAX_BATCH_TOKENS", "3000")
    overrides = batch_overrides(Settings())
    assert overrides == BatchOverrides(max_batch_size=8, batch_timeout=0.0125, max_batch_tokens=3000)


def test_bad_batching_values_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KOKORO_MAX_BATCH_SIZE", "0")
    with pytest.raises(ValueError, match="max_batch_size"):
        Settings()
    monkeypatch.setenv("KOKORO_MAX_BATCH_SIZE", "2")
    monkeypatch.setenv("KOKORO_BATCH_TIMEOUT_MS", "-1")
    with pytest.raises(ValueError, match="batch_timeout_ms"):
        Settings()


def test_chunk_limits_follow_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    limits = chunk_limits(Settings())
    assert (limits.target_min, limits.target_max, limits.hard_max, limits.tail_min) == (100, 150, 250, 50)
    monkeypatch.setenv("KOKORO_CHUNK_MIN_TOKENS", "30")  # a tail longer than a chunk's minimum is capped
    assert chunk_limits(Settings()).tail_min == 30
    monkeypatch.setenv("KOKORO_CHUNK_TAIL_MIN_TOKENS", "0")
    assert chunk_limits(Settings()).tail_min == 0
