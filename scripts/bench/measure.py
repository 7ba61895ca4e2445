"""The bare engine, measured: texts, engine set-up and timing, and the measurement that runs in a fresh
process so that its thread settings take effect (`engine`, `threads` and `replicas` use it).

The benchmarks never import torch or onnxruntime themselves: OMP_NUM_THREADS and the engines' own thread
settings are read when those libraries load, so every measurement at a thread count runs in its own
subprocess. Run as a module, this one is that subprocess: it reads a JSON spec (see `BareSpec`) on stdin and
prints one line, RESULT_PREFIX + JSON, on stdout. By hand:

    echo '{"engine": "onnx", "threads": 1, "weights_dir": "DIR", "texts": {"short": ["Hello there."]},
           "runs": 1}' | OMP_NUM_THREADS=1 KOKORO_ONNX_THREADS=1 python -m scripts.bench.measure
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scripts.bench.common import ROOT, package_version, parse_kb, ratio, read_text
from scripts.harness import pinned_to, process_env

if TYPE_CHECKING:
    import numpy as np

    from api.engine.base import Engine, SynthesisItem
    from api.text.chunk import Ending
    from api.text.phonemize import Phonemizer

VOICE = "af_heart"
LANG_CODE = "a"
RESULT_PREFIX = "BENCH-RESULT "
REPO_ID = "hexgrad/Kokoro-82M"
SAMPLE_RATE = 24000
CHUNKINGS = ("server", "whole")
WHOLE_TEXT_BUDGET = 450  # "whole": a text of up to this many tokens stays one chunk

# One text per length, the same as bench-results/cpu-amd-epyc-avx512/engines.json was measured on.
ENGINE_TEXTS = {
    "short": "Hello there, how are you today?",
    "medium": (
        "The old lighthouse keeper climbed the spiral stairs every evening, lit the great lamp, "
        "and watched the ships pass safely through the narrow channel below."
    ),
    "long": (
        "When the storm finally arrived, it came faster than anyone in the village had expected. "
        "The fishermen pulled their boats high onto the shingle, the baker closed his shutters, and "
        "the children were called in from the fields. By nightfall the wind was howling through the "
        "streets, rattling every loose tile and sending spray over the harbour wall, while the keeper "
        "in the lighthouse kept his lamp burning until the first grey light of morning."
    ),
}


# --- engines and texts (used in the measuring process) ---------------------------------------------------


def build_engine(name: str, weights: Path, threads: int) -> Engine:
    """'onnx', 'torch' (fp32), 'torch-bf16' (the decoder and vocoder in bf16; native bf16 CPUs only) or
    'torch-int8' (the vocoder's Snake-block convolutions in int8, the rest bf16 where native, else fp32)."""
    if name.startswith("torch"):
        import torch

        from api.engine.choice import Precision
        from api.engine.torch_engine import TorchEngine

        torch.set_num_threads(threads)
        precisions: dict[str, Precision] = {"torch-bf16": "bf16", "torch-int8": "int8"}
        precision = precisions.get(name, "fp32")
        return TorchEngine(weights, device="cpu", threads=threads, precision=precision, warmup=True)
    from api.engine.onnx_engine import OnnxEngine

    return OnnxEngine(weights, threads=threads, warmup=True)


@dataclass
class PlannedText:
    """One text as the engine gets it: its chunks, how each ends, and the pauses between them."""

    items: list[SynthesisItem]
    endings: list[Ending]
    pause_s: float = 0.0


def plan_text(
    text: str, vocab: Mapping[str, int], pack: np.ndarray, phonemizer: Phonemizer, chunking: str
) -> PlannedText:
    if chunking == "whole":
        return whole_text_chunks(text, vocab, pack, phonemizer)
    return server_chunks(text, vocab, pack, phonemizer)


def whole_text_chunks(
    text: str, vocab: Mapping[str, int], pack: np.ndarray, phonemizer: Phonemizer
) -> PlannedText:
    """Each text of up to WHOLE_TEXT_BUDGET tokens as one chunk: compares engines, not chunking."""
    from api.engine.base import SynthesisItem
    from api.engine.voices import style_for
    from api.text.chunk import ChunkLimits, chunk_words, ending_of, phonemes_of

    planned = PlannedText([], [])
    for chunk in chunk_words(phonemizer.words(text, LANG_CODE), ChunkLimits(first_budget=WHOLE_TEXT_BUDGET)):
        tokens = tuple(vocab[p] for p in phonemes_of(chunk) if p in vocab)
        planned.items.append(SynthesisItem(tokens=tokens, style=style_for(pack, len(tokens)), speed=1.0))
        planned.endings.append(ending_of(chunk))
    return planned


def server_chunks(
    text: str, vocab: Mapping[str, int], pack: np.ndarray, phonemizer: Phonemizer
) -> PlannedText:
    """The chunks the server makes of the text: normalized, then planned with the settings' limits."""
    from api.engine.base import SynthesisItem
    from api.engine.voices import style_for
    from api.settings import Settings
    from api.speech.planning import chunk_limits
    from api.text.normalize import normalize_text
    from api.text.plan import PlannedChunk, Planner

    settings = Settings()
    limits = chunk_limits(settings)
    planner = Planner(limits, settings.g2p_piece_chars, settings.first_g2p_piece_chars)
    normalized = normalize_text(text, lang_code=LANG_CODE, date_order=settings.date_order)

    async def words_of(piece: str) -> list[Any]:
        return phonemizer.words(piece, LANG_CODE)

    async def collect() -> list[Any]:
        return [step async for step in planner.plan(normalized, vocab, words_of)]

    planned = PlannedText([], [])
    for step in asyncio.run(collect()):
        if isinstance(step, PlannedChunk):
            style = style_for(pack, len(step.tokens))
            planned.items.append(SynthesisItem(tokens=step.tokens, style=style, speed=1.0))
            planned.endings.append(step.ending)
        else:
            planned.pause_s += step.seconds
    return planned


def items_for(text: str, engine: Engine, store: Any, phonemizer: Phonemizer) -> list[SynthesisItem]:
    """bench_engines.py's items: one chunk per text (up to WHOLE_TEXT_BUDGET tokens), voice af_heart."""
    return whole_text_chunks(text, engine.vocab, store.resolve(VOICE), phonemizer).items


def timed_runs(
    engine: Engine, items: Sequence[SynthesisItem], runs: int
) -> tuple[list[float], list[np.ndarray]]:
    """One warm-up (excluded), then `runs` timed syntheses; the walls and the last run's audio. Chunks go
    to the engine one per call, as sequential chunks, even where the engine could batch them."""
    outputs = synthesize_sequentially(engine, items)
    walls = []
    for _ in range(runs):
        started = time.perf_counter()
        outputs = synthesize_sequentially(engine, items)
        walls.append(time.perf_counter() - started)
    return walls, outputs


def synthesize_sequentially(engine: Engine, items: Sequence[SynthesisItem]) -> list[np.ndarray]:
    return [engine.synthesize([item])[0].samples for item in items]


def audio_seconds(outputs: Sequence[np.ndarray]) -> float:
    from api.engine.base import SAMPLE_RATE

    return sum(len(out) for out in outputs) / SAMPLE_RATE


def delivered_seconds(outputs: Sequence[np.ndarray], planned: PlannedText) -> float:
    """The audio the server would send for these outputs: each chunk trimmed, faded and followed by its
    pause (api.audio.joins), plus the text's pause tags."""
    from api.audio.joins import shape_chunk
    from api.engine.base import SAMPLE_RATE

    shaped = sum(
        len(shape_chunk(out, end, SAMPLE_RATE)) for out, end in zip(outputs, planned.endings, strict=True)
    )
    return shaped / SAMPLE_RATE + planned.pause_s


def time_runs(engine: Engine, items: list[SynthesisItem], runs: int) -> dict[str, Any]:
    """bench_engines.py's record of one engine on one text."""
    walls, outputs = timed_runs(engine, items, runs)
    audio_s = audio_seconds(outputs)
    median = statistics.median(walls)
    return {
        "tokens": sum(len(item.tokens) for item in items),
        "chunks": len(items),
        "audio_s": round(audio_s, 3),
        "wall_s": [round(w, 3) for w in walls],
        "wall_median_s": round(median, 3),
        "rtf": round(median / audio_s, 4),
        "audio_s_per_s": round(audio_s / median, 3),
    }


# --- the bare-engine measurement in a fresh process ------------------------------------------------------


@dataclass(frozen=True)
class BareSpec:
    """What one measuring process does: load `engine` with `threads` threads, then for every text of
    every group: plan its chunks (`chunking`), one warm-up, `runs` timed sequential syntheses."""

    engine: str
    threads: int
    weights_dir: str
    texts: dict[str, list[str]]
    runs: int
    chunking: str = "server"
    voice: str = VOICE

    def __post_init__(self) -> None:
        if self.engine not in ("torch", "onnx") or self.chunking not in CHUNKINGS:
            raise ValueError(f"unknown engine or chunking: {self.engine}, {self.chunking}")
        if self.threads < 1 or self.runs < 1:
            raise ValueError("threads and runs must be at least 1")


def run_bare(
    spec: BareSpec, cpus: Sequence[int] | None = None, env: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """Runs this module as a fresh process for `spec` (on `cpus`, in `env` with the thread settings set)
    and returns what it measured."""
    completed = subprocess.run(
        [sys.executable, "-m", __name__], input=json.dumps(asdict(spec)), text=True, capture_output=True,
        cwd=ROOT, env=process_env(threads=spec.threads, base=env), preexec_fn=pinned_to(cpus), check=False,
    )  # fmt: skip
    return process_result(completed, "the measuring process")


def process_result(completed: subprocess.CompletedProcess[str], what: str) -> dict[str, Any]:
    """The JSON a measuring process printed after RESULT_PREFIX (its last such line), else its stderr."""
    for line in reversed(completed.stdout.splitlines()):
        if line.startswith(RESULT_PREFIX):
            result: dict[str, Any] = json.loads(line.removeprefix(RESULT_PREFIX))
            return result
    raise RuntimeError(f"{what} failed ({completed.returncode}):\n{completed.stderr[-4000:]}")


@dataclass
class TextTiming:
    """One text measured in the measuring process."""

    tokens: int
    chunks: int
    audio_s: float  # what the model produced
    delivered_audio_s: float  # what the server would send (joins shaped, pauses added)
    wall_s: list[float] = field(default_factory=list)


def measure_text(engine: Engine, planned: PlannedText, runs: int) -> TextTiming:
    walls, outputs = timed_runs(engine, planned.items, runs)
    return TextTiming(
        tokens=sum(len(item.tokens) for item in planned.items),
        chunks=len(planned.items),
        audio_s=round(audio_seconds(outputs), 4),
        delivered_audio_s=round(delivered_seconds(outputs, planned), 4),
        wall_s=[round(wall, 4) for wall in walls],
    )


def effective_threads(engine: Engine) -> int | None:
    if engine.name == "torch":
        import torch

        return int(torch.get_num_threads())
    threads = getattr(engine, "threads", None)
    return threads if isinstance(threads, int) else None


def measure(spec: BareSpec) -> dict[str, Any]:
    from api.engine.voices import VoiceStore
    from api.text.phonemize import Phonemizer

    weights = Path(spec.weights_dir)
    engine = build_engine(spec.engine, weights, spec.threads)
    engine.load()
    pack = VoiceStore(weights / "voices").resolve(spec.voice)
    phonemizer = Phonemizer()
    groups = {}
    for label, texts in spec.texts.items():
        planned = [plan_text(text, engine.vocab, pack, phonemizer, spec.chunking) for text in texts]
        groups[label] = [asdict(measure_text(engine, plan, spec.runs)) for plan in planned]
    return {
        **asdict(spec),
        "threads_effective": effective_threads(engine),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "peak_rss_mib": round((parse_kb(read_text("/proc/self/status"), "VmHWM") or 0) / 1024, 1),
        "groups": groups,
    }


# --- the library, in its own process ---------------------------------------------------------------------


def measure_library(weights: Path, threads: int, texts: Sequence[str], timeout_s: float) -> dict[str, Any]:
    """kokoro's own pipeline on `texts`, in a fresh process (so the thread settings hold); `cpu` and `ready`
    compare with it."""
    spec = {"weights_dir": str(weights), "threads": threads, "texts": list(texts)}
    completed = subprocess.run(
        [sys.executable, "-m", __name__, "library"], input=json.dumps(spec), text=True, capture_output=True,
        cwd=ROOT, env=process_env(threads=threads), check=False, timeout=timeout_s,
    )  # fmt: skip
    return process_result(completed, "the library process")


def run_library(spec: Mapping[str, Any]) -> dict[str, Any]:
    import torch

    torch.set_num_threads(spec["threads"])
    weights = Path(spec["weights_dir"])
    started = time.perf_counter()
    pipeline = build_pipeline(weights)
    voice = torch.load(weights / "voices" / f"{VOICE}.pt", weights_only=True)
    load_s = time.perf_counter() - started
    time_text(pipeline, voice, spec["texts"][0])  # warm-up: G2P's lexicons, the first forward
    texts = [time_text(pipeline, voice, text) for text in spec["texts"]]
    return {
        "pipeline": f"kokoro {package_version('kokoro')} KPipeline('{LANG_CODE}'), KModel fp32 on cpu",
        "voice": VOICE,
        "threads": spec["threads"],
        "threads_effective": torch.get_num_threads(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "load_s": round(load_s, 2),
        "peak_rss_mib": round((parse_kb(read_text("/proc/self/status"), "VmHWM") or 0) / 1024, 1),
        **library_summary(texts),
        "texts": texts,
    }


def build_pipeline(weights: Path) -> Any:
    """kokoro's own pipeline with its model read from `weights`: nothing comes from the hub."""
    from kokoro import KModel, KPipeline

    model = KModel(
        repo_id=REPO_ID, config=str(weights / "config.json"), model=str(weights / "kokoro-v1_0.pth")
    ).eval()
    return KPipeline(lang_code=LANG_CODE, repo_id=REPO_ID, model=model)


def time_text(pipeline: Any, voice: Any, text: str) -> dict[str, Any]:
    """One text through the pipeline, all its chunks: wall time and the audio it yields."""
    started = time.perf_counter()
    samples = sum(
        len(result.audio) for result in pipeline(text, voice=voice, speed=1) if result.audio is not None
    )
    wall = time.perf_counter() - started
    audio = samples / SAMPLE_RATE
    return {
        "chars": len(text),
        "audio_s": round(audio, 4),
        "wall_s": round(wall, 4),
        "rtf": _round(ratio(wall, audio)),
    }


def library_summary(texts: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Totals over the library's per-text records ({"chars", "audio_s", "wall_s"})."""
    audio = sum(text["audio_s"] for text in texts)
    wall = sum(text["wall_s"] for text in texts)
    chars = sum(text["chars"] for text in texts)
    return {
        "texts_measured": len(texts),
        "audio_s": round(audio, 3),
        "wall_s": round(wall, 3),
        "audio_s_per_s": _round(ratio(audio, wall)),
        "chars_per_s": _round(ratio(chars, wall)),
    }


def _round(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


def main() -> None:
    """The measuring process: reads its spec on stdin, prints RESULT_PREFIX + JSON; `library` for the
    library's, else the bare engine's."""
    spec = json.loads(sys.stdin.read())
    measured = run_library(spec) if sys.argv[1:] == ["library"] else measure(BareSpec(**spec))
    print(RESULT_PREFIX + json.dumps(measured), flush=True)


if __name__ == "__main__":
    main()
