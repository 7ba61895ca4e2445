"""The ONNX Runtime engine: the int8 Kokoro-82M model on CPU, one session per process."""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from api.engine.base import (
    SAMPLE_RATE,
    BatchPolicy,
    ChunkAudio,
    ChunkRun,
    EngineError,
    ReadyCallback,
    SynthesisItem,
    checked_audio,
    usable_cores,
    warmup_item,
    warn_if_oversubscribed,
)
from api.engine.memory import release_free_memory
from api.engine.onnx_prepare import DURATIONS_TENSOR, feeds, prepare_in_child, session_options
from api.engine.stages import StagedGraph, StagedRun, open_session
from api.weights.layout import CONFIG_FILE, ONNX_FILE

logger = logging.getLogger(__name__)

# The ONNX export's inverse STFT skips the window normalization: its audio is exactly 1.5x louder than
# torch.istft (and so the PyTorch engine) gives for the same input.
ONNX_GAIN = 1.5
# The exported graph fixes the batch dimension at 1: the scheduler hands over one chunk at a time.
ONNX_BATCH_POLICY = BatchPolicy(max_batch_size=1, batch_timeout=0.0, max_batch_tokens=512, length_ratio=2.0)
# Stages a chunk runs in (docs/performance.md): a waiting first chunk starts after at most one stage of a
# long chunk (under 1.2 s for a 260-token chunk on 2 AVX2 cores) instead of after all of it.
DEFAULT_STAGES = 8


def default_threads(setting: int | None) -> int:
    """The setting, else OMP_NUM_THREADS, else the cores this process may use: always explicit, and logged."""
    if setting:
        return setting
    value = os.environ.get("OMP_NUM_THREADS", "")
    return int(value) if value.isdigit() and int(value) > 0 else usable_cores()


class OnnxEngine:
    """The int8 model under ONNX Runtime: batch size 1, one chunk per run, same inputs as KModel."""

    name = "onnx"
    sample_rate = SAMPLE_RATE

    def __init__(
        self,
        weights_dir: Path,
        *,
        threads: int | None = None,
        stages: int = DEFAULT_STAGES,
        warmup: bool = True,
    ) -> None:
        if stages < 1:
            raise ValueError(f"stages must be at least 1, got {stages}")
        self.weights_dir = weights_dir
        self.threads = default_threads(threads)
        self.stages = stages
        self.warmup = warmup
        self._session: Any = None
        self._staged: StagedGraph | None = None
        self._vocab: dict[str, int] = {}
        self._outputs: list[str] = []

    @property
    def vocab(self) -> Mapping[str, int]:
        return self._vocab

    @property
    def batch_defaults(self) -> BatchPolicy:
        return ONNX_BATCH_POLICY

    def load(self) -> None:
        config = json.loads((self.weights_dir / CONFIG_FILE).read_text(encoding="utf-8"))
        self._vocab = dict(config["vocab"])
        path = self.weights_dir / ONNX_FILE
        with tempfile.TemporaryDirectory(prefix="kokoro-onnx-") as folder:
            graph = prepare_in_child(self.weights_dir, self.stages, self.threads, Path(folder))
            self._outputs = list(graph.outputs)
            if self.stages == 1:
                self._session = open_session(graph.stages[0].model, self._options())
            else:
                self._staged = StagedGraph(graph.stages, graph.outputs, self._stage_options())
                shares = ", ".join(f"{stage.cost_share:.2f}" for stage in graph.stages)
                logger.info(
                    "ONNX graph cut into %d stages in %.1f s (cost shares %s)",
                    len(graph.stages),
                    graph.seconds,
                    shares,
                )
        if not self.gives_durations:
            logger.warning("%s has no %s: this engine gives no word timings", path, DURATIONS_TENSOR)
        release_free_memory()
        logger.info("ONNX Runtime on %s: %d intra-op threads, %d stage(s)", path, self.threads, self.stages)
        warn_if_oversubscribed(self.name, self.threads)
        if self.warmup:
            self.synthesize([warmup_item(self._vocab)])

    def _options(self) -> Any:
        return session_options(self.threads)

    def _stage_options(self) -> Any:
        """Sessions for stages: one memory arena for all (an arena per stage held 3.4 GiB where one whole
        session holds 1.0) and no per-shape memory patterns (each stage would keep its own)."""
        import onnxruntime

        cpu = onnxruntime.OrtMemoryInfo(
            "Cpu", onnxruntime.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, onnxruntime.OrtMemType.DEFAULT
        )
        onnxruntime.create_and_register_allocator(cpu, onnxruntime.OrtArenaCfg(0, -1, -1, -1))
        options = self._options()
        options.add_session_config_entry("session.use_env_allocators", "1")
        options.enable_mem_pattern = False
        return options

    @property
    def gives_durations(self) -> bool:
        return DURATIONS_TENSOR in self._outputs

    def synthesize(
        self, items: Sequence[SynthesisItem], on_ready: ReadyCallback | None = None
    ) -> list[ChunkAudio]:
        results = []
        for index, item in enumerate(items):
            run = self.start(item)
            while (audio := run.step()) is None:
                pass
            results.append(audio)
            if on_ready is not None:
                on_ready(index, audio)
        return results

    def start(self, item: SynthesisItem) -> ChunkRun:
        """A run of one chunk, one stage per `step` (the whole graph in one step when not staged)."""
        if self._staged is not None:
            return _StagedChunk(self._staged.start(feeds(item)), self.gives_durations)
        if self._session is None:
            raise EngineError("the engine is not loaded")
        return _WholeChunk(self._session, feeds(item), self._outputs)


def _chunk(audio: Any, durations: Any | None) -> ChunkAudio:
    samples = checked_audio(np.asarray(audio, dtype=np.float32).reshape(-1) / ONNX_GAIN)
    if durations is None:
        return ChunkAudio(samples)
    return ChunkAudio(samples, np.asarray(durations).reshape(-1).astype(np.int64))


class _WholeChunk:
    def __init__(self, session: Any, feeds: dict[str, np.ndarray[Any, Any]], outputs: list[str]) -> None:
        self._session = session
        self._feeds = feeds
        self._outputs = outputs

    def step(self) -> ChunkAudio | None:
        results = dict(zip(self._outputs, self._session.run(self._outputs, self._feeds), strict=True))
        return _chunk(results["audio"], results.get(DURATIONS_TENSOR))


class _StagedChunk:
    def __init__(self, run: StagedRun, durations: bool) -> None:
        self._run = run
        self._durations = durations

    def step(self) -> ChunkAudio | None:
        self._run.step()
        if not self._run.done:
            return None
        return _chunk(
            self._run.output("audio"), self._run.output(DURATIONS_TENSOR) if self._durations else None
        )
