"""The real int8 graph cut into stages speaks exactly as the whole graph does, whatever the cuts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from api.engine.base import ChunkAudio, SynthesisItem
from api.engine.onnx_engine import OnnxEngine
from api.engine.voices import VoiceStore, style_for
from api.text.phonemize import Phonemizer

TEXTS = (
    "Ships passed safely through the channel.",
    "Nobody could remember a wreck there, not even the keeper.",
)


@pytest.fixture(scope="module")
def whole(registry_weights: Path) -> OnnxEngine:
    engine = OnnxEngine(registry_weights, threads=2, stages=1, warmup=False)
    engine.load()
    return engine


@pytest.fixture(scope="module")
def items(whole: OnnxEngine, registry_weights: Path) -> list[SynthesisItem]:
    phonemizer = Phonemizer()
    pack = VoiceStore(registry_weights / "voices").resolve("af_heart")
    result = []
    for text in TEXTS:
        tokens = tuple(whole.vocab[p] for p in phonemizer.phonemize(text, "a") if p in whole.vocab)
        result.append(SynthesisItem(tokens, style_for(pack, len(tokens)), 1.0))
    return result


@pytest.fixture(scope="module")
def expected(whole: OnnxEngine, items: list[SynthesisItem]) -> list[ChunkAudio]:
    """The whole graph's audio for each item, made once for every cut."""
    return [whole.synthesize([item])[0] for item in items]


@pytest.mark.parametrize("stages", [3, 8])
def test_staged_audio_is_the_whole_graphs_bit_for_bit(
    stages: int, items: list[SynthesisItem], expected: list[ChunkAudio], registry_weights: Path
) -> None:
    staged = OnnxEngine(registry_weights, threads=2, stages=stages, warmup=False)
    staged.load()
    for item, whole_audio in zip(items, expected, strict=True):
        run = staged.start(item)
        steps = 1
        while (audio := run.step()) is None:
            steps += 1
        assert steps == stages
        assert len(whole_audio.samples) > 24_000
        np.testing.assert_array_equal(audio.samples, whole_audio.samples)
        assert whole_audio.durations is not None
        assert audio.durations is not None
        assert len(audio.durations) == len(item.tokens) + 2
        np.testing.assert_array_equal(audio.durations, whole_audio.durations)


def test_the_engines_process_never_parses_the_model(registry_weights: Path) -> None:
    """A child process parses, profiles and cuts the model (api/engine/onnx_prepare.py), so the memory that
    leaves behind is not the worker's: the engine's process opens its sessions from files."""
    probe = (
        "import sys\n"
        "from pathlib import Path\n"
        "from api.engine.onnx_engine import OnnxEngine\n"
        f"engine = OnnxEngine(Path({str(registry_weights)!r}), threads=1, stages=4, warmup=False)\n"
        "engine.load()\n"
        "print(engine.gives_durations, len(engine._staged.sessions), 'onnx' in sys.modules)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=300, check=True
    )
    assert result.stdout.split() == ["True", "4", "False"]
