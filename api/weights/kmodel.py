"""KModel's checkpoint format, as the converter writes it: the components, their key prefix, the keys
the official checkpoint leaves out, and a KModel skeleton that gives every tensor's shape.

api/engine/torch_engine.py loads this format and imports these names from here: they live below the
engine, since the weights package imports nothing from the engine.
"""

from __future__ import annotations

import tempfile
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from api.weights.hub import REPO_ID

COMPONENTS = ("bert", "bert_encoder", "predictor", "text_encoder", "decoder")
# The checkpoint stores every key under DataParallel's prefix.
KEY_PREFIX = "module."


def optional_keys(module: torch.nn.Module) -> set[str]:
    """Affine parameters of InstanceNorms inside AdaIN blocks: absent from the official checkpoint."""
    keys: set[str] = set()
    for name, child in module.named_modules():
        if isinstance(child, torch.nn.InstanceNorm1d) and child.affine:
            keys.update({f"{name}.weight", f"{name}.bias"})
    return keys


def kmodel_skeleton(config: Mapping[str, Any]) -> Any:
    """KModel on the meta device: its keys and shapes, with no memory, no random init, no checkpoint."""
    from kokoro import KModel

    # kokoro reads a checkpoint file in its constructor: an empty one, so nothing comes from the hub.
    with torch.device("meta"), tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore", (FutureWarning, UserWarning))
        empty = Path(tmp) / "empty.pth"
        torch.save({}, empty)
        return KModel(repo_id=REPO_ID, config=dict(config), model=str(empty))
