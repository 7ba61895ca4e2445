"""Check the ONNX -> KModel conversion: durations and spectra of the converted model against the ONNX model.

For each case (phoneme string, voice, speed) it runs KModel on the converted checkpoint (torch seeded)
and the int8 ONNX model under ONNX Runtime, and reports:
- per-token durations: KModel's pred_dur against the ONNX graph's own rounded durations, read from an
  extra graph output added to a copy of the model (`with_duration_output` below);
- spectra: KModel forced to the ONNX durations against the ONNX audio divided by 1.5, as log-mel and
  log-STFT distances (`api.weights.convert.spectral_distance`); `seed_floor` is the same distance
  between two KModel renderings that differ only in the vocoder's random seed: the noise level of the
  measure itself.

The phonemes were produced with misaki (KPipeline(lang_code='a', model=False).g2p(text)[0]) and are
fixed here so the check needs no G2P.

    HF_HUB_OFFLINE=1 python -m scripts.tools.check_conversion --onnx model.onnx --voices DIR --out report.json
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import onnx
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from api.engine.stages import open_session
from api.engine.torch_engine import REPO_ID
from api.weights.convert import (
    ConversionError,
    SpectralDistance,
    convert_model,
    spectral_distance,
)
from api.weights.layout import VOICE_PACK_SHAPE, shipped_config

ROOT = Path(__file__).resolve().parents[2]

logger = logging.getLogger("check_conversion")

Array = npt.NDArray[Any]

SENTENCES = {
    "Hello world.": "həlˈO wˈɜɹld.",
    "The quick brown fox jumps over the lazy dog.": "ðə kwˈɪk bɹˈWn fˈɑks ʤˈʌmps ˈOvəɹ ðə lˈAzi dˈɔɡ.",
    "Kokoro is an open-weight text to speech model with eighty two million parameters.": (
        "kəkˈɔɹO ɪz ɐn ˈOpᵊnwˌAt tˈɛkst tə spˈiʧ mˈɑdᵊl wɪð ˈATi tˈu mˈɪljᵊn pəɹˈæməTəɹz."
    ),
    "She sells seashells by the seashore, and the shells she sells are surely seashells.": (
        "ʃˌi sˈɛlz sˈiʃˌɛlz bI ðə sˈiʃˌɔɹ, ænd ðə ʃˈɛlz ʃi sˈɛlz ɑɹ ʃˈʊɹli sˈiʃˌɛlz."
    ),
}
VOICES = ("af_heart", "am_adam")
# Every sentence with both voices at speed 1.0, and the two longer ones once more at 1.3.
CASES = [(text, voice, 1.0) for text in SENTENCES for voice in VOICES] + [
    (list(SENTENCES)[2], "af_heart", 1.3),
    (list(SENTENCES)[3], "am_adam", 1.3),
]


# --- checking a conversion against the ONNX model -------------------------------------------------------
# Also used by scripts/tools/gpu_real_weights.py and tests/integration (test_convert.py, test_precision.py).

# The ONNX model's inverse STFT skips the window normalization: its audio is 1.5x what torch.istft gives.
ONNX_GAIN = 1.5


def duration_tensor(graph: onnx.GraphProto) -> str:
    """The graph's per-token durations, KModel's pred_dur: Cast(Clip(Round(sum of sigmoids / speed)))."""
    rounds = [node for node in graph.node if node.op_type == "Round"]
    if len(rounds) != 1:
        raise ConversionError([f"expected one Round node (the durations), found {len(rounds)}"])
    node = rounds[0]
    for op_type in ("Clip", "Cast"):
        consumers = [other for other in graph.node if node.output[0] in other.input]
        if len(consumers) != 1 or consumers[0].op_type != op_type:
            raise ConversionError([f"{node.name} is not followed by a single {op_type}"])
        node = consumers[0]
    return str(node.output[0])


def with_duration_output(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `model` that also outputs the per-token durations (int64)."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    name = duration_tensor(copy.graph)
    copy.graph.output.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.INT64, None))
    return copy


class OnnxReference:
    """The ONNX model under ONNX Runtime: audio at torch.istft's level (divided by 1.5) and durations."""

    def __init__(self, model: onnx.ModelProto, *, threads: int = 1) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        serialized = with_duration_output(model).SerializeToString()
        self._session = open_session(serialized, options)

    def __call__(self, tokens: Sequence[int], style: Array, speed: float) -> tuple[Array, Array]:
        feeds = {
            "tokens": np.array([[0, *tokens, 0]], dtype=np.int64),
            "style": style.reshape(1, -1).astype(np.float32),
            "speed": np.array([speed], dtype=np.float32),
        }
        audio, durations = self._session.run(None, feeds)
        return np.asarray(audio).reshape(-1) / ONNX_GAIN, np.asarray(durations).reshape(-1)


class _FixedDurations(torch.nn.Module):
    """Stands in for predictor.duration_proj so that KModel's own forward uses the given durations.

    KModel takes round(sum(sigmoid(logits)) / speed); logits of logit(d * speed / max_dur) in each of
    the max_dur bins sum back to d.
    """

    def __init__(self, durations: torch.Tensor, speed: float, max_dur: int) -> None:
        super().__init__()
        share = (durations.double() * speed / max_dur).clamp(1e-6, 1 - 1e-6)
        self.logits = torch.logit(share).float()[None, :, None].expand(1, -1, max_dur)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.logits


@contextmanager
def _durations_fixed(model: Any, durations: Array, speed: float) -> Iterator[None]:
    predictor = model.predictor
    original = predictor.duration_proj
    max_dur = int(original.linear_layer.out_features)
    predictor.duration_proj = _FixedDurations(torch.from_numpy(durations), speed, max_dur)
    try:
        yield
    finally:
        predictor.duration_proj = original


def kmodel_synthesize(
    model: Any,
    tokens: Sequence[int],
    style: Array,
    speed: float,
    *,
    seed: int = 0,
    durations: Array | None = None,
) -> tuple[Array, Array]:
    """KModel.forward_with_tokens with torch seeded (the vocoder draws noise); `durations` replace the
    predicted ones when given. Returns the audio and the durations used."""
    input_ids = torch.tensor([[0, *tokens, 0]], dtype=torch.long)
    ref_s = torch.from_numpy(np.ascontiguousarray(style, dtype=np.float32).reshape(1, -1))
    fixed = _durations_fixed(model, durations, speed) if durations is not None else nullcontext()
    with fixed, torch.inference_mode():
        torch.manual_seed(seed)
        audio, used = model.forward_with_tokens(input_ids, ref_s, speed)
    return audio.float().numpy().reshape(-1), used.numpy().reshape(-1)


@dataclass(frozen=True)
class CaseComparison:
    """One phoneme string and voice row through KModel (converted weights) and through the ONNX model.

    Durations come from KModel's own forward; the spectra compare KModel forced to the ONNX durations
    (so one rounding flip does not shift everything after it) with the ONNX audio divided by 1.5.
    """

    phonemes: str
    speed: float
    tokens: int
    torch_durations: list[int]
    onnx_durations: list[int]
    duration_mismatches: int
    max_duration_difference: int
    torch_samples: int
    onnx_samples: int
    spectra: SpectralDistance


def compare_case(
    model: Any,
    reference: OnnxReference,
    vocab: Mapping[str, int],
    phonemes: str,
    pack: Array,
    speed: float = 1.0,
    *,
    seed: int = 0,
) -> CaseComparison:
    tokens = [vocab[symbol] for symbol in phonemes if symbol in vocab]
    style = pack.reshape(len(pack), -1)[len(tokens) - 1]
    onnx_audio, onnx_durations = reference(tokens, style, speed)
    audio, durations = kmodel_synthesize(model, tokens, style, speed, seed=seed)
    torch_samples = len(audio)
    if not np.array_equal(durations, onnx_durations):
        audio, used = kmodel_synthesize(model, tokens, style, speed, seed=seed, durations=onnx_durations)
        if not np.array_equal(used, onnx_durations):
            raise ValueError(
                f"KModel did not take the ONNX durations: {used.tolist()} != {onnx_durations.tolist()}"
            )
    difference = np.abs(durations.astype(np.int64) - onnx_durations.astype(np.int64))
    return CaseComparison(
        phonemes=phonemes,
        speed=speed,
        tokens=len(tokens) + 2,
        torch_durations=[int(d) for d in durations],
        onnx_durations=[int(d) for d in onnx_durations],
        duration_mismatches=int((difference > 0).sum()),
        max_duration_difference=int(difference.max()),
        torch_samples=torch_samples,
        onnx_samples=len(onnx_audio),
        spectra=spectral_distance(onnx_audio, audio),
    )


# --- the command ----------------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--onnx", type=Path, default=Path("/tmp/reg/model.onnx"), help="the int8 ONNX model")
    parser.add_argument(
        "--voices", type=Path, default=Path("/tmp/reg/js/package/voices"), help="kokoro-js voices/*.bin"
    )
    parser.add_argument("--out", type=Path, help="write the JSON report here (default: stdout)")
    parser.add_argument("--threads", type=int, default=2, help="torch and ONNX Runtime threads")
    return parser.parse_args()


def load_pack(voices: Path, name: str) -> np.ndarray:
    return np.fromfile(voices / f"{name}.bin", dtype="<f4").reshape(VOICE_PACK_SHAPE)


def build_kmodel(checkpoint: dict[str, Any], config: dict[str, Any], directory: Path) -> Any:
    from kokoro import KModel

    path = directory / "converted.pth"
    torch.save(checkpoint, path)
    return KModel(repo_id=REPO_ID, config=config, model=str(path)).eval()


def conversion_stats(checkpoint: dict[str, dict[str, torch.Tensor]], seconds: float) -> dict[str, Any]:
    tensors = [(key, t) for state in checkpoint.values() for key, t in state.items()]
    return {
        "seconds": round(seconds, 2),
        "tensors": len(tensors),
        "parameters": sum(t.numel() for _, t in tensors),
        "zero_channels_fixed": sum(int((t == 0).sum()) for key, t in tensors if key.endswith("weight_g")),
        "all_finite": all(bool(torch.isfinite(t).all()) for _, t in tensors),
    }


def run_case(
    model: Any, reference: OnnxReference, vocab: dict[str, int], case: tuple[str, str, float], voices: Path
) -> dict[str, Any]:
    text, voice, speed = case
    pack = load_pack(voices, voice)
    started = time.perf_counter()
    result = compare_case(model, reference, vocab, SENTENCES[text], pack, speed)
    tokens = [vocab[p] for p in result.phonemes if p in vocab]
    style = pack.reshape(len(pack), -1)[len(tokens) - 1]
    durations = np.array(result.onnx_durations)
    first, _ = kmodel_synthesize(model, tokens, style, speed, seed=0, durations=durations)
    second, _ = kmodel_synthesize(model, tokens, style, speed, seed=1, durations=durations)
    report = {"text": text, "voice": voice, **asdict(result)}
    report["seed_floor"] = asdict(spectral_distance(first, second))
    report["seconds"] = round(time.perf_counter() - started, 2)
    logger.info(
        "%s x%.1f: %d/%d durations differ (max %d), mel %.2f dB (corr %.4f, seed floor %.2f dB)",
        voice, speed, result.duration_mismatches, result.tokens, result.max_duration_difference,
        result.spectra.mel_db, result.spectra.mel_correlation, report["seed_floor"]["mel_db"],
    )  # fmt: skip
    return report


def summarize(cases: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "tokens": sum(case["tokens"] for case in cases),
        "duration_mismatches": sum(case["duration_mismatches"] for case in cases),
        "max_duration_difference": max(case["max_duration_difference"] for case in cases),
        "max_mel_db": max(case["spectra"]["mel_db"] for case in cases),
        "min_mel_correlation": min(case["spectra"]["mel_correlation"] for case in cases),
        "max_stft_db": max(case["spectra"]["stft_db"] for case in cases),
        "max_seed_floor_mel_db": max(case["seed_floor"]["mel_db"] for case in cases),
    }


def main() -> None:
    args = parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    torch.set_num_threads(args.threads)
    config = shipped_config()
    model_proto = onnx.load(str(args.onnx))
    started = time.perf_counter()
    checkpoint = convert_model(model_proto, config)
    conversion = conversion_stats(checkpoint, time.perf_counter() - started)
    with tempfile.TemporaryDirectory() as tmp:
        model = build_kmodel(checkpoint, config, Path(tmp))
    reference = OnnxReference(model_proto, threads=args.threads)
    cases = [run_case(model, reference, config["vocab"], case, args.voices) for case in CASES]
    report = {"onnx": str(args.onnx), "conversion": conversion, "summary": summarize(cases), "cases": cases}
    text = json.dumps(report, indent=2, ensure_ascii=False)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")
    else:
        print(text)


if __name__ == "__main__":
    main()
