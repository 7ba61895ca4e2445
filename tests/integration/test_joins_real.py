"""Chunk joins on real speech: each engine on the registry weights (ONNX, and torch in every precision this
CPU runs fast: fp32, bf16 where it is native, and int8 convolutions on x86) speaks several chunks, they are
shaped and joined as the server does, and no seam has a jump above the speech's own level."""

from __future__ import annotations

import os
import platform
from pathlib import Path

import numpy as np
import pytest

from api.audio.joins import PAUSE_AFTER_S, shape_chunk
from api.engine.base import Engine, SynthesisItem
from api.engine.choice import cpu_flags, native_bf16
from api.engine.onnx_engine import OnnxEngine
from api.engine.torch_engine import TorchEngine
from api.engine.voices import VoiceStore, style_for
from api.text.chunk import Ending, ending_of
from api.text.phonemize import Phonemizer

CHUNKS = (
    "The lighthouse stood at the end of the harbour wall,",
    "and every night its lamp swept across the dark water.",
    "Ships passed safely through the channel;",
    "nobody could remember a wreck there.",
)


NATIVE_BF16 = bool(native_bf16(cpu_flags(), os.environ.get("ONEDNN_MAX_CPU_ISA")))
ENGINES = [
    "onnx",
    "torch-fp32",
    pytest.param("torch-bf16", marks=pytest.mark.skipif(not NATIVE_BF16, reason="bf16 is not native here")),
    pytest.param(
        "torch-int8",
        marks=pytest.mark.skipif(platform.machine() != "x86_64", reason="oneDNN's int8 kernels: x86 only"),
    ),
]


@pytest.fixture(scope="module", params=ENGINES)
def engine(registry_weights: Path, request: pytest.FixtureRequest) -> Engine:
    engine: Engine
    if request.param == "onnx":
        engine = OnnxEngine(registry_weights, threads=2, warmup=False)
    else:
        precision = request.param.removeprefix("torch-")
        assert precision in ("fp32", "bf16", "int8")
        engine = TorchEngine(registry_weights, device="cpu", threads=2, precision=precision, warmup=False)
    engine.load()
    return engine


def test_real_chunks_join_without_clicks(engine: Engine, registry_weights: Path) -> None:
    phonemizer = Phonemizer()
    pack = VoiceStore(registry_weights / "voices").resolve("af_heart")
    pieces, seams = [], []
    for text in CHUNKS:
        words = phonemizer.words(text, "a")
        tokens = tuple(engine.vocab[p] for w in words for p in w.phonemes + " " if p in engine.vocab)
        audio = engine.synthesize([SynthesisItem(tokens[:-1], style_for(pack, len(tokens) - 1), 1.0)])[
            0
        ].samples
        shaped = shape_chunk(audio, ending_of(words), engine.sample_rate)
        assert ending_of(words) in (Ending.CLAUSE, Ending.SENTENCE)
        pieces.append(shaped)
        seams.append(sum(len(p) for p in pieces))
    joined = np.concatenate(pieces)
    steps = np.abs(np.diff(joined))
    speech_level = np.percentile(steps, 99)
    for seam in seams[:-1]:
        window = steps[max(seam - 240, 0) : seam + 240]  # 10 ms either side of the seam
        assert window.max() <= speech_level, f"jump {window.max():.4f} at a seam (speech: {speech_level:.4f})"
    # The gaps are the punctuation pauses: the stretch of silence at each seam is as long as planned.
    for piece, text in zip(pieces, CHUNKS, strict=True):
        quiet_tail = len(piece) - 1 - int(np.flatnonzero(np.abs(piece) > 1e-6)[-1])
        pause = round(PAUSE_AFTER_S[Ending.SENTENCE if text.endswith(".") else Ending.CLAUSE] * 24000)
        assert pause <= quiet_tail <= pause + 120  # the fade's last few samples are (nearly) zero too
