"""A weights directory with random weights, laid out as the real one (config.json, kokoro-v1_0.pth, the 54
official voice names), for tests and for benchmarks on machines without the real weights (a GPU machine
that reaches no registry). Same shapes, so the same compute; the duration head is biased to about two
frames per token as FACTS.md describes (random weights otherwise predict ~25: audio ten times too long;
the real model gives ~2.7).

    python -m scripts.tools.random_weights /tmp/random-weights
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

from api.engine.torch_engine import COMPONENTS, KEY_PREFIX, new_kmodel, optional_keys
from api.weights.layout import OFFICIAL_VOICES, shipped_config

ROOT = Path(__file__).resolve().parents[2]


def random_kmodel(config: dict[str, object], seed: int = 0) -> Any:
    """A KModel with random weights whose duration head predicts about two frames per token."""
    torch.manual_seed(seed)
    model = new_kmodel(config)
    projection = model.predictor.duration_proj.linear_layer
    with torch.no_grad():
        projection.bias.fill_(-3.0)
        projection.weight.mul_(0.01)
    return model


def write_random_checkpoint(path: Path, config: dict[str, object], seed: int = 0) -> None:
    """A KModel checkpoint in the official format with random_kmodel's weights."""
    model = random_kmodel(config, seed)
    checkpoint = {}
    for component in COMPONENTS:
        module = getattr(model, component)
        skip = optional_keys(module)  # the official checkpoint lacks these too
        checkpoint[component] = {
            KEY_PREFIX + key: tensor.clone() for key, tensor in module.state_dict().items() if key not in skip
        }
    torch.save(checkpoint, path)


def write_random_voices(voices_dir: Path, names: tuple[str, ...], seed: int = 0) -> None:
    voices_dir.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(seed)
    for name in names:
        pack = 0.2 * torch.randn(510, 1, 256, generator=generator)
        torch.save(pack, voices_dir / f"{name}.pt")


def write_random_weights(root: Path, seed: int = 0) -> Path:
    """config.json, kokoro-v1_0.pth and all 54 official voice names under `root`, with random weights."""
    root.mkdir(parents=True, exist_ok=True)
    config = shipped_config()
    (root / "config.json").write_text(json.dumps(config))
    write_random_checkpoint(root / "kokoro-v1_0.pth", config, seed)
    write_random_voices(root / "voices", OFFICIAL_VOICES, seed)
    return root


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("root", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(write_random_weights(args.root, args.seed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
