"""How near the server's engine is to fp32 on this CPU: the sentences of check_conversion.py, cut into the
chunks the server makes of them (`measure.server_chunks`), through the torch engine the server builds in
fp32 and in the precision under test (default `auto`: what the server picks here, with its kernels and
their int8 weight levels), with the same seed, so the vocoder's noise is the same and what differs is the
arithmetic. Per case: the waveform's SNR against fp32 and the log-mel distance
(`api.weights.convert.spectral_distance`, as check_conversion.py and tests/integration/test_precision.py
measure it), and whether the durations agree. The engine's raw audio is compared, before the server trims
each chunk's edge silence at a level (which shifts a chunk by a few samples and would make the SNR a
measure of the shift). The environment applies, so a dispatch cap (ATEN_CPU_CAPABILITY, ONEDNN_MAX_CPU_ISA)
applies to both engines: label such figures emulated.

    HF_HUB_OFFLINE=1 python -m scripts.tools.check_precision --out bench-results/<machine>/precision.json
"""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from api.engine.base import SAMPLE_RATE, ChunkAudio, Engine
from api.engine.voices import VoiceStore
from api.server.app import build_engine, resolve_engine
from api.settings import Settings
from api.text.phonemize import Phonemizer
from api.weights.convert import spectral_distance
from scripts.bench.common import Report
from scripts.bench.measure import server_chunks
from scripts.tools.check_conversion import SENTENCES, VOICES

ROOT = Path(__file__).resolve().parents[2]

DEFAULT_WEIGHTS = Path.home() / ".cache" / "kokoro-openai-server" / "test-registry-weights"

Array = npt.NDArray[Any]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--weights-dir", type=Path, default=DEFAULT_WEIGHTS)
    parser.add_argument("--precision", default="auto", choices=["auto", "bf16", "int8"])
    parser.add_argument("--voices", nargs="+", default=list(VOICES))
    parser.add_argument("--out", type=Path, required=True)
    return parser.parse_args()


def server_engine(weights: Path, precision: str) -> tuple[Engine, dict[str, Any]]:
    """The torch engine the server builds over `weights` in `precision` (auto: this CPU's choice), loaded,
    and what it chose."""
    settings = Settings(weights_dir=weights, engine="torch", fetch_weights=False, torch_precision=precision)
    settings = resolve_engine(settings)
    engine = build_engine(settings)
    engine.load()
    kernels = getattr(engine, "_kernels", None)
    chosen = {
        "precision": settings.torch_precision,
        "kernels_dtype": None if kernels is None else str(kernels.dtype).removeprefix("torch."),
        "int8_dot": None if kernels is None or not kernels.int8 else kernels.int8_dot,
    }
    return engine, chosen


def snr_db(reference: Array, candidate: Array) -> float:
    """10 log10 of the reference's energy over the difference's, over their common length."""
    length = min(len(reference), len(candidate))
    noise = float(np.sum((reference[:length] - candidate[:length]) ** 2))
    return float(10 * np.log10(float(np.sum(reference[:length] ** 2)) / max(noise, 1e-30)))


def joined(chunks: list[ChunkAudio]) -> tuple[Array, Array]:
    audio = np.concatenate([chunk.samples for chunk in chunks]).astype(np.float64)
    return audio, np.concatenate([chunk.durations for chunk in chunks])


def compare(reference: list[ChunkAudio], candidate: list[ChunkAudio]) -> dict[str, Any]:
    (ours, our_durations), (theirs, their_durations) = joined(reference), joined(candidate)
    distance = spectral_distance(ours, theirs)
    return {
        "chunks": len(reference),
        "seconds": round(len(ours) / SAMPLE_RATE, 2),
        "same_durations": bool(np.array_equal(our_durations, their_durations)),
        "snr_db": round(snr_db(ours, theirs), 2),
        "mel_db": round(distance.mel_db, 3),
        "mel_correlation": round(distance.mel_correlation, 5),
    }


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    args = parse_args()
    written = Report(args, benchmark="precision")
    reference, _ = server_engine(args.weights_dir, "fp32")
    tested, chosen = server_engine(args.weights_dir, args.precision)
    store, phonemizer = VoiceStore(args.weights_dir / "voices"), Phonemizer()
    results = []
    for text in SENTENCES:
        for voice in args.voices:
            items = server_chunks(text, reference.vocab, store.resolve(voice), phonemizer).items
            fp32 = [reference.synthesize([item])[0] for item in items]
            audio = [tested.synthesize([item])[0] for item in items]
            results.append({"text": text, "voice": voice, **compare(fp32, audio)})
    snrs, mels = [case["snr_db"] for case in results], [case["mel_db"] for case in results]
    report = {
        "isa_cap": os.environ.get("ONEDNN_MAX_CPU_ISA"),
        "dispatch": os.environ.get("ATEN_CPU_CAPABILITY"),
        "tested": chosen,
        "summary": {
            "snr_db_min": min(snrs),
            "snr_db_max": max(snrs),
            "mel_db_min": min(mels),
            "mel_db_max": max(mels),
            "all_same_durations": all(case["same_durations"] for case in results),
        },
        "cases": results,
    }
    print(written.write(report))


if __name__ == "__main__":
    main()
