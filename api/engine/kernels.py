"""The decoder's convolutions and activations with prepared weights and fused kernels, any device, any batch.

api/engine/batched.py runs kokoro's own modules (any device, any batch, masked). `PreparedKernels` runs the
same arithmetic faster (docs/journal/cpu-torch-engine.md, entry 9; docs/journal/gpu.md, entry 12):

- weight norm is folded into plain weights once, at load, instead of on every call;
- each convolution's weight is kept as a 4-D channels-last tensor in the compute dtype, and activations
  stay in that (N, W, C) layout between calls: oneDNN's and cuDNN's native layout, so no reorder on the way
  in or out (on 2 CPU cores a 128-channel bf16 convolution over 62,000 steps took 6.5 ms against 45 ms for
  conv1d on (N, C, W));
- each AdaIN (instance norm over time, the style's scale and shift) and the activation after it (Snake
  or leaky ReLU), with the residual add before it, is one kernel made by torch.compile (inductor), where
  eager PyTorch makes five to eight passes over the activation (Snake on 128 x 62,000: 2.5 ms against 31
  ms on a CPU). Where inductor cannot build (no C++ compiler, no Triton), the same functions run eagerly.
- In a padded batch (`lengths` given) the statistics count each item's valid steps only and every input
  to a convolution is zero past them, so each item gets what it would get alone.

The activations entering a convolution are cast to `dtype` (bfloat16 on CPUs with native bf16, and on a
GPU when asked for), the residual stream, norm statistics and the activations' arithmetic stay float32.

Inductor keeps what it built in an on-disk cache (its FX-graph and AOT-autograd caches: the C++ or Triton
kernels and the graphs around them), but its key does not tell CPU dispatch levels apart: a process run
with ATEN_CPU_CAPABILITY=avx2 after one without it loaded kernels that wrote NaN, and the other way round
one that corrupted the heap (torch 2.13, AMX Xeon). Unless TORCHINDUCTOR_CACHE_DIR is set, the cache
therefore lives under KOKORO_COMPILE_CACHE_DIR (default ~/.cache/kokoro-openai-server/compile-cache, kept
across starts, so only a machine's first start compiles: 46 s against 5 s for the warm-up on the AMX
Xeon), in a directory of its own per torch version, device (a GPU's name, compute capability and CUDA
version), version of this module's source, oneDNN ISA cap, CPU dispatch level and CPU flags: a cache made
on another CPU kind, dispatch level or GPU, or from other code, is never loaded, it is never found.

On a CPU the fused functions are compiled ahead of time (`AheadOfTime`): each variant dynamo traced is saved
whole, guards and all, beside inductor's cache, and loaded at the next start instead of traced again. A
warm start of the server took 14.6-15.9 s to /ready on the AMX Xeon, against 19.6 s (bf16) and 38.1 s
(int8) when only inductor's work was kept (docs/journal/cpu-kernels-int8.md, entry 35).
"""

from __future__ import annotations

import hashlib
import logging
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch._dynamo import config as dynamo_config
from torch.nn.utils.weight_norm import WeightNorm

from api.engine.choice import cpu_flags
from api.engine.choice import int8_dot as int8_dot_flags

logger = logging.getLogger(__name__)

# The StyleTTS2 blocks scale a residual sum by 1/sqrt(2) with this exact float32 constant (a 0-d CPU
# tensor, which combines with tensors on any device).
RSQRT2 = torch.rsqrt(torch.tensor(2.0))

# Compiled versions kept per fused function (see PreparedKernels.__init__).
RECOMPILE_LIMIT = 64

# --- the fused functions (compiled by PreparedKernels; plain PyTorch as written) -------------------------


def norm_snake(
    x: Tensor,
    valid: Tensor | None,
    h: Tensor,
    weight: Tensor,
    bias: Tensor,
    alpha: Tensor,
    eps: float,
    dtype: torch.dtype,
) -> Tensor:
    """Snake(AdaIN(x)) cast to `dtype`: x (B, C, T); h the AdaIN's fc(style) (B, 2C); alpha (1, C, 1).
    In a padded batch `valid` (B, 1, T) is 1.0 at each item's steps and 0.0 past them: the statistics count
    the valid steps only, and the result is zero past them (ready for the next convolution)."""
    y = snake(adain(x.float(), valid, h, weight, bias, eps), alpha)
    return (y if valid is None else y * valid).to(dtype)


def add_norm_snake(
    branch: Tensor,
    x: Tensor,
    valid: Tensor | None,
    h: Tensor,
    weight: Tensor,
    bias: Tensor,
    alpha: Tensor,
    eps: float,
    dtype: torch.dtype,
) -> tuple[Tensor, Tensor]:
    """The residual sum x + branch (float32) and norm_snake of it."""
    total = branch.float() + x
    return total, norm_snake(total, valid, h, weight, bias, alpha, eps, dtype)


def norm_leaky(
    x: Tensor,
    valid: Tensor | None,
    h: Tensor,
    weight: Tensor,
    bias: Tensor,
    eps: float,
    slope: float,
    dtype: torch.dtype,
) -> Tensor:
    """LeakyReLU(AdaIN(x)) cast to `dtype`, masked as norm_snake."""
    y = F.leaky_relu(adain(x.float(), valid, h, weight, bias, eps), slope)
    return (y if valid is None else y * valid).to(dtype)


def adain(x: Tensor, valid: Tensor | None, h: Tensor, weight: Tensor, bias: Tensor, eps: float) -> Tensor:
    """kokoro's AdaIN1d: (1 + gamma) * InstanceNorm1d(x) + beta, the norm's affine weight and bias applied;
    the statistics over the steps where `valid` is 1.0 when given."""
    mean, scale = norm_statistics(x, valid, eps)
    return adain_affine(x, mean, scale, h, weight, bias)


def norm_statistics(x: Tensor, valid: Tensor | None, eps: float) -> tuple[Tensor, Tensor]:
    """Each row's mean and 1 / sqrt(variance + eps) over time (its valid steps when `valid` is given)."""
    if valid is None:
        variance, mean = torch.var_mean(x, dim=-1, keepdim=True, correction=0)
    else:
        count = valid.sum(dim=-1, keepdim=True)
        mean = (x * valid).sum(dim=-1, keepdim=True) / count
        variance = ((x - mean) * valid).square().sum(dim=-1, keepdim=True) / count
    return mean, torch.rsqrt(variance + eps)


def adain_affine(x: Tensor, mean: Tensor, scale: Tensor, h: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    """AdaIN of x given its rows' statistics: per channel an increasing or decreasing affine map of x."""
    normed = (x - mean) * scale * weight[None, :, None] + bias[None, :, None]
    channels = x.shape[1]
    return (1 + h[:, :channels, None]) * normed + h[:, channels:, None]


def snake(y: Tensor, alpha: Tensor) -> Tensor:
    """Snake, y + sin(alpha y)^2 / alpha: never decreasing in y (its slope is 1 + sin(2 alpha y) >= 0)."""
    return y + (1 / alpha) * torch.sin(alpha * y).square()


def snake_for_int8(y: Tensor, alpha: Tensor) -> Tensor:
    """Snake with sin^2 to within 5e-7 (`sin_squared`), for values about to be quantized to 8 bits, where
    that error is a ten-thousandth of a level: torch.sin's vectorized code (Sleef, accurate to an ulp) was
    a quarter of the fused kernel's time at AVX2 dispatch."""
    return y + (1 / alpha) * sin_squared(alpha * y)


def sin_squared(v: Tensor) -> Tensor:
    """sin(v)^2 to within 5e-7 for |v| < 4 (beyond, v / pi's rounding adds up to 1.4e-5 at 200): v = pi
    (n + f) with n whole and |f| <= 1/2, and sin(pi f) = f P(f^2) with P a least-squares fit of degree 4
    (the sign of sin drops out in the square). The coefficients are literals: dynamo makes a float that
    the function computes an input of the compiled kernel, evaluated per element."""
    turns = v * 0.3183098861837907  # 1 / pi
    f = turns - torch.round(turns)
    g = f * f
    p = 0.07775375928004852 * g - 0.5983427336904413
    p = (p * g + 2.550086462566948) * g - 5.167710626086103
    sine = f * (p * g + 3.141592647505316)
    return sine * sine


def norm_snake_quantized(
    x: Tensor,
    valid: Tensor | None,
    h: Tensor,
    weight: Tensor,
    bias: Tensor,
    alpha: Tensor,
    eps: float,
    phases: int,
) -> tuple[Tensor, Tensor, Tensor]:
    """`quantize(norm_snake(x, ...), phases)` in two passes over x instead of four: AdaIN is affine per
    channel and Snake never decreases, so each channel's extremes of the result are those of x carried
    through both, and the range is known from the statistics' pass before a value is written. The values
    are the two functions' within a level, on about one in 10^5 (`step_statistics`, `snake_for_int8`)."""
    x = x.float()
    mean, variance, low, high = step_statistics(x, valid)
    scale = torch.rsqrt(variance + eps)
    ends = snake_for_int8(adain_affine(torch.cat([low, high], dim=-1), mean, scale, h, weight, bias), alpha)
    step, zero_point = _quantization(ends.amin(), ends.amax())
    y = snake_for_int8(adain_affine(x, mean, scale, h, weight, bias), alpha)
    values = _steps(y if valid is None else y * valid, step, zero_point, phases)
    return values, step, zero_point.to(torch.int64)


def valid_steps(width: int, lengths: Tensor) -> Tensor:
    """(B, 1, width) float32: 1.0 at each item's first `lengths` steps, 0.0 past them."""
    steps = torch.arange(width, device=lengths.device)
    return (steps[None, :] < lengths[:, None])[:, None, :].float()


def quantize(x: Tensor, phases: int) -> tuple[Tensor, Tensor, Tensor]:
    """x (B, C, T) as asymmetric uint8 over its own range, which always holds 0 (so zero padding stays
    exactly zero): the values, and the scale (float32) and zero point (int64) as 0-d tensors. The values
    are in time order (channels-last) with zeros past T up to whole `phases` d, seen as (B, C, 1, T) for
    d = 1 and as (B, C, ceil(T / d), d) otherwise: there column r holds steps r, r + d, r + 2d, ..., so
    that a convolution dilated by d is a plain one down each column (`QuantizedConv`)."""
    x = x.float()
    step, zero_point = _quantization(x.amin(), x.amax())
    return _steps(x, step, zero_point, phases), step, zero_point.to(torch.int64)


# Steps summed per block by `step_statistics`.
STATISTICS_BLOCK = 128


def step_statistics(x: Tensor, valid: Tensor | None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Each row's mean, variance, min and max over time (its valid steps where `valid` is given), (B, C, 1)
    each, in one pass that reads each step's channels together: the sums run over blocks of steps, then
    over the blocks. Inductor's reduction along time of a channels-last x (var_mean, amin) went through
    memory once per group of 8 channels, with one parallel region each: 1.5x the time at AVX2 dispatch.
    The variance is E[z^2] - E[z]^2 for z = x less the row's first value (a valid step in any item), near
    enough to the mean that nothing cancels."""
    batch, channels, width = x.shape
    pilot = x[:, :, :1]
    shifted = (x - pilot).transpose(1, 2)  # (B, T, C): the memory order of a channels-last x
    steps = x.transpose(1, 2)
    count: Tensor | float = float(width)
    low, high = steps, steps
    if valid is not None:
        inside = valid.transpose(1, 2)
        shifted = shifted * inside
        low = torch.where(inside > 0, steps, torch.inf)
        high = torch.where(inside > 0, steps, -torch.inf)
        count = valid.sum(dim=-1)  # (B, 1)
    # A block of padding more than the steps need, so that there are always two or more blocks: with one,
    # dynamo guarded on the count, and chunks shorter than a block (a 120-step Snake block: six frames)
    # needed a compiled variant of their own, built under load (docs/journal/cpu-kernels-int8.md, entry 47).
    padding = (0, 0, 0, -width % STATISTICS_BLOCK + STATISTICS_BLOCK)

    def blocked(values: Tensor, fill: float) -> Tensor:
        return F.pad(values, padding, value=fill).reshape(batch, -1, STATISTICS_BLOCK, channels)

    first = blocked(shifted, 0.0).sum(dim=2).sum(dim=1) / count
    second = blocked(shifted.square(), 0.0).sum(dim=2).sum(dim=1) / count
    variance = torch.clamp(second - first.square(), min=0.0)
    low = blocked(low, torch.inf).amin(dim=2).amin(dim=1)
    high = blocked(high, -torch.inf).amax(dim=2).amax(dim=1)
    return pilot + first[:, :, None], variance[:, :, None], low[:, :, None], high[:, :, None]


def _quantization(low: Tensor, high: Tensor) -> tuple[Tensor, Tensor]:
    """The scale and zero point (float32, 0-d) of uint8 over [low, high] widened to hold 0."""
    low, high = torch.clamp(low, max=0.0), torch.clamp(high, min=0.0)
    step = torch.clamp(high - low, min=1e-8) / 255
    return step, torch.round(-low / step)


def _steps(x: Tensor, step: Tensor, zero_point: Tensor, phases: int) -> Tensor:
    """x quantized, laid out as `quantize` says: computed and written in (B, T, C) order, the order of the
    channels-last input and of the result, so that inductor writes each value once, without a transpose."""
    steps = x.transpose(1, 2)
    steps = F.pad(steps, (0, 0, 0, -steps.shape[1] % phases))
    values = torch.clamp(torch.round(steps / step) + zero_point, 0, 255).to(torch.uint8).contiguous()
    batch, width, channels = values.shape
    if phases == 1:
        return values.reshape(batch, 1, width, channels).permute(0, 3, 1, 2)
    return values.reshape(batch, width // phases, phases, channels).permute(0, 3, 1, 2)


# --- convolutions ----------------------------------------------------------------------------------------


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


def int8_convolutions(decoder: nn.Module) -> list[nn.Module]:
    """The convolutions `QuantizedConv` takes: those of the generator's Snake blocks."""
    generator: Any = decoder.generator
    blocks = [*generator.resblocks, *generator.noise_res]
    return [conv for block in blocks for conv in [*block.convs1, *block.convs2]]


# --- the kernels -----------------------------------------------------------------------------------------


class PreparedKernels:
    """The decoder's convolutions and activations with prepared weights, the channels-last layout and fused
    AdaIN + activation kernels (this module's docstring), for one item (`lengths` None) or a padded batch.
    Built once at load from the model's decoder; the model itself is not changed. `int8` runs the Snake
    blocks' convolutions as `QuantizedConv`s; `int8_dot` says whether the CPU (as oneDNN may use it) has int8
    dot products, None that it is this CPU's (`cpu_int8_dot`): there dilated ones run `phased` and the weights
    take 127 levels a sign, elsewhere oneDNN dilates them and the weights take 64 (`weight_levels`). Compiled
    kernels are cached under `cache_root` (the setting `compile_cache_dir`), else under
    `compile_cache_root()`; they are compiled `ahead_of_time` (`AheadOfTime`) where that is true, and on a CPU
    where it is None; from `stores` when given, so that kernels built again for a reloaded model reuse what
    the process loaded."""

    def __init__(
        self,
        decoder: nn.Module,
        dtype: torch.dtype = torch.float32,
        *,
        compile: bool = True,
        int8: bool = False,
        int8_dot: bool | None = None,
        cache_root: Path | None = None,
        ahead_of_time: bool | None = None,
        stores: KernelStores | None = None,
    ) -> None:
        self.dtype = dtype
        self.int8 = int8
        self.int8_dot = cpu_int8_dot() if int8_dot is None else int8_dot
        with torch.no_grad():
            self._convs: dict[int, Conv | QuantizedConv | PolyphaseConv] = {
                id(module): PolyphaseConv.where_faster(Conv.of(module, dtype))
                for module in decoder.modules()
                if isinstance(module, nn.Conv1d | nn.ConvTranspose1d)
            }
        # Ahead of time on a CPU unless told otherwise; on a GPU (not yet measured that way) only if told.
        self.ahead_of_time: AheadOfTime | None = None
        if compile:
            device = next(iter(decoder.parameters()), torch.empty(0)).device
            cache_dir = compile_cache_dir(cache_root or compile_cache_root(), device)
            use_compile_cache(cache_dir)
            allow_recompiles()
            if device.type == "cpu" if ahead_of_time is None else ahead_of_time:
                directory = cache_dir / "ahead-of-time"
                self.ahead_of_time = stores.ahead_of_time(directory) if stores else AheadOfTime(directory)
        store = self.ahead_of_time
        self._norm_snake = _Fused(norm_snake, compile, store)
        self._add_norm_snake = _Fused(add_norm_snake, compile, store)
        self._norm_leaky = _Fused(norm_leaky, compile, store)
        if int8:
            self._norm_snake_quantized = _Fused(norm_snake_quantized, compile, store)
            with torch.no_grad():
                for module in int8_convolutions(decoder):
                    conv = self._convs[id(module)]
                    assert isinstance(conv, Conv)
                    dot = self.int8_dot
                    self._convs[id(module)] = QuantizedConv(conv, dtype, phased=dot, int8_dot=dot)

    def conv(self, module: nn.Module, x: Tensor) -> Tensor:
        """A convolution, or a Sequential of them (the decoder's asr_res)."""
        if isinstance(module, nn.Sequential):
            for layer in module:
                x = self.conv(layer, x)
            return x
        return self._convs[id(module)](x)

    def res_block1(self, block: Any, x: Tensor, style: Tensor, lengths: Tensor | None) -> Tensor:
        """kokoro's AdaINResBlock1 (the generator's Snake blocks)."""
        valid = None if lengths is None else valid_steps(x.shape[-1], lengths)
        x = given = x.float()
        layers = list(
            zip(
                block.convs1,
                block.convs2,
                block.adain1,
                block.adain2,
                block.alpha1,
                block.alpha2,
                strict=True,
            )
        )
        if self.int8:
            return self._res_block1_int8(layers, given, style, valid)
        pending: Tensor | None = None
        for conv1, conv2, norm1, norm2, alpha1, alpha2 in layers:
            if pending is None:
                xt = self._snake_conv(conv1, x, valid, norm1, style, alpha1)
            else:
                x, xt = self._add_snake_conv(conv1, pending, x, valid, norm1, style, alpha1)
            pending = self._snake_conv(conv2, xt, valid, norm2, style, alpha2)
        assert pending is not None
        if x is given:  # a block of one layer: the caller's tensor, not to be written
            return pending.float() + x
        return x.add_(pending)  # this block's own running sum: in place saves a buffer at the peak

    def _res_block1_int8(
        self, layers: list[tuple[Any, ...]], given: Tensor, style: Tensor, valid: Tensor | None
    ) -> Tensor:
        """res_block1 with int8 convolutions, holding as few activations at once as it can: each input
        is let go once quantized, before the convolution's result is allocated, and the block's running
        sum is added to in place (eagerly: the same passes over memory as the fused add). At the peak a
        layer holds the block's input and running sum, one convolution's result and the quantized values,
        where the float path holds two more activations."""
        steps = given.shape[-1]
        total: Tensor | None = None
        for conv1, conv2, norm1, norm2, alpha1, alpha2 in layers:
            first, second = self._convs[id(conv1)], self._convs[id(conv2)]
            assert isinstance(first, QuantizedConv)
            assert isinstance(second, QuantizedConv)
            quantized = self._quantized(first, given if total is None else total, valid, norm1, style, alpha1)
            xt = first.run(quantized, steps)
            quantized = self._quantized(second, xt, valid, norm2, style, alpha2)
            del xt
            branch = second.run(quantized, steps)
            del quantized
            total = branch.float().add_(given) if total is None else total.add_(branch)
            del branch
        assert total is not None
        return total

    def _quantized(
        self, conv: QuantizedConv, x: Tensor, valid: Tensor | None, norm: Any, style: Tensor, alpha: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        args = _snake_args(norm, style, alpha)
        return self._norm_snake_quantized(x, valid, *args, conv.phases)  # type: ignore[no-any-return]

    def res_block(self, block: Any, x: Tensor, style: Tensor, lengths: Tensor | None) -> Tensor:
        """StyleTTS2's AdainResBlk1d (the decoder's blocks); twice as long out as in where it upsamples."""
        slope = block.actv.negative_slope
        valid = None if lengths is None else valid_steps(x.shape[-1], lengths)
        residual = self._leaky(x, valid, block.norm1, style, slope)
        if block.upsample_type != "none":
            residual = self.conv(block.pool, residual)
            if lengths is not None:  # the pool's bias reaches past the items' doubled lengths
                valid = valid_steps(residual.shape[-1], lengths.mul(2))
                residual = residual * valid.to(residual.dtype)
        residual = self.conv(block.conv1, residual)
        residual = self._leaky(residual, valid, block.norm2, style, slope)
        residual = self.conv(block.conv2, residual)
        shortcut = block.upsample(x)
        if block.learned_sc:
            shortcut = self.conv(block.conv1x1, shortcut)
        total: Tensor = (residual.float() + shortcut.float()) * RSQRT2
        return total

    def _snake_conv(
        self, module: nn.Module, x: Tensor, valid: Tensor | None, norm: Any, style: Tensor, alpha: Tensor
    ) -> Tensor:
        """module(Snake(AdaIN(x))) for a float convolution."""
        args = _snake_args(norm, style, alpha)
        return self.conv(module, self._norm_snake(x, valid, *args, self.dtype))

    def _add_snake_conv(
        self,
        module: nn.Module,
        branch: Tensor,
        x: Tensor,
        valid: Tensor | None,
        norm: Any,
        style: Tensor,
        alpha: Tensor,
    ) -> tuple[Tensor, Tensor]:
        """The residual sum x + branch and module(Snake(AdaIN(the sum))), as `_snake_conv`."""
        args = _snake_args(norm, style, alpha)
        total, activation = self._add_norm_snake(branch, x, valid, *args, self.dtype)
        return total, self.conv(module, activation)

    def _leaky(self, x: Tensor, valid: Tensor | None, norm: Any, style: Tensor, slope: float) -> Tensor:
        args = (*_adain_args(norm, style), norm.norm.eps, slope, self.dtype)
        return self._norm_leaky(x, valid, *args)  # type: ignore[no-any-return]


def _snake_args(norm: Any, style: Tensor, alpha: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, float]:
    """What the Snake functions take after x (and `valid`): the AdaIN's, Snake's alpha and the norm's eps."""
    return (*_adain_args(norm, style), _plain(alpha), norm.norm.eps)


def _adain_args(layer: Any, style: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """An AdaIN1d's fc(style) and its norm's affine weight and bias, as plain tensors (see `_plain`)."""
    return layer.fc(style), _plain(layer.norm.weight), _plain(layer.norm.bias)


def _plain(parameter: Tensor) -> Tensor:
    """A parameter's values as a plain tensor (a view): torch.compile fixes the shapes of the parameters it
    is given, and through them the channel count of every tensor they meet, so each width of the decoder
    would be compiled anew (and the eighth would run eagerly, past dynamo's recompile limit)."""
    return parameter.detach()


def allow_recompiles() -> None:
    """Raise dynamo's limit of compiled versions per function to RECOMPILE_LIMIT on the calling thread.

    Each function meets up to a few dozen kinds of input (float32 or the kernels' dtype, three memory
    layouts, one item or a batch, masked or not, short or long, one thread or several): past dynamo's
    default of 8 the rest would run eagerly, at a third of the speed. torch keeps every change to its
    config per thread (a ContextVar), so each thread that calls the kernels must call this first: a lane
    that did not hit the default limit within minutes (docs/journal/cpu-threads-and-replicas.md, entry 19)."""
    dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, RECOMPILE_LIMIT)


class _Fused:
    """A function compiled with torch.compile (dynamic shapes), run eagerly instead once compiling fails.

    Given a store (`AheadOfTime`), each kind of input it meets is compiled ahead of time instead, and what
    any earlier start compiled there is loaded from it; if that fails, just in time."""

    def __init__(self, function: Callable[..., Any], compile: bool, store: AheadOfTime | None = None) -> None:
        self._eager = function
        self._store = store if compile else None
        self._run: Callable[..., Any] = function
        if compile and store is None:
            self._run = torch.compile(function, dynamic=True)

    def __call__(self, *args: Any) -> Any:
        if self._store is not None:
            try:
                return self._store.run(self._eager, args)
            except Exception:  # noqa: BLE001 - see AheadOfTime: the just-in-time compiler takes over
                logger.warning(
                    "compiling %s ahead of time failed: compiling it just in time",
                    self._eager.__name__,
                    exc_info=True,
                )
                self._store = None
                self._run = torch.compile(self._eager, dynamic=True)
        if self._run is self._eager:
            return self._eager(*args)
        try:
            return self._run(*args)
        except Exception:  # noqa: BLE001 - any inductor failure (no compiler, unsupported op) falls back
            logger.warning(
                "torch.compile failed for %s: running it eagerly", self._eager.__name__, exc_info=True
            )
            self._run = self._eager
            return self._eager(*args)


class AheadOfTime:
    """The fused functions compiled ahead of time (torch.compile's `aot_compile`), one variant per kind of
    input (dtype, layout, masked or not, sizes of 1), saved in `directory` and loaded from it at the next
    start. The just-in-time compiler keeps only inductor's work on disk: each start traced every variant
    again, 20 s of a warm start of the int8 engine (docs/journal/cpu-kernels-int8.md, entries 34 and 35),
    where loading a saved variant takes 15-80 ms. A call runs the first variant whose guards (dynamo's
    own, saved with it) accept its arguments; when none does, a new variant is compiled and saved (named by
    `variant_key`, so that workers compiling it at once leave one file; a new variant with a held one's key,
    told apart from it by a guard the key does not see, is saved under the key and the first free ordinal
    instead of over that one's file).
    Variants of another torch, device or CPU are never found (`compile_cache_dir`)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.loaded = 0
        self.built = 0
        self._variants: dict[str, list[Any]] = {}
        self._names: dict[str, set[str]] = {}  # per function, the held variants' names (`variant_name`)
        self._lock = threading.Lock()

    def run(self, function: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        variants = self._variants.get(function.__name__)
        if variants is None:
            variants = self._load(function)
        index, variant = _accepting(variants, args)
        if variant is None:
            with self._lock:
                variant = self._compile(function, args)
        elif index:
            self._to_front(function.__name__, variant)
        return variant(*args)

    def _to_front(self, name: str, variant: Any) -> None:
        """Check `variant` first from now on (a function's calls meet a few of its variants over and over;
        each check costs about 15 us), unless another thread is changing the list."""
        if self._lock.acquire(blocking=False):
            try:
                self._variants[name] = [
                    variant,
                    *(other for other in self._variants[name] if other is not variant),
                ]
            finally:
                self._lock.release()

    def _load(self, function: Callable[..., Any]) -> list[Any]:
        with self._lock:
            if function.__name__ in self._variants:
                return self._variants[function.__name__]
            namespace = sys.modules[function.__module__].__dict__
            variants, names = [], set()
            for path in sorted(self.directory.glob(f"{function.__name__}-*.bin")):
                try:
                    with path.open("rb") as file:
                        variant: Any = torch.compiler.load_compiled_function(file, f_globals=namespace)
                except Exception:  # noqa: BLE001 - a damaged or foreign file: compiled again if needed
                    logger.warning("could not load the compiled %s: skipped", path, exc_info=True)
                    continue
                variant.disable_guard_check()  # `run` checks them itself, once
                variants.append(variant)
                names.add(path.stem.removeprefix(f"{function.__name__}-"))
            self.loaded += len(variants)
            self._variants[function.__name__] = variants
            self._names[function.__name__] = names
            return variants

    def _compile(self, function: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        variants = self._variants[function.__name__]
        _, meanwhile = _accepting(variants, args)  # another thread may have compiled it
        if meanwhile is not None:
            return meanwhile
        traced: Any = torch.compile(function, dynamic=True, fullgraph=True)
        compiled = traced.aot_compile((args, {}))
        self.directory.mkdir(parents=True, exist_ok=True)
        names = self._names[function.__name__]
        name = variant_name(variant_key(args), names)
        # torch writes it beside and renames it into place: whole or not at all, whichever process writes.
        compiled.save_compiled_function(str(self.directory / f"{function.__name__}-{name}.bin"))
        compiled.disable_guard_check()
        names.add(name)
        self._variants[function.__name__] = [*variants, compiled]
        self.built += 1
        return compiled


class KernelStores:
    """The kernels compiled ahead of time that a process has loaded, one `AheadOfTime` per directory, kept
    across engines: a worker that frees its model when idle and loads it again reuses them. Loading them
    again for each new engine kept about 5 MiB more each time (torch holds every loaded variant's runtime
    metadata; docs/journal/voices-and-unload.md, entry 45)."""

    def __init__(self) -> None:
        self._stores: dict[Path, AheadOfTime] = {}
        self._lock = threading.Lock()

    def ahead_of_time(self, directory: Path) -> AheadOfTime:
        with self._lock:
            if directory not in self._stores:
                self._stores[directory] = AheadOfTime(directory)
            return self._stores[directory]


def _accepting(variants: list[Any], args: tuple[Any, ...]) -> tuple[int, Any]:
    """The first of `variants` whose guards accept `args`, and where it stands; (-1, None) if none does."""
    for index, variant in enumerate(variants):
        if variant.guard_check(*args):
            return index, variant
    return -1, None


def variant_key(args: tuple[Any, ...]) -> str:
    """A name for the variant that `args` need, from what dynamo's guards tell apart (each tensor's dtype,
    device, sizes of 1, memory order; each int; None; the thread count; grad mode): workers that compile
    the same variant at once write one file, not one each. Only a name: a loaded variant's own guards still
    decide which calls it takes."""
    parts: list[object] = [
        torch.get_num_threads(),
        torch.is_grad_enabled(),
        torch.is_inference_mode_enabled(),
    ]
    for arg in args:
        if isinstance(arg, Tensor):
            strides = arg.stride()
            order = sorted(range(arg.dim()), key=lambda dim: -strides[dim])
            ones = [size == 1 for size in arg.shape]
            parts.append((str(arg.dtype), arg.device.type, tuple(order), tuple(ones), arg.requires_grad))
        elif isinstance(arg, bool | int | torch.dtype) or arg is None:
            parts.append(repr(arg))
        else:
            parts.append(type(arg).__name__)
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:16]


def variant_name(key: str, held: set[str]) -> str:
    """The file name (less the function's) for a new variant of `key`: the key itself, or where a held
    variant has that name already, the key with the first ordinal no held variant has."""
    if key not in held:
        return key
    return next(f"{key}-{ordinal}" for ordinal in range(1, len(held) + 2) if f"{key}-{ordinal}" not in held)


def release_library_convolutions(decoder: nn.Module) -> None:
    """Drop the weights that the decoder's own convolution modules hold, once PreparedKernels hold theirs:
    with weight norm each module keeps its direction, its norm and the weight computed from them (about
    0.4 GB for the decoder in fp32). Calling such a module afterwards raises ReleasedModuleError."""
    for module in decoder.modules():
        if not isinstance(module, nn.Conv1d | nn.ConvTranspose1d):
            continue
        for key, hook in list(module._forward_pre_hooks.items()):
            if isinstance(hook, WeightNorm):
                del module._forward_pre_hooks[key]
        for name in ("weight", "weight_g", "weight_v"):
            value = getattr(module, name, None)
            if isinstance(value, nn.Parameter):
                setattr(module, name, nn.Parameter(value.new_empty(0), requires_grad=False))
            elif isinstance(value, Tensor):
                setattr(module, name, value.new_empty(0))
        module.register_forward_pre_hook(_refuse_released)


def fold_weight_norms(model: nn.Module) -> int:
    """Give every module that still runs kokoro's weight norm (the text side and the prosody predictor;
    the decoder runs through PreparedKernels) the weight it computes, once: it then holds one tensor
    instead of three and no longer computes it on every call (19 times per chunk). The same values bit for
    bit. Returns how many modules were folded."""
    folded = 0
    with torch.no_grad():
        for module in model.modules():
            for hook in [hook for hook in module._forward_pre_hooks.values() if isinstance(hook, WeightNorm)]:
                nn.utils.remove_weight_norm(module, hook.name)
                folded += 1
    return folded


class ReleasedModuleError(RuntimeError):
    """A decoder module whose weights were released was called (PreparedKernels run the decoder instead)."""


def _refuse_released(module: nn.Module, args: Any) -> None:
    raise ReleasedModuleError(
        f"{type(module).__name__}'s weights were released: PreparedKernels run the decoder"
    )


# Where compiled kernels are kept across starts: the setting `compile_cache_dir` (api/settings.py, the same
# default), which the server passes down (api/app.py's build_engine); an engine built without it (scripts,
# tests) reads the same variable here.
COMPILE_CACHE_ENV = "KOKORO_COMPILE_CACHE_DIR"
DEFAULT_COMPILE_CACHE_DIR = Path.home() / ".cache" / "kokoro-openai-server" / "compile-cache"


# This module's source, hashed once: `compile_cache_dir` keys the cache by it.
SOURCE_KEY = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:10]


def compile_cache_root() -> Path:
    """KOKORO_COMPILE_CACHE_DIR, else DEFAULT_COMPILE_CACHE_DIR."""
    chosen = os.environ.get(COMPILE_CACHE_ENV)
    return Path(chosen).expanduser() if chosen else DEFAULT_COMPILE_CACHE_DIR


def compile_cache_dir(root: Path, device: torch.device | str = "cpu") -> Path:
    """Inductor's cache directory under `root` for this torch, device, this module's source, oneDNN ISA cap,
    CPU dispatch level and CPU (see the module docstring). The source counts because a variant compiled
    ahead of time is loaded by name and runs the code it was traced from: after an upgrade that changed a
    fused function, the old code ran on (found by the test of entry 47, docs/journal/cpu-kernels-int8.md).
    The directory name ends in the dispatch level and the CPU flags' hash."""
    flags = hashlib.sha256(" ".join(sorted(cpu_flags())).encode()).hexdigest()[:12]
    level = torch.backends.cpu.get_cpu_capability().lower()
    isa_cap = _safe(os.environ.get("ONEDNN_MAX_CPU_ISA", "any").lower())
    device_name = device_key(torch.device(device))
    key = f"torch{torch.__version__}-{device_name}-src{SOURCE_KEY}-{isa_cap}-{level}-{flags}"
    return root / f"kokoro-inductor-{key}"


def device_key(device: torch.device) -> str:
    """`cpu`, or a CUDA device's name, compute capability and CUDA version (Triton builds for all three)."""
    if device.type != "cuda":
        return device.type
    major, minor = torch.cuda.get_device_capability(device)
    name = _safe(torch.cuda.get_device_name(device).lower())
    return f"cuda{torch.version.cuda}_sm{major}{minor}_{name}"


def _safe(text: str) -> str:
    return "".join(char if char.isalnum() or char in "._" else "_" for char in text)


def compile_cache_summary(ahead_of_time: AheadOfTime | None = None) -> str:
    """How many compiled graphs this process loaded and how many it built, and where the cache is: the
    variants compiled `ahead_of_time` where given, else inductor's FX-graph cache (torch's own counters)."""
    from torch._dynamo.utils import counters

    where = os.environ.get("TORCHINDUCTOR_CACHE_DIR", "inductor's default")
    if ahead_of_time is None:
        hits, misses = counters["inductor"]["fxgraph_cache_hit"], counters["inductor"]["fxgraph_cache_miss"]
    else:
        hits, misses = ahead_of_time.loaded, ahead_of_time.built
        where += f", compiled ahead of time in {ahead_of_time.directory.name}"
    return f"compiled kernels: {hits} graphs loaded from the cache, {misses} built (cache {where})"


def use_compile_cache(path: Path) -> None:
    """Point inductor at `path`, unless the user chose a TORCHINDUCTOR_CACHE_DIR (inductor writes its
    default into that variable when it is first imported, so the default counts as not chosen)."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    current = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if current is None or os.path.abspath(current) == os.path.abspath(default_cache_dir()):
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(path)
