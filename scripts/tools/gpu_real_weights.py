"""The torch engine on a GPU with the real weights: what TF32 and bf16 do to the audio.

The GPU machine reaches no registry, so the registry's int8 ONNX model travels there in parts and is
converted there (api/weights/convert.py, as `python -m api.weights` does). Each English sentence of the
intelligibility test is normalized and phonemized as the server does, then synthesized by the engine as one
padded batch, once per setting: fp32 with TF32 off (the reference), fp32 with PyTorch's default TF32
convolutions (what the engine runs on a GPU in fp32), and bf16 (the prepared kernels' bf16 convolutions).
Per setting: whether the durations equal the reference's, and the log-mel distance to the reference
(scripts/tools/check_conversion.py's measure; the int8 model's own distance to fp32 is 1.2-2.1 dB). The audio
comes back as an .npz, for whisper to hear on a CPU machine (`--transcribe`).

    python -m scripts.tools.gpu_real_weights --onnx /tmp/rw/kokoro-v1_0.int8.onnx --voices .rw/voices \\
        --work /tmp/rw --out $OUT/gpu-real.npz                                    # on the GPU machine
    python -m scripts.tools.gpu_real_weights --transcribe gpu-real.npz --out bench-results/gpu-h100/real.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np

from api.weights.convert import spectral_distance
from api.weights.layout import shipped_config
from scripts.hearing import SENTENCES, VOICE_SENTENCE

ROOT = Path(__file__).resolve().parents[2]

VOICE = "af_heart"
SETTINGS = {  # name: (precision, TF32 for cuDNN convolutions and matmuls)
    "fp32": ("fp32", False),
    "fp32-tf32": ("fp32", True),
    "bf16": ("bf16", True),
}


def build_weights(onnx_path: Path, voices: Path, work: Path) -> Path:
    from api.weights.convert import write_checkpoint

    config = shipped_config()
    work.mkdir(parents=True, exist_ok=True)
    (work / "config.json").write_text(json.dumps(config))
    if not (work / "kokoro-v1_0.pth").exists():
        write_checkpoint(onnx_path, config, work / "kokoro-v1_0.pth")
    shutil.copytree(voices, work / "voices", dirs_exist_ok=True)
    return work


def items(weights: Path, vocab: dict[str, int]) -> list[Any]:
    import torch

    from api.engine.base import SynthesisItem
    from api.engine.voices import style_for
    from api.text.normalize import normalize_text
    from api.text.phonemize import Phonemizer

    phonemizer = Phonemizer()
    pack = torch.load(weights / "voices" / f"{VOICE}.pt", weights_only=True).reshape(510, 256).numpy()
    result = []
    for text in (*SENTENCES, VOICE_SENTENCE):
        phonemes = phonemizer.phonemize(normalize_text(text), "a")
        tokens = tuple(vocab[p] for p in phonemes if p in vocab)
        result.append(SynthesisItem(tokens=tokens, style=style_for(pack, len(tokens)), speed=1.0))
    return result


def synthesize(args: argparse.Namespace) -> int:
    import torch

    from api.engine.torch_engine import TorchEngine

    weights = build_weights(args.onnx, args.voices, args.work)
    arrays: dict[str, np.ndarray] = {}
    device = torch.cuda.get_device_name() if args.device == "cuda" else args.device
    report: dict[str, Any] = {"device": device, "torch": torch.__version__, "settings": {}}
    reference: list[Any] = []
    chunks = items(weights, shipped_config()["vocab"])  # the same token chunks for every setting
    for name, (precision, tf32) in SETTINGS.items():
        torch.backends.cudnn.allow_tf32 = tf32
        torch.backends.cuda.matmul.allow_tf32 = tf32
        engine = TorchEngine(weights, device=args.device, precision=precision, warmup=False)  # type: ignore[arg-type]
        engine.load()
        audio = engine.synthesize(chunks)
        reference = reference or audio
        distances = [
            spectral_distance(ref.samples, out.samples) for ref, out in zip(reference, audio, strict=True)
        ]
        report["settings"][name] = {
            "durations_equal_reference": all(
                np.array_equal(ref.durations, out.durations)
                for ref, out in zip(reference, audio, strict=True)
            ),
            "mel_db": [round(d.mel_db, 3) for d in distances],
            "mel_correlation": [round(d.mel_correlation, 4) for d in distances],
        }
        print(name, report["settings"][name], flush=True)
        for index, chunk in enumerate(audio):
            arrays[f"{name}/{index}"] = chunk.samples
        del engine
        torch.cuda.empty_cache()
    arrays["report"] = np.frombuffer(json.dumps(report).encode(), dtype=np.uint8)
    np.savez_compressed(args.out, **arrays)  # type: ignore[arg-type]
    return 0


def transcribe(args: argparse.Namespace) -> int:
    """Whisper tiny.en (the intelligibility test's) on each setting's audio: the word error rate."""
    import io
    import wave

    from scripts.hearing import load_whisper, word_error_rate

    data = np.load(args.transcribe)
    report = json.loads(bytes(data["report"]).decode())
    whisper = load_whisper()
    texts = (*SENTENCES, VOICE_SENTENCE)
    for name in SETTINGS:
        pairs = []
        for index, text in enumerate(texts):
            buffer = io.BytesIO()
            with wave.open(buffer, "wb") as out:
                out.setnchannels(1)
                out.setsampwidth(2)
                out.setframerate(24000)
                out.writeframes((np.clip(data[f"{name}/{index}"], -1, 1) * 32767).astype(np.int16).tobytes())
            buffer.seek(0)
            segments, _ = whisper.transcribe(buffer, language="en", beam_size=5)
            pairs.append((text, " ".join(segment.text for segment in segments)))
        report["settings"][name]["wer"] = round(word_error_rate(pairs), 4)
        report["settings"][name]["heard"] = [heard.strip() for _, heard in pairs]
        print(name, "WER", report["settings"][name]["wer"], flush=True)
    if args.weights_dir:
        report["int8_mel_db"] = int8_distances(args.weights_dir)
        print("int8 against fp32, mel dB:", report["int8_mel_db"], flush=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


def int8_distances(weights: Path) -> list[float]:
    """The bar: the registry's int8 ONNX model against the fp32 library, per sentence (forced to the same
    durations, as scripts/tools/check_conversion.py measures it), on this machine's CPU."""
    import onnx
    import torch

    from api.engine.torch_engine import load_kmodel
    from api.text.normalize import normalize_text
    from api.text.phonemize import Phonemizer
    from api.weights.layout import CHECKPOINT_FILE, ONNX_FILE
    from scripts.tools.check_conversion import OnnxReference, compare_case

    config = json.loads((weights / "config.json").read_text())
    library = load_kmodel(config, weights / CHECKPOINT_FILE)
    reference = OnnxReference(onnx.load(str(weights / ONNX_FILE)), threads=2)
    pack = torch.load(weights / "voices" / f"{VOICE}.pt", weights_only=True).numpy()
    phonemizer = Phonemizer()
    return [
        round(
            compare_case(
                library, reference, config["vocab"], phonemizer.phonemize(normalize_text(text), "a"), pack
            ).spectra.mel_db,
            3,
        )
        for text in (*SENTENCES, VOICE_SENTENCE)
    ]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--onnx", type=Path, help="the registry's int8 ONNX model")
    parser.add_argument("--voices", type=Path, help="a directory with the voice's .pt pack")
    parser.add_argument("--work", type=Path, default=Path("/tmp/rw"))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--transcribe", type=Path, help="an .npz this script wrote on the GPU machine")
    parser.add_argument(
        "--weights-dir", type=Path, help="with --transcribe: registry weights for the int8 bar"
    )
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    return transcribe(args) if args.transcribe else synthesize(args)


if __name__ == "__main__":
    sys.exit(main())
