"""The ONNX Runtime engine: the int8 Kokoro-82M model on CPU, one session per process."""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
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
from api.engine.stages import StagedGraph, StagedRun, open_session, partition, read_profile, share_thread_pool
from api.weights.layout import CONFIG_FILE, ONNX_FILE

logger = logging.getLogger(__name__)

# The ONNX export's inverse STFT skips the window normalization: its audio is exactly 1.5x louder than
# torch.istft (and so the PyTorch engine) gives for the same input.
ONNX_GAIN = 1.5
# The rounded, clamped frames per token inside the exported graph (kokoro's pred_dur), exposed as an extra
# output so word timings follow; a graph without it synthesizes but gives no durations.
DURATIONS_TENSOR = "/encoder/Clip_output_0"
# The exported graph fixes the batch dimension at 1: the scheduler hands over one chunk at a time.
ONNX_BATCH_POLICY = BatchPolicy(max_batch_size=1, batch_timeout=0.0, max_batch_tokens=512, length_ratio=2.0)
# Stages a chunk runs in (docs/performance.md): a waiting first chunk starts after at most one stage of a
# long chunk (under 1.2 s for a 260-token chunk on 2 AVX2 cores) instead of after all of it.
DEFAULT_STAGES = 8
# The profiled run that places the cuts: long enough that the vocoder dominates as in real chunks.
PROFILE_TOKENS = 120


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
        model = self._with_durations(path)
        if self.stages == 1:
            self._session = open_session(model.SerializeToString(), self._options())
        else:
            self._staged = self._build_stages(path, model)
        del model
        release_free_memory()
        logger.info("ONNX Runtime on %s: %d intra-op threads, %d stage(s)", path, self.threads, self.stages)
        warn_if_oversubscribed(self.name, self.threads)
        if self.warmup:
            self.synthesize([warmup_item(self._vocab)])

    def _options(self) -> Any:
        options = share_thread_pool(self.threads)
        options.inter_op_num_threads = 1
        return options

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

    def _with_durations(self, path: Path) -> Any:
        """The model, with the durations tensor added to its outputs when the graph has it."""
        import onnx
        from onnx import helper

        model = onnx.load(str(path))
        produced = {name for node in model.graph.node for name in node.output}
        self._outputs = [output.name for output in model.graph.output]
        if DURATIONS_TENSOR in produced:
            model.graph.output.append(
                helper.make_tensor_value_info(DURATIONS_TENSOR, onnx.TensorProto.FLOAT, None)
            )
            self._outputs.append(DURATIONS_TENSOR)
        else:
            logger.warning("%s has no %s: this engine gives no word timings", path, DURATIONS_TENSOR)
        return model

    @property
    def gives_durations(self) -> bool:
        return DURATIONS_TENSOR in self._outputs

    def _build_stages(self, path: Path, model: Any) -> StagedGraph:
        """Profile one run of the whole graph, cut it where the measured cost divides evenly, open the
        stages. The cuts change only where a chunk may pause, never its audio."""
        started = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="kokoro-onnx-profile-") as folder:
            options = self._options()
            options.enable_profiling = True
            options.profile_file_prefix = str(Path(folder) / "profile")
            session = open_session(str(path), options)
            session.run(None, self._feeds(profile_item(self._vocab)))
            profile = read_profile(Path(session.end_profiling()))
        del session
        stages = partition(model, profile, self.stages)
        graph = StagedGraph(stages, self._outputs, self._stage_options())
        logger.info(
            "ONNX graph cut into %d stages in %.1f s (cost shares %s)",
            len(stages),
            time.monotonic() - started,
            ", ".join(f"{stage.cost_share:.2f}" for stage in stages),
        )
        return graph

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
            return _StagedChunk(self._staged.start(self._feeds(item)), self.gives_durations)
        if self._session is None:
            raise EngineError("the engine is not loaded")
        return _WholeChunk(self._session, self._feeds(item), self._outputs)

    @staticmethod
    def _feeds(item: SynthesisItem) -> dict[str, np.ndarray]:
        return {
            "tokens": np.array([[0, *item.tokens, 0]], dtype=np.int64),
            "style": item.style.reshape(1, -1).astype(np.float32),
            "speed": np.array([item.speed], dtype=np.float32),
        }


def profile_item(vocab: Mapping[str, int]) -> SynthesisItem:
    """The warm-up phrase repeated to PROFILE_TOKENS tokens."""
    tokens = warmup_item(vocab).tokens
    return SynthesisItem(
        tokens=(tokens * (PROFILE_TOKENS // len(tokens) + 1))[:PROFILE_TOKENS],
        style=np.zeros(256, dtype=np.float32),
        speed=1.0,
    )


def _chunk(audio: Any, durations: Any | None) -> ChunkAudio:
    samples = checked_audio(np.asarray(audio, dtype=np.float32).reshape(-1) / ONNX_GAIN)
    if durations is None:
        return ChunkAudio(samples)
    return ChunkAudio(samples, np.asarray(durations).reshape(-1).astype(np.int64))


class _WholeChunk:
    def __init__(self, session: Any, feeds: dict[str, np.ndarray], outputs: list[str]) -> None:
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
