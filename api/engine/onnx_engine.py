"""The ONNX Runtime engine: the int8 Kokoro-82M model on CPU, one session per process."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from api.engine.base import (
    SAMPLE_RATE,
    BatchPolicy,
    EngineError,
    ReadyCallback,
    SynthesisItem,
    checked_audio,
    usable_cores,
    warmup_item,
    warn_if_oversubscribed,
)
from api.weights.layout import CONFIG_FILE, ONNX_FILE

logger = logging.getLogger(__name__)

# The ONNX export's inverse STFT skips the window normalization: its audio is exactly 1.5x louder than
# torch.istft (and so the PyTorch engine) gives for the same input.
ONNX_GAIN = 1.5
# The exported graph fixes the batch dimension at 1: the scheduler hands over one chunk at a time.
ONNX_BATCH_POLICY = BatchPolicy(max_batch_size=1, batch_timeout=0.0, max_batch_tokens=512, length_ratio=2.0)


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

    def __init__(self, weights_dir: Path, *, threads: int | None = None, warmup: bool = True) -> None:
        self.weights_dir = weights_dir
        self.threads = default_threads(threads)
        self.warmup = warmup
        self._session: Any = None
        self._vocab: dict[str, int] = {}

    @property
    def vocab(self) -> Mapping[str, int]:
        return self._vocab

    @property
    def batch_defaults(self) -> BatchPolicy:
        return ONNX_BATCH_POLICY

    def load(self) -> None:
        import onnxruntime

        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = self.threads
        options.inter_op_num_threads = 1
        path = self.weights_dir / ONNX_FILE
        self._session = onnxruntime.InferenceSession(
            str(path), sess_options=options, providers=["CPUExecutionProvider"]
        )
        config = json.loads((self.weights_dir / CONFIG_FILE).read_text(encoding="utf-8"))
        self._vocab = dict(config["vocab"])
        logger.info("ONNX Runtime session for %s (%d intra-op threads)", path, self.threads)
        warn_if_oversubscribed(self.name, self.threads)
        if self.warmup:
            self.synthesize([warmup_item(self._vocab)])

    def synthesize(
        self, items: Sequence[SynthesisItem], on_ready: ReadyCallback | None = None
    ) -> list[np.ndarray]:
        if self._session is None:
            raise EngineError("the engine is not loaded")
        results = []
        for index, item in enumerate(items):
            results.append(self._synthesize_one(item))
            if on_ready is not None:
                on_ready(index, results[-1])
        return results

    def _synthesize_one(self, item: SynthesisItem) -> np.ndarray:
        feeds = {
            "tokens": np.array([[0, *item.tokens, 0]], dtype=np.int64),
            "style": item.style.reshape(1, -1).astype(np.float32),
            "speed": np.array([item.speed], dtype=np.float32),
        }
        (audio,) = self._session.run(["audio"], feeds)
        return checked_audio(np.asarray(audio, dtype=np.float32).reshape(-1) / ONNX_GAIN)
