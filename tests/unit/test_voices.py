from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from api.engine.voices import VoiceStore, parse_voice_spec, style_for
from api.errors import InvalidRequestError


@pytest.fixture
def store(tmp_path: Path) -> VoiceStore:
    voices = tmp_path / "voices"
    voices.mkdir()
    for i, name in enumerate(["af_bella", "af_sky", "am_adam"]):
        torch.save(torch.full((510, 1, 256), float(i + 1)), voices / f"{name}.pt")
    (tmp_path / "secret.pt").write_bytes(b"not a voice")
    return VoiceStore(voices, aliases={"alloy": "af_bella"})


def test_names_lists_the_store(store: VoiceStore) -> None:
    assert store.names() == ["af_bella", "af_sky", "am_adam"]


def test_single_voice_and_alias(store: VoiceStore) -> None:
    assert store.resolve("af_sky").shape == (510, 256)
    assert np.all(store.resolve("af_sky") == 2.0)
    assert np.all(store.resolve("alloy") == 1.0)


def test_weighted_mix_is_normalized(store: VoiceStore) -> None:
    mixed = store.resolve("af_bella(2)+af_sky(1)")
    assert np.allclose(mixed, (2 * 1.0 + 1 * 2.0) / 3)


def test_plain_mix_is_the_mean(store: VoiceStore) -> None:
    assert np.allclose(store.resolve("af_bella+am_adam"), 2.0)


def test_subtraction(store: VoiceStore) -> None:
    assert np.allclose(store.resolve("am_adam-af_bella"), 3.0 - 1.0)


def test_mix_results_are_cached(store: VoiceStore) -> None:
    assert store.resolve("af_bella+af_sky") is store.resolve("af_bella+af_sky")


@pytest.mark.parametrize(
    "spec",
    ["../secret", "voices/../secret", "/etc/passwd", "af_bella+", "af_bella(x)", "", "af_bella)(", "a b"],
)
def test_bad_specs_and_paths_are_rejected(store: VoiceStore, spec: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        store.resolve(spec)
    assert info.value.param == "voice"


def test_unknown_voice_names_it_and_lists_some(store: VoiceStore) -> None:
    with pytest.raises(InvalidRequestError) as info:
        store.resolve("af_nobody")
    assert "af_nobody" in info.value.message
    assert "af_bella" in info.value.message


def test_a_name_that_is_a_file_outside_the_store_is_unknown(store: VoiceStore) -> None:
    with pytest.raises(InvalidRequestError):
        store.resolve("secret")


def test_parse_weights() -> None:
    terms = parse_voice_spec("a(2)+b(0.5)-c")
    assert [(t.name, t.weight) for t in terms] == [("a", 2.0), ("b", 0.5), ("c", -1.0)]


def test_style_row_is_length_minus_one() -> None:
    pack = np.arange(510 * 256, dtype=np.float32).reshape(510, 256)
    assert style_for(pack, 1)[0] == 0
    assert style_for(pack, 10)[0] == 9 * 256
    assert style_for(pack, 510)[0] == 509 * 256
