"""The int8 ONNX model made ready for the ONNX engine, in a process of its own.

Getting the graph ready means parsing the 92 MB model, adding the durations output, profiling one run of
the whole graph and cutting it into stages (api/engine/stages.py). Done in the engine's own process, that
left about 110 MiB of freed memory behind that the C library could not give back (protobuf copies of the
model and the profiling session's arena among the engine's live allocations). With the work done in a
child, an ONNX worker under 4 clients peaked at 1151 MiB over 200 requests, against 1273 MiB before, at the
same speed (docs/journal/onnx-engine.md, entry 26). So the engine runs `python -m api.engine.onnx_prepare`,
which writes each stage as a model file and a manifest into a folder, and opens its sessions from those
files; the child's memory goes with it.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from api.engine.base import EngineError, SynthesisItem, warmup_item
from api.engine.stages import Stage, open_session, partition, read_profile, share_thread_pool
from api.weights.layout import CONFIG_FILE, ONNX_FILE

logger = logging.getLogger(__name__)

# The rounded, clamped frames per token inside the exported graph (kokoro's pred_dur), exposed as an extra
# output so word timings follow; a graph without it synthesizes but gives no durations.
DURATIONS_TENSOR = "/encoder/Clip_output_0"
# The profiled run that places the cuts: long enough that the vocoder dominates as in real chunks.
PROFILE_TOKENS = 120
MANIFEST = "manifest.json"
# Parsing, one profiled run of 120 tokens and the cutting take seconds; this bounds a stuck child.
PREPARE_TIMEOUT_S = 600.0
# The end of a failed child's output that the log shows.
ERROR_TAIL_CHARS = 2000


@dataclass(frozen=True)
class PreparedGraph:
    """The model's stages as files (`Stage.model` is a path), the graph's outputs, and what it took."""

    stages: tuple[Stage, ...]
    outputs: tuple[str, ...]
    seconds: float

    @property
    def gives_durations(self) -> bool:
        return DURATIONS_TENSOR in self.outputs


def session_options(threads: int) -> Any:
    """Options for a session on ONNX Runtime's process-wide pool of `threads` intra-op threads, one
    operator at a time."""
    options = share_thread_pool(threads)
    options.inter_op_num_threads = 1
    return options


def feeds(item: SynthesisItem) -> dict[str, np.ndarray[Any, Any]]:
    """The exported graph's inputs for one chunk (its batch dimension is fixed at 1)."""
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


def prepare(weights_dir: Path, stages: int, threads: int, folder: Path) -> PreparedGraph:
    """Write the model with its durations output into `folder`, as one file or cut into up to `stages`
    stages where a profiled run (on `threads` threads) says the cost divides evenly, plus the manifest."""
    started = time.monotonic()
    model = with_durations(weights_dir / ONNX_FILE)
    outputs = tuple(output.name for output in model.graph.output)
    if stages == 1:
        cut = [Stage(model.SerializeToString(), (), outputs, 1.0)]
    else:
        vocab = json.loads((weights_dir / CONFIG_FILE).read_text(encoding="utf-8"))["vocab"]
        cut = partition(model, profiled_run(weights_dir / ONNX_FILE, threads, vocab), stages)
    files = []
    for index, stage in enumerate(cut):
        path = folder / f"stage{index}.onnx"
        assert isinstance(stage.model, bytes)
        path.write_bytes(stage.model)
        files.append(Stage(str(path), stage.inputs, stage.outputs, stage.cost_share))
    graph = PreparedGraph(tuple(files), outputs, time.monotonic() - started)
    write_manifest(graph, folder / MANIFEST)
    return graph


def with_durations(path: Path) -> Any:
    """The model, with the durations tensor added to its outputs when the graph has it."""
    import onnx
    from onnx import helper

    model = onnx.load(str(path))
    produced = {name for node in model.graph.node for name in node.output}
    if DURATIONS_TENSOR in produced:
        model.graph.output.append(
            helper.make_tensor_value_info(DURATIONS_TENSOR, onnx.TensorProto.FLOAT, None)
        )
    return model


def profiled_run(path: Path, threads: int, vocab: Mapping[str, int]) -> Any:
    """What each node of the whole graph took in one run (stages.read_profile)."""
    with tempfile.TemporaryDirectory(prefix="kokoro-onnx-profile-") as folder:
        options = session_options(threads)
        options.enable_profiling = True
        options.profile_file_prefix = str(Path(folder) / "profile")
        session = open_session(str(path), options)
        session.run(None, feeds(profile_item(vocab)))
        return read_profile(Path(session.end_profiling()))


def write_manifest(graph: PreparedGraph, path: Path) -> None:
    stages = [asdict(stage) for stage in graph.stages]
    document = {"stages": stages, "outputs": graph.outputs, "seconds": graph.seconds}
    path.write_text(json.dumps(document), encoding="utf-8")


def read_manifest(path: Path) -> PreparedGraph:
    document = json.loads(path.read_text(encoding="utf-8"))
    stages = tuple(
        Stage(stage["model"], tuple(stage["inputs"]), tuple(stage["outputs"]), stage["cost_share"])
        for stage in document["stages"]
    )
    return PreparedGraph(stages, tuple(document["outputs"]), document["seconds"])


def prepare_in_child(
    weights_dir: Path, stages: int, threads: int, folder: Path, timeout: float = PREPARE_TIMEOUT_S
) -> PreparedGraph:
    """`prepare` run by `python -m api.engine.onnx_prepare` (this interpreter, this package first on its
    path); EngineError with the child's last words where it fails."""
    package_root = str(Path(__file__).resolve().parents[2])
    path = os.pathsep.join(part for part in (package_root, os.environ.get("PYTHONPATH", "")) if part)
    command = [sys.executable, "-m", "api.engine.onnx_prepare", str(weights_dir), str(folder)]
    command += ["--stages", str(stages), "--threads", str(threads)]
    try:
        subprocess.run(
            command,
            env={**os.environ, "PYTHONPATH": path},
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=True,
        )
    except subprocess.CalledProcessError as exc:
        output = (exc.stderr or exc.stdout or "").strip()
        logger.error("python -m api.engine.onnx_prepare said:\n%s", output[-ERROR_TAIL_CHARS:])
        last = output.splitlines()[-1] if output else "no output"
        raise EngineError(f"preparing {weights_dir / ONNX_FILE} failed ({exc.returncode}): {last}") from exc
    except subprocess.TimeoutExpired as exc:
        raise EngineError(f"preparing {weights_dir / ONNX_FILE} took over {timeout:.0f} s") from exc
    return read_manifest(folder / MANIFEST)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m api.engine.onnx_prepare", description=__doc__)
    parser.add_argument("weights_dir", type=Path)
    parser.add_argument("folder", type=Path, help="where the stage models and the manifest go")
    parser.add_argument("--stages", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    prepare(args.weights_dir, args.stages, args.threads, args.folder)


if __name__ == "__main__":
    main()
