"""CUDA graphs over bucketed shapes: a GPU call's thousands of kernels launched by replaying graphs
captured at start, instead of by Python one at a time.

On a GPU a call of the batched forward (api/engine/batched.py) is bound by Python launching its kernels:
about 55 ms a call on an H100 whatever the batch (docs/journal/gpu.md, entries 27 and 38). A CUDA graph
replays a captured sequence of kernels in one launch, but only over the shapes and memory it was captured
with, and with no host sync inside. So a call is cut where it must read a value on the host, and each
part's shapes are padded to one of a few buckets:

- **text** (batch x padded tokens): PL-BERT, the duration encoder and predictor, the text encoder. Its
  LSTMs run in fixed shapes (`masked_lstm`), not packed. Out: frames per token, the encoders' outputs.
- the host reads each item's frame count (the one sync of a call, as in the eager forward) and picks the
  frames bucket; the alignment and its two products run eagerly, written into the next graphs' inputs;
- **prosody** (batch x frames): the F0 and noise curves;
- each item's harmonic source runs eagerly, per item from its own generator, as in the eager forward;
- **vocoder** (batch x frames): the decoder, the generator and the inverse STFT, masks always on.

Padding rows repeat the first item and padding steps are masked, so each item's audio is what it is
unbucketed (tests/integration/test_graphs.py, within the batched forward's tolerance). Every graph of a
lane shares one memory pool and reads and writes its inputs and outputs in that lane's `Arena`, outside the
pool; a lane replays one graph at a time, so graphs replay in any order without touching each other's data.
Every bucket is captured during the warm-up, before /ready; a shape with no bucket (frames beyond the
largest, a batch beyond `max_batch_size`) runs the eager forward. Off with KOKORO_CUDA_GRAPHS=false.

Without a GPU, `TracedBackend` stands in for the capture: it traces each segment with fake tensors into a
fixed graph of operations (any host read or data-dependent shape fails the trace, as it would fail a CUDA
capture) and replays that graph over the arena.
"""

from __future__ import annotations

import itertools
import logging
import math
import queue
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import Tensor

from api.engine.batched import (
    LIBRARY_KERNELS,
    Batch,
    BatchOutput,
    Kernels,
    _alignment,
    _f0_and_noise,
    _padding,
    _source_spectra,
    decode_body,
    duration_encoder,
    encoded_text,
    frames_per_token,
    generate,
    masked_lstm,
    prepare_masked_lstms,
    text_encoder,
)
from api.engine.kernels import PreparedKernels
from api.weights.layout import MAX_PHONEMES

logger = logging.getLogger(__name__)

# Bucket edges about sqrt(2) apart: a shape pads by at most 1.5x per axis (batch, tokens, frames), about
# 1.2x on average. Tokens include the two boundary tokens (MAX_PHONEMES + 2 at most).
BATCH_SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)
TOKEN_SIZES = (16, 24, 32, 48, 64, 96, 128, 192, 256, 384, MAX_PHONEMES + 2)
FRAME_SIZES = (32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192)
# Batch x frames of the largest vocoder bucket: what a lane's memory pool must hold at once. A frame is
# 600 samples (25 ms); the scheduler bounds batch x tokens / speed by max_batch_tokens (8,192 on a GPU) and
# speech takes about 3 frames a token at speed 1 (the suite's texts, real weights), so 32,768 holds every
# batch that speech forms; a batch of more frames runs the eager forward.
MAX_BATCH_FRAMES = 32_768
SAMPLES_PER_FRAME = 600  # 2 F0 steps a frame, 300 samples a step


@dataclass(frozen=True)
class Buckets:
    """The shapes graphs are captured for: batch sizes, padded tokens, frames (batch x frames bounded)."""

    batch_sizes: tuple[int, ...] = BATCH_SIZES
    token_sizes: tuple[int, ...] = TOKEN_SIZES
    frame_sizes: tuple[int, ...] = FRAME_SIZES
    max_batch_frames: int = MAX_BATCH_FRAMES

    def __post_init__(self) -> None:
        for name in ("batch_sizes", "token_sizes", "frame_sizes"):
            sizes = getattr(self, name)
            if not sizes or list(sizes) != sorted(set(sizes)) or sizes[0] < 1:
                raise ValueError(f"{name} must be increasing positive sizes, got {sizes}")

    @classmethod
    def up_to(cls, max_batch_size: int, max_batch_frames: int = MAX_BATCH_FRAMES) -> Buckets:
        """The default edges for batches of at most `max_batch_size` (which is always an edge)."""
        sizes = tuple(sorted({size for size in BATCH_SIZES if size < max_batch_size} | {max_batch_size}))
        return cls(batch_sizes=sizes, max_batch_frames=max_batch_frames)

    def batch(self, size: int) -> int | None:
        return _ceiling(self.batch_sizes, size)

    def tokens(self, size: int) -> int | None:
        return _ceiling(self.token_sizes, size)

    def frames(self, batch: int, frames: int) -> int | None:
        """The frames bucket of a batch whose longest item has `frames`, None past the batch's bound."""
        bucket = _ceiling(self.frame_sizes, frames)
        return bucket if bucket is not None and batch * bucket <= self.max_batch_frames else None

    def text_shapes(self) -> list[tuple[int, int]]:
        return list(itertools.product(self.batch_sizes, self.token_sizes))

    def frame_shapes(self) -> list[tuple[int, int]]:
        return [
            (batch, frames)
            for batch in self.batch_sizes
            for frames in self.frame_sizes
            if batch * frames <= self.max_batch_frames
        ]


def _ceiling(edges: Sequence[int], size: int) -> int | None:
    return next((edge for edge in edges if edge >= size), None)


# --- where a lane's graphs read and write ----------------------------------------------------------------


class Arena:
    """A lane's graph inputs and outputs: per name one flat buffer, as large as its largest bucket needs;
    each graph reads and writes views of its first elements, so captured pointers stay valid and every
    graph of the lane shares the same few buffers."""

    def __init__(self, sizes: dict[str, tuple[int, torch.dtype]], device: torch.device) -> None:
        self._buffers = {
            name: torch.zeros(numel, dtype=dtype, device=device) for name, (numel, dtype) in sizes.items()
        }

    def view(self, name: str, *shape: int) -> Tensor:
        return self._buffers[name][: math.prod(shape)].view(shape)

    @property
    def bytes(self) -> int:
        return sum(buffer.numel() * buffer.element_size() for buffer in self._buffers.values())


# --- capture backends -------------------------------------------------------------------------------------

Replay = Callable[[], None]


class Backend(Protocol):
    """Captures a segment, a function of the arena's views that writes its outputs into them, once; the
    replay it returns runs that same work over whatever the views then hold. `warm`: run it once before
    (False where another lane has already run this shape)."""

    def capture(
        self, function: Callable[..., None], args: Sequence[Tensor], *, warm: bool = True
    ) -> Replay: ...


class CudaBackend:
    """CUDA graphs, every one of a lane in that lane's memory pool. A warm capture runs the function once
    on a side stream first (lazy initialization, compiled kernels for the shape): once a shape, not once a
    lane, since each costs a launch's time of the start."""

    def __init__(self) -> None:
        self.pool = torch.cuda.graph_pool_handle()

    def capture(self, function: Callable[..., None], args: Sequence[Tensor], *, warm: bool = True) -> Replay:
        if warm:
            side = torch.cuda.Stream()  # type: ignore[no-untyped-call]
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                function(*args)
            torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # A host sync inside fails the capture ("operation not permitted when stream is capturing").
        with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
            function(*args)
        return graph.replay


class TracedBackend:
    """Without a GPU: the segment traced with fake tensors into a fixed graph of operations (a host read or
    a data-dependent shape fails, as in a CUDA capture), replayed over the arena's views."""

    def capture(self, function: Callable[..., None], args: Sequence[Tensor], *, warm: bool = True) -> Replay:
        from torch.fx.experimental.proxy_tensor import make_fx

        traced = make_fx(function, tracing_mode="fake", _allow_non_fake_inputs=True)(*args)
        return lambda: traced(*args)


class EagerBackend:
    """No capture: each replay runs the function again (the bucketed path's arithmetic alone)."""

    def capture(self, function: Callable[..., None], args: Sequence[Tensor], *, warm: bool = True) -> Replay:
        return lambda: function(*args)


# --- the three segments -----------------------------------------------------------------------------------


@dataclass
class _Model:
    """What the segments need from a KModel and its kernels, and the widths of what they pass on."""

    model: Any
    kernels: Kernels
    window: Tensor
    autocast: torch.dtype | None

    @property
    def hidden(self) -> int:
        """Channels of the duration encoder's output: its model width and the prosody style."""
        encoder = self.model.predictor.text_encoder
        return int(encoder.d_model + encoder.sty_dim)

    @property
    def channels(self) -> int:
        """Channels of the text encoder's output (a bidirectional LSTM's two halves)."""
        return int(self.model.text_encoder.lstm.hidden_size * 2)

    @property
    def spectrum(self) -> int:
        """Rows of a harmonic source spectrum: magnitude and phase bins of the generator's STFT."""
        return int(self.model.decoder.generator.post_n_fft + 2)

    def harmonic_width(self, frames: int) -> int:
        """Source spectrum frames for `frames` decoder frames (the STFT's hop over 600 samples a frame)."""
        return frames * SAMPLES_PER_FRAME // int(self.model.decoder.generator.stft.hop_length) + 1


def _text(
    m: _Model,
    input_ids: Tensor,
    lengths: Tensor,
    styles: Tensor,
    speeds: Tensor,
    durations: Tensor,
    d: Tensor,
    t_en: Tensor,
    frames: Tensor,
) -> None:
    model = m.model
    pad = _padding(lengths, input_ids.shape[1])
    d_en = encoded_text(model, input_ids, pad)
    encoded = duration_encoder(model.predictor.text_encoder, d_en, styles[:, 128:], lengths, pad)
    x = masked_lstm(model.predictor.lstm, encoded, lengths)
    per_token = frames_per_token(model.predictor, x, speeds, pad)
    durations.copy_(per_token)
    d.copy_(encoded)
    t_en.copy_(text_encoder(model.text_encoder, input_ids, lengths, pad))
    frames.copy_(per_token.sum(dim=1))


def _prosody(m: _Model, en: Tensor, styles: Tensor, frames: Tensor, f0: Tensor, noise: Tensor) -> None:
    curves = _f0_and_noise(m.model.predictor, en, styles[:, 128:], frames, fixed_shapes=True)
    f0.copy_(curves[0])
    noise.copy_(curves[1])


def _vocoder(
    m: _Model,
    asr: Tensor,
    f0: Tensor,
    noise: Tensor,
    harmonics: Tensor,
    styles: Tensor,
    frames: Tensor,
    audio: Tensor,
) -> None:
    decoder = m.model.decoder
    style = styles[:, :128]
    with torch.autocast(
        asr.device.type, dtype=m.autocast, enabled=m.autocast is not None, cache_enabled=False
    ):
        x = decode_body(decoder, asr, f0, noise, style, frames, m.kernels)
        out = generate(decoder.generator, x, style, harmonics, frames * 2, True, m.kernels, m.window)
    audio.copy_(out)


# --- one lane's graphs ------------------------------------------------------------------------------------


@dataclass
class CaptureReport:
    """What the capture made: graphs, seconds, the arenas' bytes."""

    graphs: int = 0
    seconds: float = 0.0
    arena_bytes: int = 0


@dataclass
class _Lane:
    arena: Arena
    replays: dict[tuple[str, int, int], Replay] = field(default_factory=dict)


class BucketedForward:
    """The batched forward over bucketed shapes, replaying graphs a `Backend` captured: one set of graphs
    and one arena per lane, so `lanes` calls run side by side (each takes a free lane for its call)."""

    def __init__(
        self,
        model: Any,
        buckets: Buckets,
        backend: Callable[[], Backend],
        *,
        lanes: int = 1,
        kernels: Kernels | None = None,
        decoder_dtype: torch.dtype | None = None,
    ) -> None:
        if lanes < 1:
            raise ValueError(f"lanes must be at least 1, got {lanes}")
        prepare_masked_lstms(model)
        device = model.device
        autocast = decoder_dtype if not isinstance(kernels, PreparedKernels) else None
        window = model.decoder.generator.stft.window.to(device)
        self._model = _Model(model, kernels or LIBRARY_KERNELS, window, autocast)
        self.buckets = buckets
        self._backend = backend
        self._lanes = [_Lane(Arena(self._arena_sizes(), device)) for _ in range(lanes)]
        self._free: queue.SimpleQueue[_Lane] = queue.SimpleQueue()
        for lane in self._lanes:
            self._free.put(lane)
        self.fallbacks = 0  # calls that had no bucket and ran the eager forward
        self.report = CaptureReport()  # the last capture's

    def _arena_sizes(self) -> dict[str, tuple[int, torch.dtype]]:
        m = self._model
        batch = max(self.buckets.batch_sizes)
        tokens = max(self.buckets.token_sizes)
        frames = max(b * f for b, f in self.buckets.frame_shapes())
        hidden, channels, spectrum = m.hidden, m.channels, m.spectrum
        long, flt = torch.long, torch.float32
        return {
            "input_ids": (batch * tokens, long),
            "lengths": (batch, long),
            "styles": (batch * 256, flt),
            "speeds": (batch, flt),
            "durations": (batch * tokens, long),
            "d": (batch * tokens * hidden, flt),
            "t_en": (batch * tokens * channels, flt),
            "frames": (batch, long),
            "en": (frames * hidden, flt),
            "asr": (frames * channels, flt),
            "f0": (frames * 2, flt),
            "noise": (frames * 2, flt),
            "harmonics": (spectrum * m.harmonic_width(frames) + spectrum * batch, flt),
            "audio": (frames * SAMPLES_PER_FRAME + batch * SAMPLES_PER_FRAME, flt),
        }

    @property
    def arena_bytes(self) -> int:
        """Every lane's arena together."""
        return sum(lane.arena.bytes for lane in self._lanes)

    # --- capture

    @torch.inference_mode()
    def capture(self, shapes: Sequence[tuple[str, int, int]] | None = None) -> CaptureReport:
        """Capture every bucket (or `shapes`: (segment, batch, tokens or frames)) for every lane."""
        report = CaptureReport(arena_bytes=self.arena_bytes)
        wanted = list(shapes) if shapes is not None else self.all_shapes()
        started = time.perf_counter()
        for lane in self._lanes:
            backend = self._backend()
            for shape in wanted:
                segment, batch, size = shape
                function, args = self._segment(lane.arena, segment, batch, size)
                lane.replays[shape] = backend.capture(function, args, warm=lane is self._lanes[0])
                report.graphs += 1
        report.seconds = time.perf_counter() - started
        self.report = report
        return report

    def all_shapes(self) -> list[tuple[str, int, int]]:
        text = [("text", b, t) for b, t in self.buckets.text_shapes()]
        frames = [
            (segment, b, f) for b, f in self.buckets.frame_shapes() for segment in ("prosody", "vocoder")
        ]
        return text + frames

    def _segment(
        self, arena: Arena, segment: str, batch: int, size: int
    ) -> tuple[Callable[..., None], list[Tensor]]:
        m = self._model
        if segment == "text":
            args = self._text_views(arena, batch, size)
            _fill_text_inputs(args, size)
            return (lambda *a: _text(m, *a)), args
        views = self._frame_views(arena, batch, size)
        views["frames"].fill_(size)  # a full-width stand-in while capturing
        if segment == "prosody":
            prosody = ("en", "styles", "frames", "f0", "noise")
            return (lambda *a: _prosody(m, *a)), [views[name] for name in prosody]
        vocoder = ("asr", "f0", "noise", "harmonics", "styles", "frames", "audio")
        return (lambda *a: _vocoder(m, *a)), [views[name] for name in vocoder]

    def _text_views(self, arena: Arena, batch: int, tokens: int) -> list[Tensor]:
        m = self._model
        return [
            arena.view("input_ids", batch, tokens),
            arena.view("lengths", batch),
            arena.view("styles", batch, 256),
            arena.view("speeds", batch),
            arena.view("durations", batch, tokens),
            arena.view("d", batch, tokens, m.hidden),
            arena.view("t_en", batch, m.channels, tokens),
            arena.view("frames", batch),
        ]

    def _frame_views(self, arena: Arena, batch: int, frames: int) -> dict[str, Tensor]:
        m = self._model
        return {
            "en": arena.view("en", batch, m.hidden, frames),
            "asr": arena.view("asr", batch, m.channels, frames),
            "styles": arena.view("styles", batch, 256),
            "frames": arena.view("frames", batch),
            "f0": arena.view("f0", batch, 2 * frames),
            "noise": arena.view("noise", batch, 2 * frames),
            "harmonics": arena.view("harmonics", batch, m.spectrum, m.harmonic_width(frames)),
            "audio": arena.view("audio", batch, frames * SAMPLES_PER_FRAME),
        }

    # --- a call

    def forward(self, batch: Batch) -> BatchOutput | None:
        """Every item's audio and durations, as `forward_batch` gives them; None when the batch's shape has
        no bucket (the caller runs the eager forward)."""
        size, tokens = len(batch.generators), batch.input_ids.shape[1]
        batch_bucket, token_bucket = self.buckets.batch(size), self.buckets.tokens(tokens)
        if batch_bucket is None or token_bucket is None:
            self.fallbacks += 1
            return None
        lane = self._free.get()
        try:
            return self._run(lane, batch, batch_bucket, token_bucket)
        finally:
            self._free.put(lane)

    @torch.inference_mode()
    def _run(self, lane: _Lane, batch: Batch, batch_bucket: int, token_bucket: int) -> BatchOutput | None:
        size = len(batch.generators)
        views = self._text_views(lane.arena, batch_bucket, token_bucket)
        _pad_rows(views[0], batch.input_ids, pad_value=0)
        _pad_rows(views[1], batch.lengths)
        _pad_rows(views[2], batch.styles)
        _pad_rows(views[3], batch.speeds)
        lane.replays[("text", batch_bucket, token_bucket)]()
        durations, d, t_en, frames = views[4], views[5], views[6], views[7]
        counts = frames[:size].tolist()  # the call's one host sync
        frame_bucket = self.buckets.frames(batch_bucket, max(counts))
        if frame_bucket is None:
            self.fallbacks += 1
            return None
        fv = self._frame_views(lane.arena, batch_bucket, frame_bucket)
        alignment = _alignment(durations, frame_bucket)
        torch.matmul(d.transpose(-1, -2), alignment, out=fv["en"])
        torch.matmul(t_en, alignment, out=fv["asr"])
        lane.replays[("prosody", batch_bucket, frame_bucket)]()
        harmonics = fv["harmonics"]
        harmonics.zero_()
        generator = self._model.model.decoder.generator
        sources = _source_spectra(
            generator, fv["f0"][:size], [2 * count for count in counts], batch.generators
        )
        harmonics[:size, :, : sources.shape[-1]] = sources
        lane.replays[("vocoder", batch_bucket, frame_bucket)]()
        # Copied out of the arena before the lane is free again.
        audio, durations = fv["audio"][:size].clone(), durations[:size].clone()
        return BatchOutput(
            audio=[audio[row, : counts[row] * SAMPLES_PER_FRAME] for row in range(size)],
            durations=[durations[row, :length] for row, length in enumerate(batch.lengths.tolist())],
        )


# Audio through the graphs against the eager forward's, signal to difference: float noise alone gives 41-62 dB
# on real weights (tests/integration/test_batched.py), two noise seeds 17-23 dB.
MIN_CHECK_SNR_DB = 30.0


class GraphMismatch(RuntimeError):
    """The graphs' audio is not the eager forward's."""


def check_graphs(graphs: BucketedForward, expected: BatchOutput, batch: Batch) -> None:
    """Raise GraphMismatch unless `graphs` give `batch` the durations and audio of `expected` (the eager
    forward's output for the same batch, same seeds); a batch with no bucket is not checked."""
    output = graphs.forward(batch)
    if output is None:
        return
    for index, (audio, want) in enumerate(zip(output.audio, expected.audio, strict=True)):
        if not torch.equal(output.durations[index].cpu(), expected.durations[index].cpu()):
            raise GraphMismatch(f"item {index}: durations differ from the eager forward's")
        if audio.shape != want.shape:
            raise GraphMismatch(f"item {index}: {audio.shape[0]} samples against {want.shape[0]}")
        difference = float((audio.float() - want.float()).square().sum())
        signal = float(want.float().square().sum())
        if difference > 0 and 10 * math.log10(max(signal, 1e-20) / difference) < MIN_CHECK_SNR_DB:
            raise GraphMismatch(f"item {index}: audio differs from the eager forward's")


def _fill_text_inputs(views: list[Tensor], tokens: int) -> None:
    """Plausible inputs while capturing: every item full length, speed 1."""
    views[0].fill_(1)
    views[1].fill_(tokens)
    views[2].zero_()
    views[3].fill_(1.0)


def _pad_rows(view: Tensor, values: Tensor, pad_value: int | None = None) -> None:
    """Copy `values` into the top-left of `view`; rows past them repeat the first row, columns past them get
    `pad_value` (None: the view's shape equals the values' past the first axis)."""
    rows = values.shape[0]
    if pad_value is not None:
        view.fill_(pad_value)
        view[:rows, : values.shape[1]] = values
        view[rows:] = view[0]
        return
    view[:rows] = values
    view[rows:] = values[0]
