"""Shared parts of the benchmark scripts: texts, engine set-up and timing, machine information, and the
bare-engine measurement that runs in a fresh process so that its thread settings take effect.

The parent scripts never import torch or onnxruntime themselves: OMP_NUM_THREADS and the engines' own
thread settings are read when those libraries load, so every measurement at a thread count runs in its
own subprocess. Run as a script, this module is that subprocess: it reads a JSON spec (see `BareSpec`)
on stdin and prints one line, RESULT_PREFIX + JSON, on stdout. By hand:

    echo '{"engine": "onnx", "threads": 1, "weights_dir": "DIR", "texts": {"short": ["Hello there."]},
           "runs": 1}' | OMP_NUM_THREADS=1 KOKORO_ONNX_THREADS=1 python scripts/benchlib.py
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

    from api.engine.base import Engine, SynthesisItem
    from api.text.chunk import Ending
    from api.text.phonemize import Phonemizer

ROOT = Path(__file__).resolve().parents[1]
VOICE = "af_heart"
LANG_CODE = "a"
RESULT_PREFIX = "BENCH-RESULT "
CHUNKINGS = ("server", "whole")
WHOLE_TEXT_BUDGET = 450  # "whole": a text of up to this many tokens stays one chunk
INTERESTING_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_tile", "amx_bf16", "amx_int8")
MIB = 1024 * 1024
# `python -m api`'s line on its allocator (api/allocator.py).
ALLOCATOR_LOG = re.compile(r"\ballocator: (tcmalloc|the C library's malloc)\b")

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


# --- machine information ---------------------------------------------------------------------------------


def parse_cpuinfo(text: str) -> dict[str, Any]:
    """The CPU model and the instruction-set flags that matter for inference, from /proc/cpuinfo text."""
    model, flags = None, set[str]()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and model is None:
            model = value.strip()
        elif key == "flags" and not flags:
            flags = set(value.split())
    return {
        "cpu_model": model,
        "flags": {flag: flag in flags for flag in INTERESTING_FLAGS},
        "amx": any(flag.startswith("amx") for flag in flags),
    }


def parse_kb(text: str, key: str) -> int | None:
    """A "Key:   1234 kB" value (as /proc/meminfo and /proc/PID/status give them) in kB."""
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name.strip() == key and value.split():
            return int(value.split()[0])
    return None


def read_text(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def logged_allocator(log: str) -> str | None:
    """The allocator a server says it runs with: "tcmalloc", "malloc", or None where it does not say."""
    found = ALLOCATOR_LOG.search(log)
    if found is None:
        return None
    return "tcmalloc" if found.group(1) == "tcmalloc" else "malloc"


def package_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def recorded_args(args: argparse.Namespace, leave_out: Collection[str] = ()) -> dict[str, Any]:
    """A script's arguments as its JSON records them (paths as text), but those in `leave_out`."""
    return {
        key: str(value) if isinstance(value, Path) else value
        for key, value in vars(args).items()
        if key not in leave_out
    }


def write_report(report: Mapping[str, Any], out: Path) -> str:
    """`report` as indented JSON in `out` (its folder made), and the text written."""
    text = json.dumps(report, indent=2)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text + "\n", encoding="utf-8")
    return text


def machine_info() -> dict[str, Any]:
    """What the figures depend on; versions are read without importing torch or onnxruntime."""
    memory_kb = parse_kb(read_text("/proc/meminfo"), "MemTotal")
    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        **parse_cpuinfo(read_text("/proc/cpuinfo")),
        "logical_cores": os.cpu_count(),
        "affinity_cores": len(os.sched_getaffinity(0)),
        "memory_gib": None if memory_kb is None else round(memory_kb / MIB, 1),
        "load_average": list(os.getloadavg()),
        "torch": package_version("torch"),
        "onnxruntime": package_version("onnxruntime"),
    }


# --- statistics ------------------------------------------------------------------------------------------


def latency_stats(walls: Sequence[float]) -> dict[str, float]:
    if not walls:
        raise ValueError("no timings")
    return {
        "mean_s": round(statistics.fmean(walls), 4),
        "median_s": round(statistics.median(walls), 4),
        "min_s": round(min(walls), 4),
        "max_s": round(max(walls), 4),
    }


def ratio(numerator: float, denominator: float) -> float | None:
    return None if denominator <= 0 else numerator / denominator


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
    from api.speech import chunk_limits
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


def thread_env(threads: int, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a process that must use `threads` threads, whichever engine it loads."""
    value = str(threads)
    return {
        **(os.environ if base is None else base),
        "OMP_NUM_THREADS": value,
        "MKL_NUM_THREADS": value,
        "KOKORO_TORCH_THREADS": value,
        "KOKORO_ONNX_THREADS": value,
        "HF_HUB_OFFLINE": "1",
        "KOKORO_FETCH_WEIGHTS": "false",
    }


def pinned_to(cpus: Sequence[int] | None) -> Callable[[], None] | None:
    """A preexec_fn that pins the child (and so its threads and children) to `cpus`."""
    if cpus is None:
        return None
    chosen = set(cpus)
    return lambda: os.sched_setaffinity(0, chosen)


def run_bare(
    spec: BareSpec, cpus: Sequence[int] | None = None, env: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """Runs this module as a fresh process for `spec` (on `cpus`, in `env` with the thread settings set)
    and returns what it measured."""
    completed = subprocess.run(
        [sys.executable, str(Path(__file__).resolve())], input=json.dumps(asdict(spec)), text=True,
        capture_output=True, cwd=ROOT, env=thread_env(spec.threads, env), preexec_fn=pinned_to(cpus),
        check=False,
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


def main() -> None:
    spec = BareSpec(**json.loads(sys.stdin.read()))
    print(RESULT_PREFIX + json.dumps(measure(spec)), flush=True)


if __name__ == "__main__":
    main()
