"""An ONNX graph cut into stages of about equal cost, run one stage at a time, so that the engine thread
can switch to a more urgent chunk between stages instead of finishing a long one first.

Cutting never changes the arithmetic: every node runs exactly as in the whole graph, and the tensors
that cross a cut pass from one session to the next as ONNX Runtime values, so the audio is bit for bit
the whole graph's (tests/integration/test_onnx_stages.py). The cuts follow measured node costs: a
profiled run of the whole graph at load time says what each node took.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Stage:
    """One part of the graph: a model of its own (serialized, or the path of its file), the tensors it needs
    and the ones it hands on."""

    model: bytes | str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    cost_share: float


# A cut may move from its even place by up to this share of a stage's cost (either way: half of it) to
# where the fewest bytes cross it: the tensors crossing a cut stay alive through the next stage, beside
# that stage's own. Measured (docs/journal/onnx-engine.md, entry 10): 8 even cuts of the int8 graph held up to
# 320 MB across one cut for a 15 s chunk, and the worker peaked 300-370 MiB above the whole graph's;
# cuts moved within half a stage peaked where the whole graph does, the longest stage 29% longer.
CUT_SLACK = 0.5
# Bytes per element of ONNX Runtime's profile type names.
_ELEMENT_BYTES = {
    "bool": 1, "int8": 1, "uint8": 1, "int16": 2, "uint16": 2, "float16": 2, "bfloat16": 2,
    "int32": 4, "uint32": 4, "float": 4, "int64": 8, "uint64": 8, "double": 8,
}  # fmt: skip
_INT64 = 7  # onnx.TensorProto.INT64: shape arithmetic, a few bytes wherever its node was fused away


@dataclass(frozen=True)
class Profile:
    """What a profiled run measured per node name: microseconds, and the bytes and element type (ONNX
    Runtime's name: "float", "int64") of each of its outputs."""

    costs: Mapping[str, float]
    output_bytes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    output_types: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


def read_profile(path: Path) -> Profile:
    """Node costs (summed over the runs) and output sizes from an ONNX Runtime profile file."""
    costs: dict[str, float] = defaultdict(float)
    sizes: dict[str, tuple[int, ...]] = {}
    elements: dict[str, tuple[str, ...]] = {}
    suffix = "_kernel_time"
    for event in json.loads(path.read_text(encoding="utf-8")):
        name = event.get("name", "")
        if event.get("cat") == "Node" and name.endswith(suffix):
            node = name[: -len(suffix)]
            costs[node] += float(event.get("dur", 0))
            shapes = event.get("args", {}).get("output_type_shape")
            if shapes is not None:
                sizes[node] = tuple(_bytes(output) for output in shapes)
                elements[node] = tuple(next(iter(output), "") for output in shapes)
    return Profile(dict(costs), sizes, elements)


def _bytes(output: Mapping[str, Sequence[int]]) -> int:
    """{"float": [1, 64, 605]} -> its size in bytes."""
    ((element, shape),) = output.items()
    return _ELEMENT_BYTES.get(element, 8) * math.prod(shape)


def cut_points(
    costs: Sequence[float], stages: int, crossing: Sequence[float] | None = None, slack: float = CUT_SLACK
) -> list[int]:
    """Node indexes where stages begin (after the first), so each stage holds about 1/stages of the
    total cost; fewer cuts when the costs cannot fill that many stages. With `crossing` (the bytes alive
    across a cut before each node), each cut goes where the fewest bytes cross within `slack` of a
    stage's cost around its even place, the nearer of equals; never where infinitely many cross (the
    nearest place that can be cut instead, or no more cuts when none is left)."""
    if stages < 1:
        raise ValueError(f"stages must be at least 1, got {stages}")
    spent = [0.0, *itertools.accumulate(costs)]
    share = spent[-1] / stages
    cuts: list[int] = []
    for k in range(1, stages):
        target = share * k
        previous = cuts[-1] if cuts else 0
        after = range(previous + 1, len(costs))
        even = next((index for index in after if spent[index] >= target), None)
        if even is None:
            break
        if crossing is not None:
            # Where a cut can go: not across a fusion, and not within half a stage of the last cut (a
            # cut pushed far by one stays the only cut there).
            open_ = [
                index
                for index in after
                if not math.isinf(crossing[index]) and spent[index] - spent[previous] >= share / 2
            ]
            if not open_:
                break
            near = [index for index in open_ if abs(spent[index] - target) <= slack * share / 2]
            if near:
                even = min(near, key=lambda index: (crossing[index], abs(spent[index] - target)))
            elif even not in open_:
                even = min(open_, key=lambda index: abs(spent[index] - target))
        cuts.append(even)
    return cuts


def crossing_bytes(
    model: Any, output_bytes: Mapping[str, tuple[int, ...]] | None, types: Mapping[str, int] | None = None
) -> list[float]:
    """For each node index i (and the end), the bytes of the tensors made before node i and read at or
    after it (or given out by the graph): what a cut before node i keeps alive. A tensor whose node the
    profile does not list (fused or folded away by ONNX Runtime) counts as infinite, so no cut separates
    a fusion, unless it is int64 (shape arithmetic). So does one whose element type shape inference
    cannot tell (`types`, inferred when not given): a stage could not declare it as an input or output.
    Without `output_bytes` (a profile of costs alone) every other tensor counts as nothing."""
    nodes = list(model.graph.node)
    types = _element_types(model) if types is None else types
    size: dict[str, float] = {}
    made: dict[str, int] = {}
    for index, node in enumerate(nodes):
        measured = output_bytes.get(node.name, ()) if output_bytes is not None else ()
        for k, name in enumerate(node.output):
            made[name] = index
            if name not in types:
                size[name] = math.inf
            elif output_bytes is None:
                size[name] = 0.0
            elif k < len(measured):
                size[name] = measured[k]
            else:
                size[name] = 8 if types[name] == _INT64 else math.inf
    last = {name: index for index, node in enumerate(nodes) for name in node.input if name in made}
    last.update({output.name: len(nodes) for output in model.graph.output})
    known = [0.0] * (len(nodes) + 2)
    unknown = [0] * (len(nodes) + 2)
    for name, first in made.items():
        end = last.get(name, first)
        if end > first:
            if math.isinf(size[name]):
                unknown[first + 1] += 1
                unknown[end + 1] -= 1
            else:
                known[first + 1] += size[name]
                known[end + 1] -= size[name]
    alive = itertools.accumulate(known[: len(nodes) + 1])
    fused = itertools.accumulate(unknown[: len(nodes) + 1])
    return [math.inf if count else total for total, count in zip(alive, fused, strict=True)]


def partition(model: Any, profile: Profile, stages: int) -> list[Stage]:
    """Cut an ONNX model (its nodes are in a valid execution order) into stages of about equal cost,
    each cut where few bytes cross it when the profile has the nodes' output sizes."""
    import onnx
    from onnx import helper

    graph = model.graph
    if any(
        attr.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
        for n in graph.node
        for attr in n.attribute
    ):
        raise ValueError("graphs with control-flow subgraphs are not cut into stages")
    per_node = [profile.costs.get(node.name, 0.0) for node in graph.node]
    types = {**_measured_types(model, profile.output_types), **_element_types(model)}
    crossing = crossing_bytes(model, profile.output_bytes or None, types)
    bounds = [0, *cut_points(per_node, stages, crossing), len(graph.node)]
    parts = [list(graph.node[start:end]) for start, end in zip(bounds, bounds[1:], strict=False)]
    total = sum(per_node) or 1.0
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


def _measured_types(model: Any, output_types: Mapping[str, tuple[str, ...]]) -> dict[str, int]:
    """The element types ONNX Runtime gave the nodes' outputs in a profiled run, by tensor name: they
    stand in where shape inference cannot tell (an LSTM's outputs in the int8 graph)."""
    import onnx

    types: dict[str, int] = {}
    for node in model.graph.node:
        for name, element in zip(node.output, output_types.get(node.name, ()), strict=False):
            try:
                types[name] = onnx.TensorProto.DataType.Value(element.upper())
            except ValueError:
                continue
    return types


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
