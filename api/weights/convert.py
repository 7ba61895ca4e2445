"""Convert the int8 ONNX Kokoro-82M into the official KModel checkpoint.

The ONNX model is an export of KModel that ONNX Runtime then quantized dynamically. It holds every
trained weight once, but not in KModel's form: int8/uint8 data with scales and zero points, MatMul
weights transposed, weight norm folded into one tensor, LSTM gates reordered, many tensors renamed
(`onnx::MatMul_6547_quantized`, `/encoder/F0.1/Mul_output_0`).

How each KModel tensor is found:
- quantized weights through the node that consumes them: MatMulInteger (Linear: [in, out] back to
  [out, in], per-column scale), ConvInteger (Conv1d), Gather + DequantizeLinear (embeddings),
  DynamicQuantizeLSTM (W, R, B; gates i,o,f,c -> i,f,g,o; the second direction -> `_reverse`);
- float weights of Conv, ConvTranspose and MatMul nodes the same way (conv_post, ups, pool, l_linear);
- the module comes from the node's name: `/encoder/bert/encoder/albert_layer_groups.0/albert_layers.0/
  attention/query_3/MatMul_quant` -> `bert.encoder.albert_layer_groups.0.albert_layers.0.attention.query`
  (`_3`: the fourth pass through ALBERT's one shared layer). Where the initializer has a module name
  too, both must agree;
- conv biases are traced back through the runtime's bias quantization
  (ConvInteger -> Add <- Reshape <- Cast <- Floor <- Div(bias, scale));
- the remaining float initializers named after modules (LayerNorm, Linear biases, Snake alphas) by name.
Weight-normed modules get weight_v = W and weight_g = ||W|| (kokoro uses the old `weight_norm`, dim 0);
where int8 rounding zeroed a whole slice, v = 1 and g = 0 keep W = 0 without 0/0.

Which initializers are weights: all of them except those `_constant_kind` names -- integer tensors
(shapes, axes, indices, split sizes: `splits`, `onnx::Slice_579`), float literals the exporter folded
out of the forward code (`.../Constant_N_output_0`, `.../ConstantOfShape_output_0`: eps, the 1 of
1 + gamma, LayerNorm's unit scale, zero LSTM states, the Hann window, the harmonic numbers), the
Snake activations' 1/alpha (`.../Reciprocal_N_output_0`, checked against the mapped alpha) and the
exporter's iSTFT basis (KModel calls torch.istft and has no such tensors). Scales and zero points
belong to the weight they dequantize. A weight that maps to nothing refuses the conversion, as does
a KModel tensor left unset (the AdaIN InstanceNorm affines excepted, as in the official checkpoint;
bert.pooler is zero-filled, see UNUSED_BY_KMODEL).
"""

from __future__ import annotations

import logging
import re
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import onnx
import torch
from onnx import numpy_helper

from api.weights.kmodel import COMPONENTS, KEY_PREFIX, kmodel_skeleton, optional_keys
from api.weights.layout import atomic_write

logger = logging.getLogger(__name__)

Array = npt.NDArray[Any]
Checkpoint = dict[str, dict[str, torch.Tensor]]

# KModel's ALBERT computes a pooled output that KModel never reads, so the export pruned the pooler.
# KModel still has the two parameters and the checkpoint must carry them: they are written as zeros.
UNUSED_BY_KMODEL = ("bert.pooler.weight", "bert.pooler.bias")

# ONNX orders LSTM gates i, o, f, c; PyTorch i, f, g (= c), o.
ONNX_TO_TORCH_GATES = (0, 2, 3, 1)

_INTEGER_TYPES = frozenset({onnx.TensorProto.INT64, onnx.TensorProto.INT32, onnx.TensorProto.BOOL})
_QUANTIZED_TYPES = frozenset({onnx.TensorProto.INT8, onnx.TensorProto.UINT8})
_FLOAT_TYPES = frozenset({onnx.TensorProto.FLOAT})

# Float initializers that are not weights, by name: literals of the forward code the exporter folded
# into the graph, the folded 1/alpha of the Snake activations (derived from a weight, checked against
# it), and the exporter's own iSTFT basis (KModel calls torch.istft instead).
_CONSTANT_NAMES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"/(Constant|ConstantOfShape)(_\d+)?_output_0$"), "literal"),
    (re.compile(r"/Reciprocal(_\d+)?_output_0$"), "reciprocal"),
    (re.compile(r"\.stft\.(inverse_basis|window_sum)$"), "istft"),
)

# Module paths of the exported wrapper -> KModel paths, applied in order to dotted names. Node scopes
# put predictor.shared, F0, N, F0_proj and N_proj directly under `encoder`.
_PATH_RULES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"^encoder\.(shared|F0_proj|N_proj|F0|N)(?=\.|$)"), r"predictor.\1"),
    (re.compile(r"^encoder\."), ""),
    (re.compile(r"^decoder\.decoder\."), "decoder."),
)
_MODULE_NAMED = re.compile(r"^(encoder|decoder)\.")
# The runtime's bias quantization between a float conv bias and the ConvInteger's Add.
_BIAS_CHAIN = frozenset({"Reshape", "Cast", "Floor", "Div"})


class ConversionError(ValueError):
    """The ONNX model does not convert into a complete, consistent KModel checkpoint."""

    def __init__(self, problems: Sequence[str]) -> None:
        listed = "\n".join(f"  - {problem}" for problem in problems)
        super().__init__(f"cannot convert the ONNX model ({len(problems)} problems):\n{listed}")
        self.problems = list(problems)


# --- public API ------------------------------------------------------------------------------------------


def convert_onnx(onnx_path: Path, config: dict[str, Any]) -> Checkpoint:
    """The checkpoint {component: {'module.' + key: tensor}} held by the int8 ONNX model at `onnx_path`."""
    return convert_model(onnx.load(str(onnx_path)), config)


def convert_model(model: onnx.ModelProto, config: Mapping[str, Any]) -> Checkpoint:
    """As convert_onnx, from a loaded ModelProto. Raises ConversionError listing every problem."""
    expected, optional = kmodel_shapes(config)
    mapping = _Mapping(_Graph.of(model.graph), expected)
    for node in mapping.graph.nodes:
        rule = _NODE_RULES.get(node.op_type)
        if rule is not None:
            rule(mapping, node)
    _map_by_name(mapping)
    _check_reciprocals(mapping)
    _fill_unused(mapping)
    _check_complete(mapping, optional)
    if mapping.errors:
        raise ConversionError(mapping.errors)
    _log_summary(mapping)
    return _checkpoint(mapping.tensors, expected)


def write_checkpoint(onnx_path: Path, config: dict[str, Any], out_path: Path) -> None:
    """Convert `onnx_path` and write the checkpoint to `out_path` atomically (temp file, then rename)."""
    checkpoint = convert_onnx(onnx_path, config)
    with atomic_write(out_path) as tmp:
        torch.save(checkpoint, tmp)
    logger.info("wrote %s", out_path)


def kmodel_shapes(config: Mapping[str, Any]) -> tuple[dict[str, tuple[int, ...]], set[str]]:
    """KModel's tensor shapes as {'component.key': shape}, and the keys it may lack (AdaIN affines).

    The model is built on the meta device: shapes only, no memory, no random init.
    """
    model = kmodel_skeleton(config)
    shapes: dict[str, tuple[int, ...]] = {}
    optional: set[str] = set()
    for component in COMPONENTS:
        module = getattr(model, component)
        for key, tensor in module.state_dict().items():
            shapes[f"{component}.{key}"] = tuple(tensor.shape)
        optional.update(f"{component}.{key}" for key in optional_keys(module))
    return shapes, optional


# --- the graph and the mapping state ----------------------------------------------------------------------


@dataclass
class _Graph:
    """Initializers as arrays, and who produces and consumes each tensor."""

    arrays: dict[str, Array]
    types: dict[str, int]
    producer: dict[str, onnx.NodeProto]
    consumers: dict[str, list[onnx.NodeProto]]
    nodes: list[onnx.NodeProto]

    @classmethod
    def of(cls, graph: onnx.GraphProto) -> _Graph:
        producer: dict[str, onnx.NodeProto] = {}
        consumers: dict[str, list[onnx.NodeProto]] = defaultdict(list)
        for node in graph.node:
            producer.update({name: node for name in node.output})
            for name in node.input:
                consumers[name].append(node)
        arrays = {tensor.name: numpy_helper.to_array(tensor) for tensor in graph.initializer}
        types = {tensor.name: tensor.data_type for tensor in graph.initializer}
        return cls(arrays, types, producer, dict(consumers), list(graph.node))

    def only_consumer(self, tensor: str) -> onnx.NodeProto | None:
        found = self.consumers.get(tensor, [])
        return found[0] if len(found) == 1 else None

    def is_weight(self, name: str) -> bool:
        return name in self.arrays and _constant_kind(name, self.types[name]) is None


@dataclass
class _Mapping:
    """KModel tensors found so far, which initializers they came from, and the problems met."""

    graph: _Graph
    expected: dict[str, tuple[int, ...]]
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    used: set[str] = field(default_factory=set)
    errors: list[str] = field(default_factory=list)
    dequantized: dict[str, Array] = field(default_factory=dict)
    weight_normed: int = 0
    zero_channels: int = 0
    zero_filled: list[str] = field(default_factory=list)

    def assign(self, key: str, array: Array, source: str) -> None:
        self.used.add(source)
        if self.sources.get(key) == source:
            return  # a shared weight met again (ALBERT's one layer runs 12 times)
        if key not in self.expected:
            self.errors.append(f"{source} maps to {key}, which KModel does not have")
        elif key in self.sources:
            self.errors.append(f"{key} comes from both {self.sources[key]} and {source}")
        elif tuple(array.shape) != self.expected[key]:
            shape, wanted = tuple(array.shape), self.expected[key]
            self.errors.append(f"{key}: shape {shape} from {source}, KModel has {wanted}")
        else:
            self.tensors[key] = torch.from_numpy(np.array(array, dtype=np.float32, order="C"))
            self.sources[key] = source

    def assign_weight(self, module: str, array: Array, source: str) -> None:
        """Set `module`'s weight, or its weight_v/weight_g where KModel weight-norms the module."""
        if f"{module}.weight_v" not in self.expected:
            self.assign(f"{module}.weight", array, source)
            return
        if self.sources.get(f"{module}.weight_v") == source:
            return
        v, g, zeros = weight_norm_split(array)
        self.assign(f"{module}.weight_v", v, source)
        self.assign(f"{module}.weight_g", g, source)
        self.weight_normed += 1
        self.zero_channels += zeros

    def dequantize(self, name: str, zero_point: str | None, scale: str, axis: int) -> Array:
        """Dequantize initializer `name`; its scale and zero point count as used with it."""
        if name not in self.dequantized:
            arrays = self.graph.arrays
            zero = arrays[zero_point] if zero_point else np.zeros((), np.float32)
            self.dequantized[name] = dequantize(arrays[name], zero, arrays[scale], axis)
        self.used.update(x for x in (name, zero_point, scale) if x)
        return self.dequantized[name]


# --- array helpers ----------------------------------------------------------------------------------------


def dequantize(quantized: Array, zero_point: Array, scale: Array, axis: int) -> Array:
    """(q - zero_point) * scale in float32; a non-scalar scale/zero point runs along `axis`."""
    shape = [1] * quantized.ndim
    shape[axis] = -1

    def along(x: Array) -> Array:
        return x.astype(np.float32).reshape(shape if x.size > 1 else [1] * quantized.ndim)

    result: Array = (quantized.astype(np.float32) - along(zero_point)) * along(scale)
    return result


def weight_norm_split(weight: Array) -> tuple[Array, Array, int]:
    """v = W and g = ||W|| over all dims but 0; an all-zero slice gets v = 1, g = 0 (W stays 0, no 0/0)."""
    flat = weight.reshape(len(weight), -1).astype(np.float64)
    norm = np.sqrt((flat**2).sum(axis=1))
    zero = norm == 0
    v = weight.astype(np.float32)
    v[zero] = 1.0
    g = norm.astype(np.float32).reshape(-1, *[1] * (weight.ndim - 1))
    return v, g, int(zero.sum())


def lstm_gates(array: Array, hidden: int) -> Array:
    """Reorder the 4 * hidden rows from ONNX's gate order to PyTorch's."""
    blocks = [array[i * hidden : (i + 1) * hidden] for i in ONNX_TO_TORCH_GATES]
    return np.concatenate(blocks, axis=0)


# --- names ------------------------------------------------------------------------------------------------


def _constant_kind(name: str, data_type: int) -> str | None:
    """Why the initializer `name` is not a weight, or None if it is one."""
    if data_type in _INTEGER_TYPES:
        return "integer"
    if data_type in _QUANTIZED_TYPES:
        return None
    return next((kind for pattern, kind in _CONSTANT_NAMES if pattern.search(name)), None)


def kmodel_path(exported: str) -> str:
    """A dotted path in the exported wrapper -> the KModel path ('decoder.decoder.x' -> 'decoder.x')."""
    for pattern, replacement in _PATH_RULES:
        exported = pattern.sub(replacement, exported)
    return exported


def node_module(node_name: str) -> str:
    """The KModel module a node belongs to, from the exporter's scope in its name.

    '/encoder/text_encoder/cnn.0/cnn.0.0/Conv_quant' -> 'text_encoder.cnn.0.0': the op is dropped,
    call-count suffixes ('query_3') are dropped, and a scope repeated as its child's prefix collapses.
    """
    parts = [re.sub(r"_\d+$", "", part) for part in node_name.strip("/").split("/")[:-1]]
    children = [*parts[1:], ""]
    kept = [part for part, child in zip(parts, children, strict=True) if not child.startswith(part + ".")]
    return kmodel_path(".".join(kept))


def _module_for(mapping: _Mapping, node: onnx.NodeProto, weight: str) -> str:
    module = node_module(node.name)
    _check_name(mapping, weight, f"{module}.weight")
    return module


def _check_name(mapping: _Mapping, initializer: str, key: str) -> None:
    """Where an initializer has a module name, it must name the tensor the graph says it is."""
    if not _MODULE_NAMED.match(initializer):
        return
    named = kmodel_path(initializer.removesuffix("_quantized"))
    if named != key:
        mapping.errors.append(f"{initializer} is named like {named} but is used as {key}")


def _optional_input(node: onnx.NodeProto, index: int) -> str | None:
    return node.input[index] if len(node.input) > index and node.input[index] else None


# --- tracing ----------------------------------------------------------------------------------------------


def _weight_scale(graph: _Graph, node: onnx.NodeProto) -> str | None:
    """The weight's scale: the runtime multiplies the integer result by (input scale x weight scale).

    Walk from the node's output through the bias Add and the Cast to that Mul; its other operand is
    made by a Mul of the input scale and the weight scale, the latter an initializer.
    """
    tensor = node.output[0]
    for _ in range(3):
        consumer = graph.only_consumer(tensor)
        if consumer is None:
            return None
        if consumer.op_type == "Mul":
            other = next(name for name in consumer.input if name != tensor)
            producer = graph.producer.get(other)
            scales = [x for x in producer.input if x in graph.arrays] if producer is not None else []
            return scales[0] if len(scales) == 1 else None
        tensor = consumer.output[0]
    return None


def _traced_bias(graph: _Graph, node: onnx.NodeProto) -> str | None:
    """The float bias a ConvInteger adds, traced back through the runtime's bias quantization."""
    add = graph.only_consumer(node.output[0])
    if add is None or add.op_type != "Add":
        return None
    name = next(x for x in add.input if x != node.output[0])
    while name not in graph.arrays:
        producer = graph.producer.get(name)
        if producer is None or producer.op_type not in _BIAS_CHAIN:
            return None
        name = producer.input[0]
    return name if graph.types[name] in _FLOAT_TYPES else None


# --- rules: one per op that consumes weights ------------------------------------------------------------


def _integer_weight(mapping: _Mapping, node: onnx.NodeProto, axis: int) -> tuple[str, str, Any] | None:
    """(module, initializer, dequantized weight) for a MatMulInteger / ConvInteger node's int8 weight."""
    weight = node.input[1]
    if not mapping.graph.is_weight(weight):
        return None
    scale = _weight_scale(mapping.graph, node)
    if scale is None:
        mapping.errors.append(f"{node.name}: no scale found for {weight}")
        return None
    module = _module_for(mapping, node, weight)
    return module, weight, mapping.dequantize(weight, _optional_input(node, 3), scale, axis=axis)


def _map_matmul_integer(mapping: _Mapping, node: onnx.NodeProto) -> None:
    found = _integer_weight(mapping, node, axis=1)
    if found is not None:
        module, weight, linear = found
        mapping.assign(f"{module}.weight", linear.T, weight)


def _map_conv_integer(mapping: _Mapping, node: onnx.NodeProto) -> None:
    found = _integer_weight(mapping, node, axis=0)
    if found is None:
        return
    module, weight, conv = found
    mapping.assign_weight(module, conv, weight)
    bias = _traced_bias(mapping.graph, node)
    if bias is not None:
        _check_name(mapping, bias, f"{module}.bias")
        mapping.assign(f"{module}.bias", mapping.graph.arrays[bias], bias)


def _map_float_conv(mapping: _Mapping, node: onnx.NodeProto) -> None:
    weight, bias = node.input[1], _optional_input(node, 2)
    if not mapping.graph.is_weight(weight):
        return
    module = _module_for(mapping, node, weight)
    mapping.assign_weight(module, mapping.graph.arrays[weight], weight)
    if bias is not None and mapping.graph.is_weight(bias):
        _check_name(mapping, bias, f"{module}.bias")
        mapping.assign(f"{module}.bias", mapping.graph.arrays[bias], bias)


def _map_matmul(mapping: _Mapping, node: onnx.NodeProto) -> None:
    weight = node.input[1]
    if mapping.graph.is_weight(weight):
        module = _module_for(mapping, node, weight)
        mapping.assign(f"{module}.weight", mapping.graph.arrays[weight].T, weight)


def _map_gather(mapping: _Mapping, node: onnx.NodeProto) -> None:
    weight = node.input[0]
    if mapping.graph.types.get(weight) not in _QUANTIZED_TYPES:
        return  # a Gather over shapes or activations
    dequantizer = mapping.graph.only_consumer(node.output[0])
    if dequantizer is None or dequantizer.op_type != "DequantizeLinear":
        mapping.errors.append(f"{node.name}: {weight} is not dequantized after the Gather")
        return
    module = _module_for(mapping, node, weight)
    array = mapping.dequantize(weight, _optional_input(dequantizer, 2), dequantizer.input[1], axis=1)
    mapping.assign(f"{module}.weight", array, weight)


def _map_lstm(mapping: _Mapping, node: onnx.NodeProto) -> None:
    """W [dirs, in, 4H], R [dirs, H, 4H] (int8, per-direction scales) and B [dirs, 8H] = [Wb, Rb]."""
    module = node_module(node.name)
    hidden = next(onnx.helper.get_attribute_value(a) for a in node.attribute if a.name == "hidden_size")
    w = mapping.dequantize(node.input[1], _optional_input(node, 9), node.input[8], axis=0)
    r = mapping.dequantize(node.input[2], _optional_input(node, 11), node.input[10], axis=0)
    bias_name = node.input[3]
    bias = mapping.graph.arrays[bias_name]
    for direction, suffix in enumerate(("", "_reverse")[: len(w)]):
        params = {
            "weight_ih": (w[direction].T, node.input[1]),
            "weight_hh": (r[direction].T, node.input[2]),
            "bias_ih": (bias[direction, : 4 * hidden], bias_name),
            "bias_hh": (bias[direction, 4 * hidden :], bias_name),
        }
        for param, (array, source) in params.items():
            mapping.assign(f"{module}.{param}_l0{suffix}", lstm_gates(array, hidden), source)


_NodeRule = Callable[[_Mapping, onnx.NodeProto], None]
_NODE_RULES: dict[str, _NodeRule] = {
    "MatMulInteger": _map_matmul_integer,
    "ConvInteger": _map_conv_integer,
    "Conv": _map_float_conv,
    "ConvTranspose": _map_float_conv,
    "MatMul": _map_matmul,
    "Gather": _map_gather,
    "DynamicQuantizeLSTM": _map_lstm,
}


def _map_by_name(mapping: _Mapping) -> None:
    """Float weights not consumed by a rule above, named after their module (LayerNorm, biases, alphas)."""
    for name, data_type in mapping.graph.types.items():
        if name in mapping.used or data_type not in _FLOAT_TYPES or not mapping.graph.is_weight(name):
            continue
        if _MODULE_NAMED.match(name):
            mapping.assign(kmodel_path(name), mapping.graph.arrays[name], name)


# --- checks -----------------------------------------------------------------------------------------------


def _check_reciprocals(mapping: _Mapping) -> None:
    """Each folded 1/alpha must be the reciprocal of an alpha mapped into the same module."""
    for name, data_type in mapping.graph.types.items():
        if _constant_kind(name, data_type) != "reciprocal":
            continue
        module = node_module(name)
        alphas = [t.numpy() for key, t in mapping.tensors.items() if key.startswith(f"{module}.alpha")]
        if not any(np.allclose(1 / alpha, mapping.graph.arrays[name], rtol=1e-5) for alpha in alphas):
            mapping.errors.append(f"{name} is not 1/alpha of any alpha of {module}")


def _fill_unused(mapping: _Mapping) -> None:
    for key in UNUSED_BY_KMODEL:
        if key in mapping.expected and key not in mapping.tensors:
            mapping.tensors[key] = torch.zeros(mapping.expected[key])
            mapping.zero_filled.append(key)


def _check_complete(mapping: _Mapping, optional: set[str]) -> None:
    unset = sorted(set(mapping.expected) - set(mapping.tensors) - optional)
    if unset:
        mapping.errors.append(f"{len(unset)} KModel tensors left unset: {', '.join(unset)}")
    unused = sorted(name for name in mapping.graph.arrays if mapping.graph.is_weight(name))
    unused = [name for name in unused if name not in mapping.used]
    if unused:
        mapping.errors.append(f"{len(unused)} ONNX weight initializers unused: {', '.join(unused)}")


def _log_summary(mapping: _Mapping) -> None:
    constants = sum(not mapping.graph.is_weight(name) for name in mapping.graph.arrays)
    logger.info(
        "converted %d ONNX weights (%d initializers with their scales and zero points) into %d KModel "
        "tensors: %d int8 tensors dequantized, %d weight-normed modules split (%d all-zero channels set "
        "to v=1, g=0), %s zero-filled (unused by KModel); %d non-weight constants skipped",
        len(set(mapping.sources.values())),
        len(mapping.used),
        len(mapping.tensors),
        len(mapping.dequantized),
        mapping.weight_normed,
        mapping.zero_channels,
        " and ".join(mapping.zero_filled) or "nothing",
        constants,
    )


def _checkpoint(tensors: Mapping[str, torch.Tensor], expected: Mapping[str, tuple[int, ...]]) -> Checkpoint:
    checkpoint: Checkpoint = {component: {} for component in COMPONENTS}
    for key in expected:  # KModel's own order
        if key in tensors:
            component, _, rest = key.partition(".")
            checkpoint[component][KEY_PREFIX + rest] = tensors[key]
    return checkpoint


# --- the spectral distance ---------------------------------------------------------------------------------
# How near converted audio is to the ONNX model's (scripts/tools/check_conversion.py holds the rest of the
# conversion check), and decoded audio to its source (scripts/bench/encoders.py,
# tests/unit/test_encoder.py).

SAMPLE_RATE = 24_000
SPECTRUM_N_FFT = 1024
SPECTRUM_HOP = 256
MEL_BANDS = 80
# Spectra are floored this far below the reference's peak, so silence does not dominate the distance.
DYNAMIC_RANGE_DB = 80.0


@dataclass(frozen=True)
class SpectralDistance:
    """How far a candidate's spectrum is from a reference's, over their common length.

    mel_db: mean absolute difference of the log-mel spectrograms (80 bands, n_fft 1024, hop 256, Hann),
    in dB, both floored 80 dB below the reference's peak; mel_correlation: Pearson correlation of the
    same; stft_db: as mel_db on the linear-frequency bins (noisier: single bins of noise-like sounds
    differ by several dB between two equally right renderings).
    """

    mel_db: float
    mel_correlation: float
    stft_db: float


def spectral_distance(reference: Array, candidate: Array) -> SpectralDistance:
    length = min(len(reference), len(candidate))
    reference_power, candidate_power = _power(reference[:length]), _power(candidate[:length])
    bank = _mel_filterbank()
    mel_reference, mel_candidate = _floored_db(bank @ reference_power, bank @ candidate_power)
    stft_reference, stft_candidate = _floored_db(reference_power, candidate_power)
    return SpectralDistance(
        mel_db=float(np.abs(mel_reference - mel_candidate).mean()),
        mel_correlation=float(np.corrcoef(mel_reference.ravel(), mel_candidate.ravel())[0, 1]),
        stft_db=float(np.abs(stft_reference - stft_candidate).mean()),
    )


def _power(audio: Array) -> Array:
    window = torch.hann_window(SPECTRUM_N_FFT, dtype=torch.float64)
    signal = torch.from_numpy(np.asarray(audio, dtype=np.float64))
    spectrum = torch.stft(signal, SPECTRUM_N_FFT, SPECTRUM_HOP, window=window, return_complex=True)
    power: Array = spectrum.abs().square().numpy()
    return power


def _floored_db(reference: Array, candidate: Array) -> tuple[Array, Array]:
    reference_db = 10 * np.log10(np.maximum(reference, 1e-30))
    candidate_db = 10 * np.log10(np.maximum(candidate, 1e-30))
    floor = reference_db.max() - DYNAMIC_RANGE_DB
    return np.maximum(reference_db, floor), np.maximum(candidate_db, floor)


def _mel_filterbank() -> Array:
    """Triangular filters evenly spaced on the HTK mel scale from 0 Hz to Nyquist."""

    def to_hz(mel: Array) -> Array:
        hz: Array = 700 * (10 ** (mel / 2595) - 1)
        return hz

    top = 2595 * np.log10(1 + SAMPLE_RATE / 2 / 700)
    edges = to_hz(np.linspace(0, top, MEL_BANDS + 2))
    freqs = np.linspace(0, SAMPLE_RATE / 2, SPECTRUM_N_FFT // 2 + 1)
    lower, centre, upper = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    rising, falling = (freqs - lower) / (centre - lower), (upper - freqs) / (upper - centre)
    bank: Array = np.maximum(0, np.minimum(rising, falling))
    return bank
