"""The bucketed forward (api/engine/graphs.py) against the library's single-item forward, through graphs
captured by fake-tensor tracing on a CPU and by CUDA on a GPU (`--device cuda`); the fixed-shape LSTM against
the packed one; a host read inside a segment fails the capture; the engine's capture, check and fallback."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from api.engine.base import SynthesisItem, warmup_item
from api.engine.batched import (
    _packed_lstm,
    forward_batch,
    make_batch,
    masked_lstm,
    prepare_masked_lstms,
)
from api.engine.graphs import (
    Backend,
    BucketedForward,
    Buckets,
    CudaBackend,
    EagerBackend,
    TracedBackend,
)
from api.engine.kernels import PreparedKernels
from api.engine.torch_engine import TorchEngine
from tests.integration.test_batched import (
    MIXED,
    TOLERANCE,
    library_forward,
    load_model,
    random_items,
    seeded,
)

pytestmark = pytest.mark.numerics

# Small buckets that the tests' batches fall into, so that only a few graphs are captured.
TEST_BUCKETS = Buckets(batch_sizes=(1, 2, 6), token_sizes=(16, 48), frame_sizes=(64, 96, 128, 192))


@pytest.fixture(scope="module")
def random_model(random_weights: Path, device: str) -> Any:
    return load_model(random_weights).to(device)


def backend_for(device: str) -> Callable[[], Backend]:
    return CudaBackend if device.startswith("cuda") else TracedBackend


def bucketed(
    model: Any, items: Sequence[tuple[list[int], torch.Tensor, float]], graphs: BucketedForward
) -> Any:
    tokens, styles, speeds = zip(*items, strict=True)
    batch = make_batch(tokens, styles, speeds, [seeded(model) for _ in items], model.device)
    return graphs.forward(batch)


def needed_shapes(
    model: Any, items: Sequence[tuple[list[int], torch.Tensor, float]], buckets: Buckets
) -> list:
    """The three graphs a batch of `items` replays, from the library's own frame counts."""
    size = buckets.batch(len(items))
    tokens = buckets.tokens(max(len(item[0]) for item in items) + 2)
    frames = max(int(library_forward(model, *item)[1].sum()) for item in items)
    frame_bucket = buckets.frames(size, frames)
    assert size is not None, "the test's batch must fit the test buckets"
    assert tokens is not None
    assert frame_bucket is not None
    return [("text", size, tokens), ("prosody", size, frame_bucket), ("vocoder", size, frame_bucket)]


def assert_equals_library(
    model: Any, items: Sequence[tuple[list[int], torch.Tensor, float]], output: Any
) -> None:
    assert output is not None, "the batch found no bucket"
    for index, item in enumerate(items):
        expected_audio, expected_durations = library_forward(model, *item)
        assert torch.equal(output.durations[index], expected_durations), f"item {index}: durations differ"
        assert output.audio[index].shape == expected_audio.shape, f"item {index}: length differs"
        difference = float((output.audio[index] - expected_audio).abs().max())
        assert difference < TOLERANCE, f"item {index} differs by {difference}"


@pytest.mark.parametrize("kernels", ["library", "prepared"])
def test_graphs_over_padded_buckets_equal_the_library_item_by_item(
    random_model: Any, device: str, kernels: str
) -> None:
    """Five items of mixed lengths, voices and speeds pad to a bucket of 6 rows, 48 tokens and the frames
    bucket above the longest; replayed from captured graphs, every item is the library's audio."""
    items = random_items([*MIXED[0], 7], [*MIXED[1], 1.1])
    prepared = (
        PreparedKernels(random_model.decoder, torch.float32, compile=False) if kernels == "prepared" else None
    )
    graphs = BucketedForward(random_model, TEST_BUCKETS, backend_for(device), kernels=prepared)
    report = graphs.capture(needed_shapes(random_model, items, TEST_BUCKETS))
    assert report.graphs == 3
    assert_equals_library(random_model, items, bucketed(random_model, items, graphs))


def test_a_replay_runs_over_the_buffers_contents_not_the_captured_ones(
    random_model: Any, device: str
) -> None:
    """Two batches through the same three graphs, one after the other: the second gets its own audio."""
    first = random_items([40, 12], [1.0, 1.0])
    second = random_items([9, 33], [0.9, 1.2])
    second = [(tokens, -style, speed) for tokens, style, speed in second]  # other voices than `first`
    shapes = needed_shapes(random_model, first, TEST_BUCKETS)
    assert shapes == needed_shapes(random_model, second, TEST_BUCKETS), "both batches must share buckets"
    graphs = BucketedForward(random_model, TEST_BUCKETS, backend_for(device))
    graphs.capture(shapes)
    assert_equals_library(random_model, first, bucketed(random_model, first, graphs))
    assert_equals_library(random_model, second, bucketed(random_model, second, graphs))


def test_two_lanes_replay_their_own_graphs_side_by_side(random_model: Any, device: str) -> None:
    """Two calls at once, each on a lane of its own (its graphs, its arena): each gets its own audio."""
    first = random_items([40, 12], [1.0, 1.0])
    second = [(tokens, -style, speed) for tokens, style, speed in random_items([9, 33], [0.9, 1.2])]
    graphs = BucketedForward(random_model, TEST_BUCKETS, backend_for(device), lanes=2)
    graphs.capture(needed_shapes(random_model, first, TEST_BUCKETS))
    with ThreadPoolExecutor(2) as pool:
        outputs = list(pool.map(lambda items: bucketed(random_model, items, graphs), [first, second] * 2))
    for items, output in zip([first, second] * 2, outputs, strict=True):
        assert_equals_library(random_model, items, output)


def test_a_shape_without_a_bucket_is_left_to_the_eager_forward(random_model: Any) -> None:
    buckets = Buckets(batch_sizes=(1,), token_sizes=(16,), frame_sizes=(32,))
    graphs = BucketedForward(random_model, buckets, EagerBackend)
    graphs.capture([("text", 1, 16)])
    assert bucketed(random_model, random_items([3, 4], [1.0, 1.0]), graphs) is None  # two rows
    assert bucketed(random_model, random_items([30], [1.0]), graphs) is None  # 32 tokens
    assert bucketed(random_model, random_items([12], [0.25]), graphs) is None  # over 32 frames
    assert graphs.fallbacks == 3


def test_the_packed_forward_cannot_be_captured(random_model: Any) -> None:
    """The eager forward reads lengths and frame counts on the host: the trace that stands in for a CUDA
    capture refuses it, so the segments' passing trace means something."""
    tokens, styles, speeds = zip(*random_items([5, 9], [1.0, 1.0]), strict=True)

    def eager(input_ids: torch.Tensor, lengths: torch.Tensor) -> None:
        batch = make_batch(tokens, styles, speeds, [None, None], "cpu")
        forward_batch(random_model.cpu(), dataclasses.replace(batch, input_ids=input_ids, lengths=lengths))

    with pytest.raises(Exception, match=r"(?i)data.dependent|FakeTensor"):
        TracedBackend().capture(eager, [torch.ones(2, 11, dtype=torch.long), torch.tensor([7, 11])])


@pytest.mark.parametrize("lengths", [[5, 17, 1, 17], [17, 17, 17, 17], [2, 9, 16, 3]])
def test_the_fixed_shape_lstm_equals_the_packed_lstm(lengths: list[int]) -> None:
    torch.manual_seed(3)
    lstm = nn.LSTM(12, 8, 1, batch_first=True, bidirectional=True).eval()
    prepare_masked_lstms(lstm)
    x = torch.randn(4, 17, 12)
    length_tensor = torch.tensor(lengths)
    with torch.inference_mode():
        packed = _packed_lstm(lstm, x, length_tensor)
        fixed = masked_lstm(lstm, x, length_tensor)
    assert float((packed - fixed).abs().max()) < 1e-6


# --- the engine: captured at load, checked, used; off when the capture fails --------------------------------


# Buckets that the engine's warm-up chunk fits: one row, its tokens and frames.
ENGINE_BUCKETS = Buckets(batch_sizes=(1,), token_sizes=(16,), frame_sizes=(32,))


def synthesize(engine: TorchEngine, items: list[SynthesisItem]) -> list[np.ndarray]:
    return [chunk.samples for chunk in engine.synthesize(items)]


def cpu_engine(weights: Path, **options: Any) -> TorchEngine:
    """The torch engine on the CPU in fp32 with eager kernels (quick to load), not loaded yet."""
    return TorchEngine(weights, device="cpu", compile=False, precision="fp32", **options)


@pytest.fixture(scope="module")
def plain(random_weights: Path) -> TorchEngine:
    """The same engine without graphs, loaded: the audio the graphs' must equal."""
    engine = cpu_engine(random_weights, cuda_graphs=False)
    engine.load()
    assert engine.graphs is None
    return engine


def test_the_engine_captures_checks_and_replays_its_graphs(random_weights: Path, plain: TorchEngine) -> None:
    engine = cpu_engine(random_weights, graph_backend=TracedBackend, graph_buckets=ENGINE_BUCKETS)
    engine.load()
    graphs = engine.graphs
    assert graphs is not None, "the warm-up's graphs were not kept"
    item = warmup_item(engine.vocab)
    (with_graphs,) = synthesize(engine, [item])
    (without,) = synthesize(plain, [item])
    assert graphs.fallbacks == 0
    assert with_graphs.shape == without.shape
    assert float(np.abs(with_graphs - without).max()) < TOLERANCE


def test_a_batch_through_the_engines_graphs_gives_each_chunk_its_own_audio(
    random_weights: Path, plain: TorchEngine
) -> None:
    """Three chunks of other lengths, voices and speeds in one call through the engine's bucketed path
    (padded to 4 rows), each against the plain engine's audio for it alone; a fourth, over the frames
    bucket, through the eager fallback."""
    buckets = Buckets(batch_sizes=(1, 4), token_sizes=(16, 48), frame_sizes=(32, 64, 128))
    engine = cpu_engine(random_weights, graph_backend=EagerBackend, graph_buckets=buckets)
    engine.load()
    graphs = engine.graphs
    assert graphs is not None
    rng = np.random.default_rng(5)
    items = [
        SynthesisItem(
            tokens=tuple(rng.integers(1, 178, size)),
            style=rng.normal(0, 0.3, 256).astype(np.float32),
            speed=speed,
        )
        for size, speed in ((30, 1.0), (7, 1.4), (19, 0.9))
    ]
    batched = synthesize(engine, items)
    assert graphs.fallbacks == 0
    for item, audio in zip(items, batched, strict=True):
        (alone,) = synthesize(plain, [item])
        assert audio.shape == alone.shape
        assert float(np.abs(audio - alone).max()) < TOLERANCE
    slow = dataclasses.replace(items[0], speed=0.25)  # 30 tokens, over 128 frames: found after the text graph
    (fallback,) = synthesize(engine, [slow])
    (alone,) = synthesize(plain, [slow])
    assert graphs.fallbacks == 1
    assert float(np.abs(fallback - alone).max()) < TOLERANCE


class FailingBackend:
    def capture(
        self, function: Callable[..., None], args: Sequence[torch.Tensor], *, warm: bool = True
    ) -> Callable[[], None]:
        raise RuntimeError("operation not permitted when stream is capturing")


class WrongBackend:
    """Replays something else: the arena's audio scaled, as a graph over stale pointers would give."""

    def capture(
        self, function: Callable[..., None], args: Sequence[torch.Tensor], *, warm: bool = True
    ) -> Callable[[], None]:
        def replay() -> None:
            function(*args)
            if args[-1].is_floating_point():
                args[-1].mul_(0.5)

        return replay


@pytest.mark.parametrize("backend", [FailingBackend, WrongBackend])
def test_a_failed_or_wrong_capture_leaves_graphs_off_not_the_engine(
    random_weights: Path, backend: Callable[[], Backend], caplog: pytest.LogCaptureFixture
) -> None:
    engine = cpu_engine(random_weights, graph_backend=backend, graph_buckets=ENGINE_BUCKETS)
    with caplog.at_level(logging.ERROR):
        engine.load()
    assert engine.graphs is None
    assert "CUDA graphs: capture or its check failed" in caplog.text
    (audio,) = synthesize(engine, [warmup_item(engine.vocab)])
    assert np.isfinite(audio).all()
    assert np.abs(audio).max() > 0
