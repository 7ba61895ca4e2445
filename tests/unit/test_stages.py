"""Cutting an ONNX graph into stages: where the cuts fall, and that running the stages one after another
gives exactly what the whole graph gives (a small graph built here; the real model in
tests/integration/test_onnx_stages.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

from api.engine.onnx_engine import OnnxEngine
from api.engine.stages import (
    Profile,
    StagedGraph,
    crossing_bytes,
    cut_points,
    open_session,
    partition,
    read_profile,
)

# IR 8, opset 17's: every onnxruntime the project installs reads it (Python 3.10's reads IR 11 at most,
# and onnx writes its newest, 14, by default).
TEST_IR_VERSION = 8


def test_cuts_divide_the_cost_evenly() -> None:
    assert cut_points([1.0] * 8, 4) == [2, 4, 6]
    assert cut_points([4.0, 1.0, 1.0, 1.0, 1.0], 2) == [1]


def test_one_stage_has_no_cut_and_zero_stages_is_refused() -> None:
    assert cut_points([1.0, 2.0], 1) == []
    with pytest.raises(ValueError, match="at least 1"):
        cut_points([1.0], 0)


def test_fewer_cuts_when_costs_cannot_fill_the_stages() -> None:
    assert cut_points([0.0, 0.0, 5.0], 3) == []


def test_a_cut_moves_within_its_slack_to_where_the_fewest_bytes_cross() -> None:
    costs = [1.0] * 8
    # The even cut (before node 4) would keep 100 bytes alive; before node 3 only 10 cross.
    crossing = [0.0, 50.0, 80.0, 10.0, 100.0, 90.0, 70.0, 60.0, 0.0]
    assert cut_points(costs, 2, crossing, slack=0.5) == [3]
    # Without slack the cut stays where the cost divides evenly.
    assert cut_points(costs, 2, crossing, slack=0.0) == [4]
    # Equal bytes: the place nearer the even one.
    assert cut_points(costs, 2, [0.0, 0, 0, 5, 5, 5, 0, 0, 0], slack=0.5) == [4]
    # Nothing within the slack (one node holds most of the cost): the even place.
    assert cut_points([1.0, 6.0, 1.0], 2, [0.0, 1.0, 9.0, 0.0], slack=0.5) == [2]


def test_a_cut_never_falls_where_infinitely_many_bytes_cross() -> None:
    inf = float("inf")
    # The even place (before node 4) separates a fusion: the nearest place that can be cut instead.
    assert cut_points([1.0] * 8, 2, [0.0, 1, 1, 1, inf, 1, 1, 1, 0], slack=0.0) == [3]
    assert cut_points([1.0] * 8, 2, [0.0, 1, 1, inf, inf, inf, 1, 1, 0], slack=0.5) == [2]
    # Nowhere left to cut: fewer stages.
    assert cut_points([1.0] * 4, 4, [0.0, inf, 1, inf, 0], slack=0.0) == [2]
    assert cut_points([1.0] * 4, 2, [0.0, inf, inf, inf, 0]) == []
    # A cut pushed far stays the only one there: no stage of nothing after it.
    assert cut_points([1.0] * 8, 4, [0.0, 1, 1, inf, inf, inf, inf, 1, 0], slack=0.0) == [2, 7]


def test_crossing_bytes_count_what_a_cut_keeps_alive() -> None:
    model = chain_model()
    sizes = {f"n{i}": (4 * (i + 1),) for i in range(5)}  # m 4, a 8, s 12, t 16, y 20 bytes
    # Before n1: m; n2: m and a; n3: m and s; n4: m and t; at the end: the graph's output y.
    assert crossing_bytes(model, sizes) == [0.0, 4.0, 12.0, 16.0, 20.0, 20.0]
    # A node the profile does not list was fused away: no cut may separate its output from its reader.
    del sizes["n2"]
    assert crossing_bytes(model, sizes)[3] == float("inf")
    assert crossing_bytes(model, sizes)[2] == 12.0


def test_a_tensor_of_unknown_type_is_never_cut() -> None:
    # onnx's shape inference cannot type an operator it does not know: "s", and "t" made from it.
    model = untyped_chain_model()
    assert crossing_bytes(model, None) == [0.0, 0.0, 0.0, float("inf"), float("inf"), 0.0]
    sizes = {f"n{i}": (4 * (i + 1),) for i in range(5)}
    assert crossing_bytes(model, sizes)[3:5] == [float("inf")] * 2


def test_a_profile_gives_costs_and_output_sizes_and_types(tmp_path: Path) -> None:
    events = [
        {"cat": "Session", "name": "model_run", "dur": 900},
        {
            "cat": "Node",
            "name": "conv_kernel_time",
            "dur": 30,
            "args": {"output_type_shape": [{"float": [1, 64, 10]}, {"int64": [3]}]},
        },
        {"cat": "Node", "name": "conv_kernel_time", "dur": 12, "args": {}},
        {"cat": "Node", "name": "conv_fence_before", "dur": 1},
    ]
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(events), encoding="utf-8")
    profile = read_profile(path)
    assert profile.costs == {"conv": 42.0}
    assert profile.output_bytes == {"conv": (4 * 640, 8 * 3)}
    assert profile.output_types == {"conv": ("float", "int64")}


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
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=TEST_IR_VERSION)


def untyped_chain_model() -> onnx.ModelProto:
    """The chain with its sine made by ONNX Runtime's own Gelu, which onnx's shape inference does not
    know."""
    model = chain_model()
    model.graph.node[2].CopyFrom(helper.make_node("Gelu", ["a"], ["s"], name="n2", domain="com.microsoft"))
    model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return model


def test_cuts_keep_tensors_of_unknown_type_inside_a_stage() -> None:
    model = untyped_chain_model()
    # Even cuts would fall before n3 and n4, across "s" and "t": those nodes stay with n2.
    parts = partition(model, Profile({f"n{i}": 1.0 for i in range(5)}), 5)
    assert [(part.inputs, part.outputs) for part in parts] == [
        (("x",), ("m",)),
        (("m",), ("a",)),
        (("a", "m"), ("y",)),
    ]
    x = np.linspace(-3, 3, 101, dtype=np.float32)
    whole = open_session(model.SerializeToString(), onnxruntime.SessionOptions())
    run = StagedGraph(parts, ["y"], onnxruntime.SessionOptions()).start({"x": x})
    while not run.done:
        run.step()
    np.testing.assert_array_equal(run.output("y"), whole.run(["y"], {"x": x})[0])
    # ONNX Runtime's profile tells the types: the cuts go where the cost divides evenly again.
    sizes = {f"n{i}": (4,) for i in range(5)}
    measured = Profile({f"n{i}": 1.0 for i in range(5)}, sizes, {f"n{i}": ("float",) for i in range(5)})
    assert [part.inputs for part in partition(model, measured, 5)] == [
        ("x",),
        ("m",),
        ("a",),
        ("s",),
        ("m", "t"),
    ]


@pytest.mark.parametrize("stages", [1, 2, 3, 5])
def test_stages_run_in_turn_equal_the_whole_graph(stages: int) -> None:
    model = chain_model()
    costs = {f"n{i}": 1.0 for i in range(5)}
    parts = partition(model, Profile(costs), stages)
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
    parts = partition(chain_model(), Profile({f"n{i}": 1.0 for i in range(5)}), 5)
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
