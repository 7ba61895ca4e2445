"""The torch engine on a GPU as the server loads it (prepared kernels, weight norms folded, the default
precision for the device), one chunk of random tokens twice: loads, runs, gives finite audio with the
durations it reports, the same audio both times (seeded noise). A quick check after changes to the
engine, for a lent GPU machine (`bash scripts/gpu/gpu_session.sh check`).

    python -m scripts.tools.gpu_engine_check --weights-dir /tmp/random-weights
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from api.engine.base import SynthesisItem
from api.engine.torch_engine import TorchEngine
from api.server.app import build_engine, resolve_engine
from api.settings import Settings


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--weights-dir", type=Path, required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tokens", type=int, default=80)
    args = parser.parse_args()
    settings = Settings(
        weights_dir=args.weights_dir, device=args.device, engine="torch", fetch_weights=False, warmup=False
    )
    started = time.perf_counter()
    engine = build_engine(resolve_engine(settings))  # as the server builds it
    assert isinstance(engine, TorchEngine)
    engine.load()
    print(f"loaded in {time.perf_counter() - started:.1f} s, decoder {engine.precision}")
    hooks = [
        type(hook).__name__
        for module in engine._model.modules()
        for hook in module._forward_pre_hooks.values()
    ]
    assert "WeightNorm" not in hooks, "a module still computes its weight norm on every call"
    rng = np.random.default_rng(0)
    tokens = tuple(int(token) for token in rng.integers(1, 170, args.tokens))
    item = SynthesisItem(tokens=tokens, style=rng.standard_normal(256).astype(np.float32), speed=1.0)
    walls, outputs = [], []
    for _ in range(2):
        started = time.perf_counter()
        outputs.append(engine.synthesize([item])[0])
        walls.append(time.perf_counter() - started)
    first, second = outputs
    assert first.durations is not None
    assert np.isfinite(first.samples).all(), "audio not finite"
    assert len(first.samples) == int(first.durations.sum()) * 600, "audio length is not the durations'"
    assert np.array_equal(first.samples, second.samples), "seeded audio differs between calls"
    rms = float(np.sqrt(np.mean(first.samples**2)))
    print(f"calls {walls[0]:.1f} s (compiling) and {walls[1]:.3f} s")
    print(f"{len(first.samples)} samples, {int(first.durations.sum())} frames, rms {rms:.4f}")


if __name__ == "__main__":
    main()
