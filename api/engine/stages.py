"""An ONNX graph cut into stages of about equal cost, run one stage at a time, so that the engine thread
can switch to a more urgent chunk between stages instead of finishing a long one first.

Cutting never changes the arithmetic: every node runs exactly as in the whole graph, and the tensors
that cross a cut pass from one session to the next as ONNX Runtime values, so the audio is bit for bit
the whole graph's (tests/integration/test_onnx_stages.py). The cuts follow measured node costs: a
profiled run of the whole graph at load time says what each node took.
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Stage:
    """One part of the graph: a model of its own, the tensors it needs and the ones it hands on."""

    model: bytes
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    cost_share: float


def node_costs(profile: Path) -> dict[str, float]:
    """Microseconds per node name, summed over the runs in an ONNX Runtime profile file."""
    costs: dict[str, float] = defaultdict(float)
    suffix = "_kernel_time"
    for event in json.loads(profile.read_text(encoding="utf-8")):
        name = event.get("name", "")
        if event.get("cat") == "Node" and name.endswith(suffix):
            costs[name[: -len(suffix)]] += float(event.get("dur", 0))
    return dict(costs)


def cut_points(costs: Sequence[float], stages: int) -> list[int]:
    """Node indexes where stages begin (after the first), so each stage holds about 1/stages of the
    total cost; fewer cuts when the costs cannot fill that many stages."""
    if stages < 1:
        raise ValueError(f"stages must be at least 1, got {stages}")
    total = sum(costs)
    cuts: list[int] = []
    spent = 0.0
    for index, cost in enumerate(costs):
        if len(cuts) < stages - 1 and index > 0 and spent >= total * (len(cuts) + 1) / stages:
            cuts.append(index)
        spent += cost
    return cuts


def partition(model: Any, costs: Mapping[str, float], stages: int) -> list[Stage]:
    """Cut an ONNX model (its nodes are in a valid execution order) into stages of about equal cost."""
    import onnx
    from onnx import helper

    graph = model.graph
    if any(
        attr.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
        for n in graph.node
        for attr in n.attribute
    ):
        raise ValueError("graphs with control-flow subgraphs are not cut into stages")
    per_node = [costs.get(node.name, 0.0) for node in graph.node]
    bounds = [0, *cut_points(per_node, stages), len(graph.node)]
    parts = [list(graph.node[start:end]) for start, end in zip(bounds, bounds[1:], strict=False)]
    total = sum(per_node) or 1.0
    types = _element_types(model)
    initializers = {tensor.name: tensor for tensor in graph.initializer}
    produced_in = {out: k for k, part in enumerate(parts) for node in part for out in node.output}
    used_in: dict[str, set[int]] = defaultdict(set)
    for k, part in enumerate(parts):
        for node in part:
            for name in node.input:
                used_in[name].add(k)
    finals = {out.name for out in graph.output}
    result = []
    for k, part in enumerate(parts):
        needed = {name for node in part for name in node.input if name and name not in initializers}
        inputs = sorted(name for name in needed if produced_in.get(name, -1) < k)
        outputs = sorted(
            out for node in part for out in node.output if out in finals or max(used_in.get(out, {k})) > k
        )
        used = sorted({name for node in part for name in node.input if name in initializers})
        sub = helper.make_graph(
            part,
            f"stage{k}",
            [helper.make_tensor_value_info(name, types[name], None) for name in inputs],
            [helper.make_tensor_value_info(name, types[name], None) for name in outputs],
            initializer=[initializers[name] for name in used],
        )
        stage_model = helper.make_model(sub, opset_imports=model.opset_import, ir_version=model.ir_version)
        share = sum(per_node[bounds[k] : bounds[k + 1]]) / total
        result.append(Stage(stage_model.SerializeToString(), tuple(inputs), tuple(outputs), share))
    return result


def _element_types(model: Any) -> dict[str, int]:
    """Every tensor's element type, by shape inference over a copy without the weights' data (their
    types and shapes stand in as inputs), so the weights are never copied."""
    import onnx
    from onnx import helper

    graph = model.graph
    weights = [helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in graph.initializer]
    light = helper.make_graph(list(graph.node), graph.name, [*graph.input, *weights], list(graph.output))
    light_model = helper.make_model(light, opset_imports=model.opset_import, ir_version=model.ir_version)
    inferred = onnx.shape_inference.infer_shapes(light_model).graph
    values = [*inferred.value_info, *inferred.input, *inferred.output]
    return {value.name: value.type.tensor_type.elem_type for value in values}


def share_thread_pool(threads: int) -> Any:
    """Session options drawing `threads` intra-op threads from ONNX Runtime's process-wide pool (made
    here unless it exists), so sessions run one after another (a graph's stages) never leave a pool
    spinning against the next one's (10-15% slower with a pool per stage)."""
    import onnxruntime
    from onnxruntime.capi import _pybind_state

    try:
        _pybind_state.set_global_thread_pool_sizes(threads, 1)
    except Exception as exc:  # onnxruntime's Fail when the pool exists already: it is used as it is
        if "already been created" not in str(exc):
            raise
    options = onnxruntime.SessionOptions()
    options.use_per_session_threads = False
    return options


def open_session(model: str | bytes, options: Any) -> Any:
    """An ONNX Runtime CPU session; once the process-wide pool exists, every session must use it, so a
    session asked with its own threads is opened again on the shared pool."""
    import onnxruntime

    providers = ["CPUExecutionProvider"]
    try:
        return onnxruntime.InferenceSession(model, sess_options=options, providers=providers)
    except RuntimeError as exc:
        if "global thread pool" not in str(exc) or not options.use_per_session_threads:
            raise
    options.use_per_session_threads = False
    return onnxruntime.InferenceSession(model, sess_options=options, providers=providers)


class StagedGraph:
    """The stages' sessions, built once; `start` begins a run over them."""

    def __init__(self, stages: Sequence[Stage], outputs: Sequence[str], options: Any) -> None:
        self.sessions = tuple(open_session(stage.model, options) for stage in stages)
        # The stages' model bytes are not kept: the sessions hold what they need.
        self.stages = tuple(Stage(b"", stage.inputs, stage.outputs, stage.cost_share) for stage in stages)
        self.outputs = tuple(outputs)
        # After stage k, only what a later stage reads (or the graph's outputs) needs to be kept.
        self.keep = tuple(
            {name for later in self.stages[k + 1 :] for name in later.inputs} | set(self.outputs)
            for k in range(len(self.stages))
        )

    def start(self, feeds: Mapping[str, Any]) -> StagedRun:
        return StagedRun(self, feeds)


class StagedRun:
    """One chunk going through the stages: `step` runs the next stage; once `done`, `output` reads the
    graph's outputs. A paused run holds only the tensors that cross its next cut."""

    def __init__(self, graph: StagedGraph, feeds: Mapping[str, Any]) -> None:
        import onnxruntime

        self._graph = graph
        self._values = {
            name: onnxruntime.OrtValue.ortvalue_from_numpy(array) for name, array in feeds.items()
        }
        self._next = 0

    @property
    def done(self) -> bool:
        return self._next == len(self._graph.stages)

    def step(self) -> None:
        stage = self._graph.stages[self._next]
        results = self._graph.sessions[self._next].run_with_ort_values(
            list(stage.outputs), {name: self._values[name] for name in stage.inputs}
        )
        self._values.update(zip(stage.outputs, results, strict=True))
        keep = self._graph.keep[self._next]
        self._values = {name: value for name, value in self._values.items() if name in keep}
        self._next += 1

    def output(self, name: str) -> Any:
        return self._values[name].numpy()
