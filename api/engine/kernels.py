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

The fused functions live in api/engine/fused.py, what compiles them and keeps them on disk (ahead of time,
in the background while the calls run them eagerly) in api/engine/compiled.py.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.weight_norm import WeightNorm

from api.engine.base import KernelStatus
from api.engine.choice import cpu_flags
from api.engine.choice import int8_dot as int8_dot_flags
from api.engine.compiled import (
    AheadOfTime,
    Fused,
    KernelStores,
    allow_recompiles,
    compile_cache_dir,
    compile_cache_root,
    use_compile_cache,
)
from api.engine.fused import (
    add_norm_snake,
    norm_leaky,
    norm_snake,
    norm_snake_quantized,
    quantize,
    valid_steps,
)

# The StyleTTS2 blocks scale a residual sum by 1/sqrt(2) with this exact float32 constant (a 0-d CPU
# tensor, which combines with tensors on any device).
RSQRT2 = torch.rsqrt(torch.tensor(2.0))

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
        self.compiled = compile
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
        self._norm_snake = Fused(norm_snake, compile, store)
        self._add_norm_snake = Fused(add_norm_snake, compile, store)
        self._norm_leaky = Fused(norm_leaky, compile, store)
        if int8:
            self._norm_snake_quantized = Fused(norm_snake_quantized, compile, store)
            with torch.no_grad():
                for module in int8_convolutions(decoder):
                    conv = self._convs[id(module)]
                    assert isinstance(conv, Conv)
                    dot = self.int8_dot
                    self._convs[id(module)] = QuantizedConv(conv, dtype, phased=dot, int8_dot=dot)

    def status(self) -> KernelStatus:
        """Where the compiled kernels stand: the store's, or "eager" when not compiled ("compiled" when
        compiled just in time: each new kind of input is compiled on its call)."""
        if self.ahead_of_time is not None:
            return self.ahead_of_time.status()
        return KernelStatus("compiled" if self.compiled else "eager", 0)

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
