"""The decoder's convolutions and activations with prepared weights and fused kernels, any device, any batch.

api/engine/batched.py runs kokoro's own modules (any device, any batch, masked). `PreparedKernels` runs the
same arithmetic faster (docs/journal/cpu-torch-engine.md, entry 9; docs/journal/gpu.md, entry 12):

- weight norm is folded into plain weights once, at load, instead of on every call;
- each convolution runs in the channels-last layout, its weight in the compute dtype, and activations stay in
  that layout between calls (api/engine/convolutions.py: `Conv`, `PolyphaseConv`, `QuantizedConv`);
- each AdaIN (instance norm over time, the style's scale and shift) and the activation after it (Snake
  or leaky ReLU), with the residual add before it, is one kernel made by torch.compile (inductor), where
  eager PyTorch makes five to eight passes over the activation (Snake on 128 x 62,000: 2.5 ms against 31
  ms on a CPU). Where inductor cannot build (no C++ compiler, no Triton), the same functions run eagerly.
- In a padded batch (`lengths` given) the statistics count each item's valid steps only and every input
  to a convolution is zero past them, so each item gets what it would get alone.

The activations entering a convolution are cast to `dtype` (bfloat16 on CPUs with native bf16, and on a
GPU when asked for), the residual stream, norm statistics and the activations' arithmetic stay float32.

The fused functions live in api/engine/fused.py, what compiles them (ahead of time, in the background while
the calls run them eagerly) in api/engine/compiled.py, and where they are kept on disk in
api/engine/compile_cache.py. The module surgery at the end of this module lets the model's own decoder
modules go once the prepared kernels hold their weights.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.utils.weight_norm import WeightNorm

from api.engine.base import KernelStatus
from api.engine.compile_cache import compile_cache_dir, compile_cache_root, use_compile_cache
from api.engine.compiled import AheadOfTime, Fused, KernelStores, allow_recompiles
from api.engine.convolutions import Conv, PolyphaseConv, QuantizedConv, cpu_int8_dot
from api.engine.fused import add_norm_snake, norm_leaky, norm_snake, norm_snake_quantized, valid_steps

# The StyleTTS2 blocks scale a residual sum by 1/sqrt(2) with this exact float32 constant (a 0-d CPU
# tensor, which combines with tensors on any device).
RSQRT2 = torch.rsqrt(torch.tensor(2.0))


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
