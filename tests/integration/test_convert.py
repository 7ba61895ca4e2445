"""The ONNX -> KModel converter on the real int8 model: complete, loadable, and as good as the ONNX itself.

Bounds, from scripts/tools/check_conversion.py over 10 cases (4 sentences, af_heart and am_adam, speed 1.0
and 1.3; 607 tokens): durations differed on 17 tokens (2.8 %, at most 4 of 77 in one sentence), never
by more than one frame; the log-mel distance to the ONNX audio was 0.94-1.57 dB (correlation >= 0.993)
against a seed-to-seed floor of 0.23-0.35 dB; the short cases used here measured 0.94-1.3 dB. One
decoder tensor with its output channels shuffled (decode.3.conv2) measured 3.0-4.1 dB.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import torch

from api.engine.base import SynthesisItem
from api.engine.torch_engine import KEY_PREFIX, REPO_ID, TorchEngine, check_checkpoint
from api.weights.convert import (
    ConversionError,
    convert_model,
    lstm_gates,
    weight_norm_split,
    write_checkpoint,
)
from api.weights.layout import CHECKPOINT_FILE, CONFIG_FILE, VOICES_DIR, shipped_config
from scripts.tools import check_conversion as conversion_check

CaseComparison = conversion_check.CaseComparison
OnnxReference = conversion_check.OnnxReference
compare_case = conversion_check.compare_case

# Numerics: also run at a lower CPU dispatch level by scripts/test.sh (docs/testing.md).
pytestmark = pytest.mark.numerics

# Per-token durations: at most one frame off, on at most one token in ten (at least one token allowed).
MAX_DURATION_DIFFERENCE = 1
MAX_MISMATCHED_FRACTION = 0.1
# Log-mel distance to the ONNX audio / 1.5: right conversions measured <= 1.57 dB, correlation >= 0.993.
MAX_MEL_DB = 2.0
MIN_MEL_CORRELATION = 0.985

HELLO = "həlˈO wˈɜɹld."
FOX = "ðə kwˈɪk bɹˈWn fˈɑks ʤˈʌmps ˈOvəɹ ðə lˈAzi dˈɔɡ."
CASES = [(HELLO, "af_heart", 1.0), (HELLO, "am_adam", 1.0), (FOX, "am_adam", 1.3)]
OFFICIAL_TENSORS = 548
OFFICIAL_PARAMETERS = 81_763_410
# All-zero output channels of weight-normed convs left by int8 rounding.
ZERO_CHANNELS = 94


def voice_pack(voices: Path, name: str) -> torch.Tensor:
    pack: torch.Tensor = torch.load(voices / f"{name}.pt", weights_only=True)
    return pack


@pytest.fixture(scope="module")
def config() -> dict[str, Any]:
    return shipped_config()


@pytest.fixture(scope="module")
def onnx_model(registry_onnx: Path) -> onnx.ModelProto:
    return onnx.load(str(registry_onnx))


@pytest.fixture(scope="module")
def weights_dir(
    registry_onnx: Path,
    registry_voices: Path,
    config: dict[str, Any],
    tmp_path_factory: pytest.TempPathFactory,
) -> Path:
    root = tmp_path_factory.mktemp("converted")
    (root / CONFIG_FILE).write_text(json.dumps(config))
    write_checkpoint(registry_onnx, config, root / CHECKPOINT_FILE)
    (root / VOICES_DIR).mkdir()
    torch.save(voice_pack(registry_voices, "af_heart"), root / VOICES_DIR / "af_heart.pt")
    return root


@pytest.fixture(scope="module")
def checkpoint(weights_dir: Path) -> dict[str, dict[str, torch.Tensor]]:
    loaded: dict[str, dict[str, torch.Tensor]] = torch.load(weights_dir / CHECKPOINT_FILE, weights_only=True)
    return loaded


@pytest.fixture(scope="module")
def reference(onnx_model: onnx.ModelProto) -> OnnxReference:
    return OnnxReference(onnx_model, threads=2)


@pytest.fixture(scope="module")
def kmodel(weights_dir: Path, config: dict[str, Any]) -> Any:
    from kokoro import KModel

    return KModel(repo_id=REPO_ID, config=config, model=str(weights_dir / CHECKPOINT_FILE)).eval()


@pytest.fixture(scope="module", params=CASES, ids=lambda case: f"{case[1]}-x{case[2]}-{len(case[0])}ch")
def comparison(
    request: pytest.FixtureRequest, kmodel: Any, reference: OnnxReference, registry_voices: Path, config: Any
) -> CaseComparison:
    phonemes, voice, speed = request.param
    pack = voice_pack(registry_voices, voice).numpy()
    return compare_case(kmodel, reference, config["vocab"], phonemes, pack, speed)


def within_spectral_bounds(result: CaseComparison) -> bool:
    return result.spectra.mel_db <= MAX_MEL_DB and result.spectra.mel_correlation >= MIN_MEL_CORRELATION


# --- the conversion ---------------------------------------------------------------------------------------


def test_checkpoint_fits_kmodel(
    checkpoint: dict[str, dict[str, torch.Tensor]], config: dict[str, Any], tmp_path: Path
) -> None:
    from kokoro import KModel

    torch.save({}, tmp_path / "empty.pth")
    with torch.device("meta"):  # shapes are all check_checkpoint reads
        model = KModel(repo_id=REPO_ID, config=config, model=str(tmp_path / "empty.pth"))
    check_checkpoint(checkpoint, model)
    tensors = {
        f"{c}.{k.removeprefix(KEY_PREFIX)}": t for c, state in checkpoint.items() for k, t in state.items()
    }
    assert len(tensors) == OFFICIAL_TENSORS
    assert sum(t.numel() for t in tensors.values()) == OFFICIAL_PARAMETERS
    assert all(t.dtype == torch.float32 and bool(torch.isfinite(t).all()) for t in tensors.values())
    assert not tensors["bert.pooler.weight"].any()
    assert not tensors["bert.pooler.bias"].any()
    zero_g = sum(int((t == 0).sum()) for key, t in tensors.items() if key.endswith("weight_g"))
    assert zero_g == ZERO_CHANNELS


def test_torch_engine_loads_the_written_checkpoint(
    weights_dir: Path, reference: OnnxReference, registry_voices: Path
) -> None:
    engine = TorchEngine(weights_dir, device="cpu", seed=0, warmup=False)
    engine.load()  # checks every key and shape, then that every tensor arrived in the model
    tokens = tuple(engine.vocab[p] for p in HELLO if p in engine.vocab)
    style = voice_pack(registry_voices, "af_heart").numpy()[len(tokens) - 1, 0]
    audio = engine.synthesize([SynthesisItem(tokens=tokens, style=style, speed=1.0)])[0].samples
    onnx_audio, _ = reference(tokens, style, 1.0)
    assert np.isfinite(audio).all()
    assert len(audio) == len(onnx_audio)  # the same durations on this sentence
    assert 0.5 < np.sqrt(np.mean(audio**2)) / np.sqrt(np.mean(onnx_audio**2)) < 2.0


# --- agreement with the ONNX model -------------------------------------------------------------------------


def test_durations_equal_the_onnx_ones(comparison: CaseComparison) -> None:
    allowed = max(1, math.floor(MAX_MISMATCHED_FRACTION * comparison.tokens))
    assert len(comparison.torch_durations) == len(comparison.onnx_durations) == comparison.tokens
    assert comparison.max_duration_difference <= MAX_DURATION_DIFFERENCE
    assert comparison.duration_mismatches <= allowed
    assert abs(comparison.torch_samples - comparison.onnx_samples) <= 600 * comparison.duration_mismatches


def test_spectra_match_the_onnx_audio(comparison: CaseComparison) -> None:
    assert within_spectral_bounds(comparison), comparison.spectra


def test_a_broken_decoder_tensor_fails_the_spectral_bound(
    checkpoint: dict[str, dict[str, torch.Tensor]],
    config: dict[str, Any],
    reference: OnnxReference,
    registry_voices: Path,
    tmp_path: Path,
) -> None:
    from kokoro import KModel

    key = KEY_PREFIX + "decode.3.conv2.weight_v"
    broken = {component: dict(state) for component, state in checkpoint.items()}
    weight = broken["decoder"][key]
    broken["decoder"][key] = weight[torch.randperm(len(weight), generator=torch.Generator().manual_seed(0))]
    torch.save(broken, tmp_path / "broken.pth")
    model = KModel(repo_id=REPO_ID, config=config, model=str(tmp_path / "broken.pth")).eval()
    pack = voice_pack(registry_voices, "af_heart").numpy()
    result = compare_case(model, reference, config["vocab"], HELLO, pack, 1.0)
    assert result.spectra.mel_db > MAX_MEL_DB
    assert not within_spectral_bounds(result)


# --- refusals ---------------------------------------------------------------------------------------------


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    return copy


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("onnx::MatMul_9999", "1 ONNX weight initializers unused: onnx::MatMul_9999"),
        (
            "decoder.decoder.extra.weight",
            "decoder.decoder.extra.weight maps to decoder.extra.weight, which KModel does not have",
        ),
    ],
    ids=["anonymous", "module-named"],
)
def test_an_extra_weight_initializer_is_refused(
    onnx_model: onnx.ModelProto, config: dict[str, Any], name: str, problem: str
) -> None:
    extra = _copy(onnx_model)
    extra.graph.initializer.append(onnx.numpy_helper.from_array(np.ones((8, 8), dtype=np.float32), name))
    with pytest.raises(ConversionError) as caught:
        convert_model(extra, config)
    assert caught.value.problems == [problem]


def test_a_kmodel_tensor_left_unset_is_refused(onnx_model: onnx.ModelProto, config: dict[str, Any]) -> None:
    missing = _copy(onnx_model)
    (bias,) = [t for t in missing.graph.initializer if t.name == "decoder.decoder.generator.conv_post.bias"]
    missing.graph.initializer.remove(bias)
    with pytest.raises(ConversionError, match="unset") as caught:
        convert_model(missing, config)
    assert caught.value.problems == ["1 KModel tensors left unset: decoder.generator.conv_post.bias"]


def test_a_shape_mismatch_is_refused(onnx_model: onnx.ModelProto, config: dict[str, Any]) -> None:
    wrong = _copy(onnx_model)
    name = "decoder.decoder.generator.conv_post.bias"
    (bias,) = [t for t in wrong.graph.initializer if t.name == name]
    bias.CopyFrom(onnx.numpy_helper.from_array(np.zeros(21, dtype=np.float32), name))
    with pytest.raises(ConversionError) as caught:
        convert_model(wrong, config)
    assert caught.value.problems == [
        f"decoder.generator.conv_post.bias: shape (21,) from {name}, KModel has (22,)",
        "1 KModel tensors left unset: decoder.generator.conv_post.bias",
    ]


# --- the pieces -------------------------------------------------------------------------------------------


def test_weight_norm_split_keeps_zero_channels_finite() -> None:
    weight = np.arange(24, dtype=np.float32).reshape(4, 3, 2) - 5
    weight[2] = 0
    v, g, zeros = weight_norm_split(weight)
    assert zeros == 1
    assert g.shape == (4, 1, 1)
    assert g[2, 0, 0] == 0
    assert (v[2] == 1).all()
    rebuilt = torch._weight_norm(torch.from_numpy(v), torch.from_numpy(g), 0)
    assert torch.isfinite(rebuilt).all()
    assert torch.allclose(rebuilt, torch.from_numpy(weight), atol=1e-6)


def test_lstm_gates_go_from_iofc_to_ifgo() -> None:
    hidden = 2
    onnx_rows = np.repeat(np.array([0, 1, 2, 3]), hidden)  # i, o, f, c blocks
    assert lstm_gates(onnx_rows, hidden).tolist() == [0, 0, 2, 2, 3, 3, 1, 1]  # i, f, c(g), o
