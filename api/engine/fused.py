"""The fused functions: AdaIN with Snake or leaky ReLU, the int8 quantization of an activation, masked
statistics. Plain PyTorch, run eagerly as written or compiled by inductor (api/engine/compiled.py), one kernel
each where eager PyTorch makes five to eight passes over the activation.

Only this module's code is traced into compiled kernels: the compile cache is keyed by its syntax tree
(`api.engine.compile_cache.SOURCE_KEY`), so an edit elsewhere, or to a comment or a docstring here, keeps it.
Nothing here may read a global that can change between starts: a compiled variant runs what it was traced
from.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


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
