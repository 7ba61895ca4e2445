"""Kokoro's forward pass for a batch of chunks of different lengths, voices and speeds.

`KModel.forward_with_tokens` assumes one chunk: no text mask, unpacked LSTMs, one alignment built with
`repeat_interleave`, InstanceNorm statistics over the whole time axis, one style and one speed, a squeezed
output. Here each of those is done per item on padded tensors, with kokoro's own modules and weights:

- tokens: a text mask from per-item lengths (PL-BERT attention, kokoro's masked encoders), packed LSTMs;
- durations: per-item speed, padding tokens get zero frames, the alignment is built with vectorized ops;
- every time-axis operation (convolutions, InstanceNorm in each AdaIN, interpolation, STFT, inverse STFT)
  sees exactly what it would see for the item alone: inputs are zeroed past each item's length before
  every convolution, normalization statistics only count valid steps, the overlap-add divides by each
  item's own window envelope;
- the vocoder's harmonic source (sines, noise, STFT) is computed per item, in the library's own shapes and
  order, its random draws from the item's own generator, so it is bit for bit the library's whatever
  kernels the CPU or GPU dispatches to; a seeded item gives the same audio alone or batched.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from api.engine.fused import adain, valid_steps
from api.engine.kernels import RSQRT2, PreparedKernels


@dataclass(frozen=True)
class Batch:
    """Padded model inputs: token ids with the boundary tokens, lengths, styles, speeds, noise sources."""

    input_ids: Tensor  # (B, T) long, 0-padded
    lengths: Tensor  # (B,) long, tokens per item including both boundary tokens
    styles: Tensor  # (B, 256)
    speeds: Tensor  # (B,)
    generators: Sequence[torch.Generator | None]  # per item; None draws from torch's global generator


@dataclass(frozen=True)
class BatchOutput:
    """Per-item audio (float32, exact length) and predicted frames per token."""

    audio: list[Tensor]
    durations: list[Tensor]


def make_batch(
    token_lists: Sequence[Sequence[int]],
    styles: Sequence[Tensor],
    speeds: Sequence[float],
    generators: Sequence[torch.Generator | None],
    device: torch.device | str,
) -> Batch:
    """Pad token lists (adding the boundary token 0 at both ends) and stack per-item inputs."""
    lengths = [len(tokens) + 2 for tokens in token_lists]
    input_ids = torch.zeros((len(token_lists), max(lengths)), dtype=torch.long)
    for row, tokens in enumerate(token_lists):
        input_ids[row, 1 : len(tokens) + 1] = torch.tensor(tokens, dtype=torch.long)
    return Batch(
        input_ids=input_ids.to(device),
        lengths=torch.tensor(lengths, dtype=torch.long, device=device),
        styles=torch.stack(list(styles)).to(device=device, dtype=torch.float32),
        speeds=torch.tensor(speeds, dtype=torch.float32, device=device),
        generators=list(generators),
    )


@torch.inference_mode()
def forward_batch(
    model: Any,
    batch: Batch,
    *,
    vocoder_batch: int | None = None,
    decoder_dtype: torch.dtype | None = None,
    kernels: Kernels | None = None,
    on_audio: Callable[[int, Tensor, Tensor], None] | None = None,
) -> BatchOutput:
    """Synthesize every item of `batch` with a kokoro `KModel`; equal to one forward per item.

    The text side (PL-BERT, encoders, durations, F0) runs as one batch. The decoder and vocoder, whose
    activations are 600 samples per frame wide, run in groups of at most `vocoder_batch` items (all at
    once when None): on a CPU, one item at a time keeps them in cache and is faster. Groups of one follow
    the batch's order; larger groups gather similar lengths. `on_audio(index, audio, durations)` is called
    for each item as soon as its group is done. The decoder runs `kernels` (`PreparedKernels` from
    api/engine/kernels.py, in their own dtype; kokoro's own modules when None), under autocast to
    `decoder_dtype` (e.g. torch.bfloat16) when given and the kernels have no dtype of their own. Either way
    the text side, the source and the inverse STFT stay fp32."""
    pad = _padding(batch.lengths, batch.input_ids.shape[1])
    d_en = encoded_text(model, batch.input_ids, pad)
    prosody_style = batch.styles[:, 128:]
    d = model.predictor.text_encoder(d_en, prosody_style, batch.lengths, pad)
    durations = _durations(model.predictor, d, batch, pad)
    frames = durations.sum(dim=1)
    alignment = _alignment(durations, int(frames.max()))
    en = d.transpose(-1, -2) @ alignment
    f0, noise = _f0_and_noise(model.predictor, en, prosody_style, frames)
    asr = model.text_encoder(batch.input_ids, batch.lengths, pad) @ alignment
    item_durations = [durations[row, :length] for row, length in enumerate(batch.lengths.tolist())]
    audio: dict[int, Tensor] = {}
    counts = frames.tolist()  # one device sync for all the shapes below
    autocast = decoder_dtype is not None and not isinstance(kernels, PreparedKernels)
    decoder_kernels: Kernels = kernels or LIBRARY_KERNELS
    for group in _groups(counts, vocoder_batch or len(batch.generators)):
        rows = torch.tensor(group, device=frames.device)
        width = max(counts[row] for row in group)
        with torch.autocast(frames.device.type, dtype=decoder_dtype, enabled=autocast):
            decoded = _decode(
                model.decoder,
                asr[rows, :, :width],
                f0[rows, : 2 * width],
                noise[rows, : 2 * width],
                batch.styles[rows, :128],
                frames[rows],
                [batch.generators[row] for row in group],
                decoder_kernels,
            )
        per_frame = decoded.shape[-1] // width
        for i, row in enumerate(group):
            audio[row] = decoded[i, : counts[row] * per_frame]
            if on_audio is not None:
                on_audio(row, audio[row], item_durations[row])
    return BatchOutput(audio=[audio[row] for row in range(len(audio))], durations=item_durations)


class Kernels(Protocol):
    """How the decoder runs a convolution and its two kinds of residual blocks (lengths None: every item
    fills the tensor)."""

    def conv(self, module: nn.Module, x: Tensor) -> Tensor: ...

    def res_block(self, block: Any, x: Tensor, style: Tensor, lengths: Tensor | None) -> Tensor: ...

    def res_block1(self, block: Any, x: Tensor, style: Tensor, lengths: Tensor | None) -> Tensor: ...


class _LibraryKernels:
    """kokoro's own modules, with this module's masks for ragged batches (any device, any batch)."""

    def conv(self, module: nn.Module, x: Tensor) -> Tensor:
        return module(x)  # type: ignore[no-any-return]

    def res_block(self, block: Any, x: Tensor, style: Tensor, lengths: Tensor | None) -> Tensor:
        return _adain_res_block(block, x, style, lengths)

    def res_block1(self, block: Any, x: Tensor, style: Tensor, lengths: Tensor | None) -> Tensor:
        return _adain_res_block1(block, x, style, lengths)


LIBRARY_KERNELS = _LibraryKernels()


def _groups(frames: Sequence[int], size: int) -> list[list[int]]:
    """Item indices in groups of at most `size`: in order for groups of one, else longest first (similar
    lengths pad least)."""
    order = list(range(len(frames)))
    if size > 1:
        order.sort(key=lambda row: -frames[row])
    return [order[start : start + size] for start in range(0, len(order), size)]


# --- masks and small helpers -------------------------------------------------------------------------


def _padding(lengths: Tensor, size: int) -> Tensor:
    """(B, size) bool, True past each item's length (kokoro's `text_mask` convention)."""
    return torch.arange(size, device=lengths.device)[None, :] >= lengths[:, None]


def _ragged(lengths: Tensor) -> Tensor | None:
    """The lengths when items differ; None when every item fills the padded size (nothing to mask)."""
    return lengths if int(lengths.min()) != int(lengths.max()) else None


def _masked(x: Tensor, lengths: Tensor | None) -> Tensor:
    """x (B, C, T) with every step past each item's length set to zero."""
    if lengths is None:
        return x
    return x.masked_fill(_padding(lengths, x.shape[-1])[:, None, :], 0.0)


def _scaled(lengths: Tensor | None, factor: int) -> Tensor | None:
    return None if lengths is None else lengths * factor


def _packed_lstm(lstm: nn.LSTM, x: Tensor, lengths: Tensor) -> Tensor:
    """A batch-first LSTM over (B, T, C) that stops at each item's length; zeros after it."""
    packed = nn.utils.rnn.pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
    lstm.flatten_parameters()
    out, _ = lstm(packed)
    padded, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=x.shape[1])
    return padded


def masked_lstm(lstm: nn.LSTM, x: Tensor, lengths: Tensor) -> Tensor:
    """`_packed_lstm` in fixed shapes: each direction runs over the whole padded (B, T, C), the backward
    one over each item reversed within its length, so padding comes after every item's steps in both
    directions and never reaches them; zeros past each length. Needs `prepare_masked_lstms` first."""
    forward, backward = lstm.directions  # type: ignore[misc]
    reverse = _reversal(lengths, x.shape[1])
    ahead, _ = forward(x)
    behind, _ = backward(x.gather(1, reverse.expand(-1, -1, x.shape[2])))
    behind = behind.gather(1, reverse.expand(-1, -1, behind.shape[2]))
    out = torch.cat([ahead, behind], dim=-1)
    return out.masked_fill(_padding(lengths, x.shape[1])[..., None], 0.0)


def _reversal(lengths: Tensor, size: int) -> Tensor:
    """(B, size, 1) indices that reverse each item's first `length` steps and leave the rest in place."""
    step = torch.arange(size, device=lengths.device)[None, :]
    flipped = lengths[:, None] - 1 - step
    return torch.where(flipped >= 0, flipped, step)[..., None]


def prepare_masked_lstms(model: nn.Module) -> None:
    """Give every bidirectional LSTM of `model` its two directions as one-way LSTMs of their own (the
    same weights, copied once: a few MB), for `masked_lstm`."""
    for module in model.modules():
        if isinstance(module, nn.LSTM) and module.bidirectional and not hasattr(module, "directions"):
            module.directions = tuple(_direction(module, suffix) for suffix in ("", "_reverse"))


def _direction(lstm: nn.LSTM, suffix: str) -> nn.LSTM:
    if lstm.num_layers != 1 or not lstm.batch_first:
        raise ValueError("only single-layer batch-first LSTMs are split")
    weight = next(lstm.parameters())
    one = nn.LSTM(lstm.input_size, lstm.hidden_size, 1, bias=lstm.bias, batch_first=True)
    one = one.to(device=weight.device, dtype=weight.dtype).eval()
    with torch.no_grad():
        for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
            if hasattr(one, f"{name}_l0"):
                getattr(one, f"{name}_l0").copy_(getattr(lstm, f"{name}_l0{suffix}"))
    one.flatten_parameters()
    return one


# --- durations and alignment --------------------------------------------------------------------------


def _durations(predictor: Any, d: Tensor, batch: Batch, pad: Tensor) -> Tensor:
    """Frames per token (B, T), computed as the library does, zero for padding tokens."""
    return frames_per_token(predictor, _packed_lstm(predictor.lstm, d, batch.lengths), batch.speeds, pad)


def frames_per_token(predictor: Any, x: Tensor, speeds: Tensor, pad: Tensor) -> Tensor:
    """The duration head over the predictor LSTM's output `x` (B, T, C): rounded frames, at least one a
    token, zero for padding tokens."""
    duration = torch.sigmoid(predictor.duration_proj(x)).sum(dim=-1) / speeds[:, None]
    return torch.round(duration).clamp(min=1).long().masked_fill(pad, 0)


def encoded_text(model: Any, input_ids: Tensor, pad: Tensor) -> Tensor:
    """PL-BERT over the tokens (padding masked out of its attention), projected: (B, C, T)."""
    bert = model.bert(input_ids, attention_mask=(~pad).int())
    return model.bert_encoder(bert).transpose(-1, -2)  # type: ignore[no-any-return]


def text_encoder(encoder: Any, input_ids: Tensor, lengths: Tensor, pad: Tensor) -> Tensor:
    """kokoro's TextEncoder.forward in fixed shapes (`masked_lstm`): (B, C, T), zeros past each length."""
    m = pad[:, None, :]
    x = encoder.embedding(input_ids).transpose(1, 2).masked_fill(m, 0.0)
    for block in encoder.cnn:
        x = block(x).masked_fill(m, 0.0)
    return masked_lstm(encoder.lstm, x.transpose(1, 2), lengths).transpose(1, 2)


def duration_encoder(encoder: Any, x: Tensor, style: Tensor, lengths: Tensor, pad: Tensor) -> Tensor:
    """kokoro's DurationEncoder.forward in fixed shapes: x (B, C, T) and the prosody style (B, S) give
    (B, T, C + S), zeros past each length."""
    s = style[:, :, None].expand(-1, -1, x.shape[-1])
    m = pad[:, None, :]
    x = torch.cat([x, s], dim=1).masked_fill(m, 0.0)
    for block in encoder.lstms:
        if isinstance(block, nn.LSTM):
            x = masked_lstm(block, x.transpose(1, 2), lengths).transpose(1, 2)
        else:  # AdaLayerNorm over channels, then the style again
            x = block(x.transpose(1, 2), style).transpose(1, 2)
            x = torch.cat([x, s], dim=1).masked_fill(m, 0.0)
    return x.transpose(1, 2)


def _alignment(durations: Tensor, frames: int) -> Tensor:
    """(B, T, frames) one-hot: frame f belongs to token t while start[t] <= f < end[t]."""
    ends = durations.cumsum(dim=1)
    starts = ends - durations
    frame = torch.arange(frames, device=durations.device)[None, None, :]
    return ((frame >= starts[..., None]) & (frame < ends[..., None])).float()


# --- prosody: F0 and noise curves -----------------------------------------------------------------------


def _f0_and_noise(
    predictor: Any, en: Tensor, style: Tensor, frames: Tensor, *, fixed_shapes: bool = False
) -> tuple[Tensor, Tensor]:
    """The library's F0Ntrain with a packed shared LSTM and masked blocks; curves are (B, 2 * frames).
    `fixed_shapes`: no host sync and no shape that depends on the data (masked LSTM, masks always), so
    it can run inside a CUDA graph (api/engine/graphs.py)."""
    lstm = masked_lstm if fixed_shapes else _packed_lstm
    shared = lstm(predictor.shared, en.transpose(-1, -2), frames).transpose(-1, -2)
    ragged = frames if fixed_shapes else _ragged(frames)
    curves = []
    for blocks, projection in ((predictor.F0, predictor.F0_proj), (predictor.N, predictor.N_proj)):
        x, lengths = shared, ragged
        for block in blocks:
            x, lengths = _adain_res_block(block, x, style, lengths), _block_lengths(block, lengths)
        curves.append(_masked(projection(x), lengths).squeeze(1))
    return curves[0], curves[1]


# --- normalization and residual blocks -------------------------------------------------------------------
# `lengths` None means that every item fills the tensor: the library's own modules then apply unchanged.


def _adain(layer: Any, x: Tensor, style: Tensor, lengths: Tensor | None) -> Tensor:
    """AdaIN1d with InstanceNorm statistics over each item's valid steps only (the prepared kernels' masked
    AdaIN, in x's dtype; kokoro's InstanceNorm is always affine)."""
    if lengths is None:
        return layer(x, style)  # type: ignore[no-any-return]
    norm = layer.norm
    valid = valid_steps(x.shape[-1], lengths).to(x.dtype)
    return adain(x, valid, layer.fc(style), norm.weight, norm.bias, norm.eps)


def _block_lengths(block: Any, lengths: Tensor | None) -> Tensor | None:
    """The lengths of an AdainResBlk1d's output: twice its input's where it upsamples."""
    return _scaled(lengths, 2 if block.upsample_type != "none" else 1)


def _adain_res_block(block: Any, x: Tensor, style: Tensor, lengths: Tensor | None) -> Tensor:
    """StyleTTS2's AdainResBlk1d (dropout is off in eval); its output is `_block_lengths` long."""
    out_lengths = _block_lengths(block, lengths)
    if lengths is None:
        return block(x, style)  # type: ignore[no-any-return]
    residual = block.actv(_adain(block.norm1, x, style, lengths))
    residual = block.pool(_masked(residual, lengths))
    residual = block.conv1(_masked(residual, out_lengths))
    residual = block.actv(_adain(block.norm2, residual, style, out_lengths))
    residual = block.conv2(_masked(residual, out_lengths))
    total: Tensor = (residual + block._shortcut(x)) * RSQRT2
    return total


def _snake(x: Tensor, alpha: Tensor) -> Tensor:
    return x + (1 / alpha) * (torch.sin(alpha * x) ** 2)


def _adain_res_block1(block: Any, x: Tensor, style: Tensor, lengths: Tensor | None) -> Tensor:
    """The generator's AdaINResBlock1 (Snake activations, dilated convolutions), masked."""
    if lengths is None:
        return block(x, style)  # type: ignore[no-any-return]
    layers = zip(
        block.convs1, block.convs2, block.adain1, block.adain2, block.alpha1, block.alpha2, strict=True
    )
    for conv1, conv2, norm1, norm2, alpha1, alpha2 in layers:
        xt = _snake(_adain(norm1, x, style, lengths), alpha1)
        xt = conv1(_masked(xt, lengths))
        xt = _snake(_adain(norm2, xt, style, lengths), alpha2)
        xt = conv2(_masked(xt, lengths))
        x = xt + x
    return x


# --- decoder and generator ----------------------------------------------------------------------------


def _decode(
    decoder: Any,
    asr: Tensor,
    f0: Tensor,
    noise: Tensor,
    style: Tensor,
    frames: Tensor,
    generators: Sequence[torch.Generator | None],
    kernels: Kernels,
) -> Tensor:
    """kokoro's Decoder.forward with masks; returns padded audio (B, samples)."""
    ragged = _ragged(frames)
    harmonics = _source_spectra(decoder.generator, f0, (frames * 2).tolist(), generators)
    x = decode_body(decoder, asr, f0, noise, style, ragged, kernels)
    return generate(decoder.generator, x, style, harmonics, frames * 2, ragged is not None, kernels)


def decode_body(
    decoder: Any,
    asr: Tensor,
    f0: Tensor,
    noise: Tensor,
    style: Tensor,
    ragged: Tensor | None,
    kernels: Kernels,
) -> Tensor:
    """The decoder up to its generator: (B, C, 2 * frames); `ragged` the frames when items differ."""
    curve_lengths = _scaled(ragged, 2)
    f0_down = kernels.conv(decoder.F0_conv, _masked(f0[:, None], curve_lengths))
    noise_down = kernels.conv(decoder.N_conv, _masked(noise[:, None], curve_lengths))
    x = kernels.res_block(decoder.encode, torch.cat([asr, f0_down, noise_down], dim=1), style, ragged)
    lengths = _block_lengths(decoder.encode, ragged)
    asr_res = kernels.conv(decoder.asr_res, asr)
    residual = True
    for block in decoder.decode:
        if residual:
            x = torch.cat([x, asr_res, f0_down, noise_down], dim=1)
        x, lengths = kernels.res_block(block, x, style, lengths), _block_lengths(block, lengths)
        if block.upsample_type != "none":
            residual = False
    return x


def generate(
    generator: Any,
    x: Tensor,
    style: Tensor,
    harmonics: Tensor,
    lengths: Tensor,
    ragged: bool,
    kernels: Kernels,
    window: Tensor | None = None,
) -> Tensor:
    """iSTFTNet's Generator.forward with masks, per-item sources (`harmonics`, from `_source_spectra`) and
    a per-item inverse STFT (`window`: the STFT's window on the device, else moved there on each call).

    `lengths` are the items' F0 curve lengths (the width of `x`); masks are applied only when `ragged`."""
    samples = lengths * int(generator.f0_upsamp.scale_factor)
    spectrum = samples // int(generator.stft.hop_length) + 1 if ragged else None
    masks = lengths if ragged else None
    for i in range(generator.num_upsamples):
        x = F.leaky_relu(x, negative_slope=0.1)
        x_source = kernels.conv(generator.noise_convs[i], harmonics)
        source_lengths = None if spectrum is None else _conv_lengths(generator.noise_convs[i], spectrum)
        x_source = kernels.res_block1(generator.noise_res[i], x_source, style, source_lengths)
        x = kernels.conv(generator.ups[i], _masked(x, masks))
        lengths = lengths * generator.ups[i].stride[0]
        if i == generator.num_upsamples - 1:
            x = generator.reflection_pad(x)
            lengths = lengths + 1
        masks = lengths if ragged else None
        x = x_source.add_(x)  # in place on fresh tensors: one activation-sized buffer less at the peak
        xs: Tensor | None = None
        for j in range(generator.num_kernels):
            out = kernels.res_block1(generator.resblocks[i * generator.num_kernels + j], x, style, masks)
            xs = out if xs is None else xs.add_(out)
        assert xs is not None
        x = xs.div_(generator.num_kernels)
    x = kernels.conv(generator.conv_post, _masked(F.leaky_relu(x), masks)).float()  # exp, sin in fp32
    bins = generator.post_n_fft // 2 + 1
    magnitude = _masked(torch.exp(x[:, :bins, :]), masks)
    return _istft(generator.stft, magnitude, torch.sin(x[:, bins:, :]), lengths, window)


def _conv_lengths(conv: nn.Conv1d, lengths: Tensor) -> Tensor:
    padding = conv.padding[0]
    assert isinstance(padding, int)
    span = conv.dilation[0] * (conv.kernel_size[0] - 1) + 1
    return (lengths + 2 * padding - span) // conv.stride[0] + 1


# --- the harmonic source: per item, in the library's own shapes ----------------------------------------
# The source's phase input is torch.angle of an STFT: discontinuous wherever a bin lies on the negative
# real axis, which the DC and Nyquist bins of a real signal always do (imaginary part exactly +-0, so
# +-pi by the sign of a zero). Which sign an FFT kernel writes, and the last bit of a vectorized sin or a
# matrix product, can depend on an element's place in the call; on an AVX-512 CPU a padded batch gave a
# 2*pi jump where the item alone did not. Computed per item with the library's shapes and calls, every
# kernel sees what it sees in the library, so the spectrum is bit for bit the library's on any CPU.


def _source_spectra(
    generator: Any, f0: Tensor, curve_lengths: Sequence[int], rngs: Sequence[torch.Generator | None]
) -> Tensor:
    """Magnitude and phase of each item's harmonic source, (B, 2 * bins, frames), zero past each item."""
    spectra = []
    for row, (count, rng) in enumerate(zip(curve_lengths, rngs, strict=True)):
        f0_samples = generator.f0_upsamp(f0[row : row + 1, None, :count]).transpose(1, 2)
        excitation = _harmonic_source(generator.m_source, f0_samples, rng)
        magnitude, phase = generator.stft.transform(excitation)
        spectra.append(torch.cat([magnitude, phase], dim=1)[0])
    padded = f0.new_zeros(len(spectra), spectra[0].shape[0], max(s.shape[-1] for s in spectra))
    for row, spectrum in enumerate(spectra):
        padded[row, :, : spectrum.shape[-1]] = spectrum
    return padded


def _harmonic_source(source: Any, f0: Tensor, rng: torch.Generator | None) -> Tensor:
    """SourceModuleHnNSF + SineGen for one item's (1, N, 1) F0 samples; (1, N) harmonic excitation.

    The library's operations in its order, with its random draws taken from `rng` (the global generator
    when None): initial phases (1, H), then noise shaped like the (1, N, H) sines, laid out as (1, H, N)."""
    sine = source.l_sin_gen
    harmonics = torch.arange(1, sine.harmonic_num + 2, device=f0.device, dtype=f0.dtype)
    scale = sine.upsample_scale
    rad = (f0 * harmonics / sine.sampling_rate) % 1
    initial = torch.rand(1, rad.shape[2], device=f0.device, generator=rng)
    initial[:, 0] = 0
    rad[:, 0, :] = rad[:, 0, :] + initial
    rad = F.interpolate(rad.transpose(1, 2), scale_factor=1 / scale, mode="linear").transpose(1, 2)
    phase = torch.cumsum(rad, dim=1) * 2 * torch.pi
    phase = F.interpolate(phase.transpose(1, 2) * scale, scale_factor=scale, mode="linear").transpose(1, 2)
    sines = torch.sin(phase) * sine.sine_amp
    uv = (f0 > sine.voiced_threshold).to(f0.dtype)
    noise_amp = uv * sine.noise_std + (1 - uv) * sine.sine_amp / 3
    noise = noise_amp * torch.empty_like(sines).normal_(generator=rng)
    merged: Tensor = source.l_tanh(source.l_linear(sines * uv + noise))
    return merged.transpose(1, 2).squeeze(1)


def _istft(stft: Any, magnitude: Tensor, phase: Tensor, frames: Tensor, window: Tensor | None) -> Tensor:
    """torch.istft per item: overlap-add of all frames, divided by each item's own window envelope."""
    n_fft, hop = int(stft.filter_length), int(stft.hop_length)
    window = stft.window.to(magnitude.device) if window is None else window
    spectrum = magnitude.float() * torch.exp(phase.float() * 1j)
    pieces = torch.fft.irfft(spectrum, n=n_fft, dim=1) * window[None, :, None]
    count = pieces.shape[-1]
    total = n_fft + hop * (count - 1)
    fold = {"output_size": (1, total), "kernel_size": (1, n_fft), "stride": (1, hop)}
    signal = F.fold(pieces, **fold).reshape(pieces.shape[0], total)
    valid = (~_padding(frames, count)).float()
    envelope = F.fold(window.square()[None, :, None] * valid[:, None, :], **fold).reshape(-1, total)
    signal = signal / torch.where(envelope > 1e-11, envelope, torch.ones_like(envelope))
    return signal[:, n_fft // 2 : total - n_fft // 2]
