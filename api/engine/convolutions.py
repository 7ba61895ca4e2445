"""The decoder's convolutions in the forms the prepared kernels run (api/engine/kernels.py), any device.

Each convolution's weight is kept as a 4-D channels-last tensor in the compute dtype, and activations stay
in that (N, W, C) layout between calls: oneDNN's and cuDNN's native layout, so no reorder on the way in or
out (on 2 CPU cores a 128-channel bf16 convolution over 62,000 steps took 6.5 ms against 45 ms for conv1d on
(N, C, W)). `Conv` is a Conv1d or ConvTranspose1d that way; `PolyphaseConv` a CPU's transposed convolution
as a plain one; `QuantizedConv` a Snake block's convolution in int8 (CPU only). Weight norm is folded into
plain weights once (`folded_weight`), instead of on every call.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.weight_norm import WeightNorm

from api.engine.choice import cpu_flags
from api.engine.choice import int8_dot as int8_dot_flags
from api.engine.fused import quantize


@dataclass(frozen=True)
class Conv:
    """One Conv1d or ConvTranspose1d as a 2-D convolution over (B, C, 1, T) in channels-last layout."""

    weight: Tensor  # (out, in / groups, 1, K) or, transposed, (in, out / groups, 1, K); channels-last
    bias: Tensor | None
    stride: int
    padding: int
    dilation: int
    groups: int
    output_padding: int
    transposed: bool

    @classmethod
    def of(cls, module: nn.Module, dtype: torch.dtype) -> Conv:
        assert isinstance(module, nn.Conv1d | nn.ConvTranspose1d)
        weight = folded_weight(module).detach()
        bias = None if module.bias is None else module.bias.detach().to(dtype)
        padding = module.padding[0]
        assert isinstance(padding, int)
        transposed = isinstance(module, nn.ConvTranspose1d)
        return cls(
            weight=weight[:, :, None, :].to(dtype).contiguous(memory_format=torch.channels_last),
            bias=bias,
            stride=module.stride[0],
            padding=padding,
            dilation=module.dilation[0],
            groups=module.groups,
            output_padding=module.output_padding[0] if transposed else 0,
            transposed=transposed,
        )

    def __call__(self, x: Tensor) -> Tensor:
        """x (B, C, T) in any layout; the result is (B, C', T') with channels-last strides."""
        x4 = x.to(self.weight.dtype).unsqueeze(2)
        common = {"stride": (1, self.stride), "padding": (0, self.padding), "dilation": (1, self.dilation)}
        if self.transposed:
            output_padding = (0, self.output_padding)
            y = F.conv_transpose2d(
                x4, self.weight, self.bias, output_padding=output_padding, groups=self.groups, **common
            )
        else:
            y = F.conv2d(x4, self.weight, self.bias, groups=self.groups, **common)
        return y.squeeze(2)


class PolyphaseConv:
    """A ConvTranspose1d of stride s as a plain convolution over its input with s x out channels, one group
    of `out` per output phase, on a CPU: output step s j + r is phase r's channels at input step j, and the
    channels-last result (B, W, s, out) is already the (B, s W, out) steps in time order. oneDNN ran the
    generator's upsampling (256 to 128 channels, kernel 12, stride 6) at 39 GMAC/s as a transposed
    convolution at AVX2 dispatch, where its plain convolutions ran at 95-100; this one is faster though a
    third of its taps are zeros (each phase uses K / s = 2 of the 3 input steps around it): the bare
    int8 engine 2-5% (docs/journal/cpu-kernels-int8.md, entry 16). On a GPU the transposed convolution
    stays."""

    def __init__(self, conv: Conv) -> None:
        assert self.applies(conv)
        stride, padding = conv.stride, conv.padding
        weight = conv.weight.squeeze(2)  # (in, out, K)
        inputs, outputs, kernel = weight.shape
        taps = [
            (r, t, _phase_offset(r, t, stride, padding))
            for r in range(stride)
            for t in range(kernel // stride)
        ]
        reach = max(abs(offset) for _, _, offset in taps)
        phased = weight.new_zeros(stride, outputs, inputs, 2 * reach + 1)
        for r, t, offset in taps:
            phased[r, :, :, offset + reach] = weight[:, :, (r + padding) % stride + stride * t].T
        self.weight = phased.reshape(stride * outputs, inputs, 1, 2 * reach + 1).contiguous(
            memory_format=torch.channels_last
        )
        self.bias = None if conv.bias is None else conv.bias.repeat(stride)
        self.stride, self.reach, self.outputs = stride, reach, outputs

    @classmethod
    def where_faster(cls, conv: Conv) -> Conv | PolyphaseConv:
        """`conv` as a PolyphaseConv where one applies and its weights are on a CPU, else as it is."""
        return cls(conv) if conv.weight.device.type == "cpu" and cls.applies(conv) else conv

    @staticmethod
    def applies(conv: Conv) -> bool:
        """A transposed convolution of one group whose output is exactly stride x its input long, with
        each phase's taps around its own input step."""
        kernel = conv.weight.shape[-1]
        return (
            conv.transposed
            and conv.groups == 1
            and conv.dilation == 1
            and kernel % conv.stride == 0
            and kernel - 2 * conv.padding + conv.output_padding == conv.stride
        )

    def __call__(self, x: Tensor) -> Tensor:
        """x (B, C, W) in any layout; the result (B, out, s W) with channels-last strides."""
        x4 = x.to(self.weight.dtype).unsqueeze(2)
        y = F.conv2d(x4, self.weight, self.bias, padding=(0, self.reach))  # (B, s out, 1, W)
        batch, width = y.shape[0], y.shape[-1]
        steps: Tensor = y.permute(0, 2, 3, 1).reshape(batch, width * self.stride, self.outputs)
        return steps.transpose(1, 2)


def _phase_offset(phase: int, tap: int, stride: int, padding: int) -> int:
    """Which input step, relative to j, output step stride j + phase takes through the transposed
    kernel's tap (phase + padding) % stride + stride tap: n = m stride + k - padding solved for m - j."""
    return (phase + padding) // stride - tap


def folded_weight(module: nn.Module) -> Tensor:
    """The module's weight with the old-style weight norm (kokoro's) computed as its forward would."""
    for hook in module._forward_pre_hooks.values():
        if isinstance(hook, WeightNorm):
            weight = hook.compute_weight(module)
            assert isinstance(weight, Tensor)
            return weight
    weight = module.weight
    assert isinstance(weight, Tensor)
    return weight


# oneDNN's int8 convolutions multiply the uint8 inputs (`quantize`: 0-255) by int8 weights. With int8 dot
# products (AVX512-VNNI, AVX-VNNI, AMX) each four products are summed straight into 32 bits. Without them
# (AVX2; AVX-512 without VNNI) its kernels multiply with vpmaddubsw, which adds each pair of products (two
# adjacent input channels at one tap) into a signed 16-bit integer that saturates: 2 x 255 x 127 = 64,770 does
# not fit in 32,767, and on a real AVX2 EPYC (Zen 3) the unit tests' convolutions came out 9-16% off. There
# the weights take 64 levels a sign (2 x 255 x 64 = 32,640 fits): against fp32, 63 cost 0.005-0.016 dB of
# log-mel distance, where 7-bit inputs cost 0.57-0.96 dB (docs/journal/cpu-kernels-int8.md, entry 47).
INPUT_LEVELS = 255
PAIR_SUM_MAX = 2**15 - 1
WEIGHT_LEVELS_DOT = 127
WEIGHT_LEVELS_PAIRS = PAIR_SUM_MAX // (2 * INPUT_LEVELS)  # 64


def weight_levels(int8_dot: bool) -> int:
    """The int8 weights' levels a sign: 127 where the CPU sums int8 products in 32 bits, else 64."""
    return WEIGHT_LEVELS_DOT if int8_dot else WEIGHT_LEVELS_PAIRS


def cpu_int8_dot() -> bool:
    """Whether this CPU has int8 dot products that oneDNN may use (ONEDNN_MAX_CPU_ISA can leave them out)."""
    return bool(int8_dot_flags(cpu_flags(), os.environ.get("ONEDNN_MAX_CPU_ISA")))


def quantize_weight(weight: Tensor, levels: int) -> tuple[Tensor, Tensor]:
    """A convolution's weight (out, ...) as int8, symmetric per output channel over `levels` a sign: the
    values and each channel's scale (float32)."""
    scales = (weight.abs().amax(dim=tuple(range(1, weight.dim()))) / levels).clamp(min=1e-12)
    shape = (-1,) + (1,) * (weight.dim() - 1)
    values = torch.round(weight / scales.reshape(shape)).clamp(-levels, levels).to(torch.int8)
    return values, scales


class QuantizedConv:
    """A Conv1d of the generator's Snake blocks in int8, through oneDNN's int8 convolution (CPU only): the
    weight quantized once per output channel (symmetric, `weight_levels(int8_dot)` levels a sign: 127 where
    the CPU has int8 dot products, 64 where its kernels add pairs of products in 16 bits; `int8_dot` None:
    this CPU's), the input on every call over its own range (`quantize`), the result in `dtype`. On CPUs with
    int8 dot products (AVX512-VNNI, AMX) a 128-channel, kernel-11 convolution took half the bf16 time
    (docs/journal/cpu-kernels-int8.md, entry 14). With `phased` a convolution dilated by d runs as a plain one
    down the d columns of its input seen as (T / d, d) steps (`quantize`): oneDNN's int8 kernels ran dilated
    convolutions no faster than bf16 on AVX512-VNNI, and this view of the time-ordered values needs no
    reordering on the way in or out. Without int8 dot products (AVX2) oneDNN's own dilation is the faster:
    4-22% per dilated convolution, 2% of the engine (docs/journal/cpu-torch-engine.md, entry 20), so the
    engine passes `phased` where the CPU has them. Both give the same values."""

    def __init__(
        self, conv: Conv, dtype: torch.dtype, *, phased: bool = True, int8_dot: bool | None = None
    ) -> None:
        assert conv.stride == 1
        assert not conv.transposed
        assert conv.padding % conv.dilation == 0, "a phase's padding must be whole steps"
        self.weight_levels = weight_levels(cpu_int8_dot() if int8_dot is None else int8_dot)
        levels, self.scales = quantize_weight(conv.weight.float(), self.weight_levels)  # (out, in, 1, K)
        self.phases = conv.dilation if phased else 1
        self.dilation = [1, 1] if phased else [1, conv.dilation]
        if self.phases == 1:  # along the width of (B, C, 1, T)
            self.padding = [0, conv.padding]
        else:  # down the columns of (B, C, T / d, d)
            levels = levels.permute(0, 1, 3, 2).contiguous()
            self.padding = [conv.padding // conv.dilation, 0]
        self.groups = conv.groups
        self.packed = torch.ops.onednn.qconv_prepack(
            levels, self.scales, 1.0, 0, [1, 1], self.padding, self.dilation, self.groups, None
        )
        self.zero_points = torch.zeros(len(self.scales), dtype=torch.int64)
        self.bias = None if conv.bias is None else conv.bias.float()
        self.dtype = dtype

    def __call__(self, x: Tensor) -> Tensor:
        """x (B, C, T), channels-last strides best; the result (B, C', T) in `dtype`, channels-last."""
        return self.run(quantize(x, self.phases), x.shape[-1])

    def run(self, quantized: tuple[Tensor, Tensor, Tensor], steps: int) -> Tensor:
        """The convolution of an input of `steps` steps already quantized by `quantize` with this
        convolution's phases (or by `norm_snake_quantized`)."""
        values, scale, zero_point = quantized
        y = torch.ops.onednn.qconv2d_pointwise.tensor(
            *(values, scale, zero_point),
            *(self.packed, self.scales, self.zero_points, self.bias),
            *([1, 1], self.padding, self.dilation, self.groups),
            *(1.0, 0, self.dtype),  # no output quantization: values in `dtype`
            *("none", [], ""),  # no fused activation
        )
        # (B, C', H, W) channels-last holds the steps in time order either way
        batch, channels = y.shape[:2]
        in_time_order: Tensor = y.permute(0, 2, 3, 1).reshape(batch, -1, channels).transpose(1, 2)
        return in_time_order[:, :, :steps]
