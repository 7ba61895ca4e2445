"""The ONNX model made ready in a process of its own: files and a manifest the engine opens."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime
import pytest
from onnx import TensorProto, helper

from api.engine.base import EngineError
from api.engine.onnx_prepare import (
    DURATIONS_TENSOR,
    MANIFEST,
    prepare,
    prepare_in_child,
    read_manifest,
)
from api.engine.stages import open_session
from api.weights.layout import ONNX_FILE

# IR 8, opset 17's: every onnxruntime the project installs reads it (Python 3.10's reads IR 11 at most,
# and onnx writes its newest, 14, by default).
TEST_IR_VERSION = 8


def write_model(folder: Path, *, durations: bool) -> None:
    """A graph with the exported model's output name, and the durations tensor inside it or not."""
    middle = DURATIONS_TENSOR if durations else "middle"
    nodes = [
        helper.make_node("Neg", ["tokens"], [middle], name="first"),
        helper.make_node("Neg", [middle], ["audio"], name="second"),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny",
        [helper.make_tensor_value_info("tokens", TensorProto.FLOAT, [None])],
        [helper.make_tensor_value_info("audio", TensorProto.FLOAT, [None])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=TEST_IR_VERSION)
    (folder / ONNX_FILE).write_bytes(model.SerializeToString())


@pytest.mark.parametrize("durations", [True, False])
def test_one_stage_is_the_model_with_its_durations_as_an_output(tmp_path: Path, durations: bool) -> None:
    write_model(tmp_path, durations=durations)
    out = tmp_path / "out"
    out.mkdir()
    graph = prepare(tmp_path, stages=1, threads=1, folder=out)
    assert read_manifest(out / MANIFEST) == graph
    assert graph.gives_durations is durations
    assert graph.outputs == (("audio", DURATIONS_TENSOR) if durations else ("audio",))
    (stage,) = graph.stages
    assert isinstance(stage.model, str)
    assert Path(stage.model).parent == out
    session = open_session(stage.model, onnxruntime.SessionOptions())
    values = session.run(list(graph.outputs), {"tokens": np.array([1.0, -2.0], dtype=np.float32)})
    np.testing.assert_array_equal(values[0], [1.0, -2.0])
    if durations:
        np.testing.assert_array_equal(values[1], [-1.0, 2.0])


def test_the_child_prepares_the_same_files(tmp_path: Path) -> None:
    write_model(tmp_path, durations=True)
    out = tmp_path / "out"
    out.mkdir()
    graph = prepare_in_child(tmp_path, stages=1, threads=1, folder=out)
    assert graph.outputs == ("audio", DURATIONS_TENSOR)
    assert Path(graph.stages[0].model).is_file()


def test_a_child_that_fails_says_why(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(EngineError, match=f"preparing .*{ONNX_FILE} failed .*No such file"):
        prepare_in_child(tmp_path, stages=1, threads=1, folder=out)
