"""Cutting an ONNX graph into stages: where the cuts fall, and that running the stages one after another
gives exactly what the whole graph gives (a small graph built here; the real model in
tests/integration/test_onnx_stages.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

from api.engine.onnx_engine import OnnxEngine
from api.engine.stages import StagedGraph, cut_points, open_session, partition


def test_cuts_divide_the_cost_evenly() -> None:
    assert cut_points([1.0] * 8, 4) == [2, 4, 6]
    assert cut_points([4.0, 1.0, 1.0, 1.0, 1.0], 2) == [1]


def test_one_stage_has_no_cut_and_zero_stages_is_refused() -> None:
    assert cut_points([1.0, 2.0], 1) == []
    with pytest.raises(ValueError, match="at least 1"):
        cut_points([1.0], 0)


def test_fewer_cuts_when_costs_cannot_fill_the_stages() -> None:
    assert cut_points([0.0, 0.0, 5.0], 3) == []


def chain_model() -> onnx.ModelProto:
    """x -> a*x -> +b -> sin -> a*x (skip from the first result) -> y: tensors cross the cuts both ways."""
    weight = numpy_helper.from_array(np.array([1.5], np.float32), "w")
    bias = numpy_helper.from_array(np.array([0.25], np.float32), "b")
    nodes = [
        helper.make_node("Mul", ["x", "w"], ["m"], name="n0"),
        helper.make_node("Add", ["m", "b"], ["a"], name="n1"),
        helper.make_node("Sin", ["a"], ["s"], name="n2"),
        helper.make_node("Mul", ["s", "w"], ["t"], name="n3"),
        helper.make_node("Add", ["t", "m"], ["y"], name="n4"),
    ]
    graph = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None])],
        initializer=[weight, bias],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("stages", [1, 2, 3, 5])
def test_stages_run_in_turn_equal_the_whole_graph(stages: int) -> None:
    model = chain_model()
    costs = {f"n{i}": 1.0 for i in range(5)}
    parts = partition(model, costs, stages)
    assert len(parts) == stages
    assert sum(part.cost_share for part in parts) == pytest.approx(1.0)
    x = np.linspace(-3, 3, 101, dtype=np.float32)
    whole = open_session(model.SerializeToString(), onnxruntime.SessionOptions())
    expected = whole.run(["y"], {"x": x})[0]
    staged = StagedGraph(parts, ["y"], onnxruntime.SessionOptions())
    run = staged.start({"x": x})
    steps = 0
    while not run.done:
        run.step()
        steps += 1
    assert steps == stages
    np.testing.assert_array_equal(run.output("y"), expected)


def test_each_stage_reads_and_hands_on_only_what_crosses_its_cuts() -> None:
    parts = partition(chain_model(), {f"n{i}": 1.0 for i in range(5)}, 5)
    # "m" is made by the first node and read by the second and the last: the run keeps it in between.
    assert [(part.inputs, part.outputs) for part in parts] == [
        (("x",), ("m",)),
        (("m",), ("a",)),
        (("a",), ("s",)),
        (("s",), ("t",)),
        (("m", "t"), ("y",)),
    ]


def test_the_onnx_engine_refuses_zero_stages(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="at least 1"):
        OnnxEngine(tmp_path, threads=1, stages=0)
