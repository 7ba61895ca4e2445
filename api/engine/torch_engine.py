"""The PyTorch engine: one kokoro KModel, loaded from a weights directory and checked key by key."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import tempfile
import threading
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from api.engine.allocator import tcmalloc_loaded
from api.engine.base import (
    SAMPLE_RATE,
    BatchPolicy,
    ChunkAudio,
    EngineError,
    KernelStatus,
    ReadyCallback,
    SynthesisItem,
    checked_audio,
    warmup_item,
    warn_if_oversubscribed,
)
from api.engine.batched import Batch, BatchOutput, forward_batch, make_batch
from api.engine.choice import (
    NOT_X86,
    Precision,
    choose_cpu_lanes,
    cpu_flags,
    cpu_kind,
    int8_dot,
    isa_summary,
    native_bf16,
)
from api.engine.compiled import KernelStores, allow_recompiles, compile_cache_summary
from api.engine.graphs import Backend, BucketedForward, Buckets, CudaBackend, check_graphs
from api.engine.kernels import PreparedKernels, fold_weight_norms, release_library_convolutions
from api.engine.memory import CallMemory, release_free_memory
from api.weights.hub import REPO_ID
from api.weights.kmodel import COMPONENTS, KEY_PREFIX, kmodel_skeleton, optional_keys
from api.weights.layout import MAX_PHONEMES

logger = logging.getLogger(__name__)


# Batching per device (docs/batching.md). On a CPU the vocoder runs one item at a time (its activations fall
# out of cache when batched), and with the CPU kernels batching the text side no longer pays: at 4 clients
# (AMX Xeon, 60 requests each) batches of 4 gave 7.24 audio-s/s, first audio p50/p95 1.40/3.24 s and a
# 1.98 GiB peak, batches of 2 7.13, 1.29/2.28 s, 1.81 GiB, one chunk a call 6.69, 0.89/1.82 s, 1.80 GiB
# (docs/journal/cpu-torch-engine.md, entry 9): one chunk a call waits behind no other chunk's vocoder.
CPU_BATCH_POLICY = BatchPolicy(max_batch_size=1, batch_timeout=0.0, max_batch_tokens=2048, length_ratio=1.5)
CPU_VOCODER_BATCH = 1
# Measured on an H100 (docs/journal/gpu.md, entry 12): batches of 32 long chunks gave 734 audio-s/s in
# 0.55 s, 64 gave 822 in 0.98 s; 32 keeps a batch's wait for first audio near half a second. Out-of-memory
# splits the batch.
GPU_BATCH_POLICY = BatchPolicy(
    max_batch_size=32, batch_timeout=0.005, max_batch_tokens=8192, length_ratio=2.0
)
# Calls at once on a GPU, each on its own CUDA stream: while one call's Python launches kernels or waits on
# a host sync (lengths for the packed LSTMs, the frame counts), the other's kernels keep the GPU busy. The
# bare engine on an H100 gave 1.28-1.39x the audio with two (batches of 8-32, the same audio bit for bit),
# so the shared engine's one process runs two; a worker's own engine runs one: four workers with two each
# delivered no more through the server (550 against 557 audio-s/s at 128 clients), later first audio
# (p95 3.3 against 1.5 s) and 81 GiB against 63 (docs/journal/gpu.md, entry 27).
GPU_LANES = 1
SHARED_GPU_LANES = 2
# With several lanes, one call's time on the GPU overlaps the next call's launch, which Python does on one
# thread at a time: a batch whose padded size the GPU runs in less time than a launch takes leaves it idle
# meanwhile, so up to this size a batch takes chunks beyond its length ratio, padding that costs nothing.
# 1500 padded tokens take about one launch's time on an H100 (55 ms at 36 us a token, docs/journal/gpu.md,
# entry 27). Against the simulated GPU at 128 clients, 0 left it 84% busy in the steady state and 1500 99.5%,
# with 14% more audio (entry 38).
GPU_LAUNCH_TOKENS = 1500
DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "bf16": torch.bfloat16}


def gpu_batch_policy(lanes: int) -> BatchPolicy:
    """A torch engine's batching on a GPU with `lanes`: with several, batches top up to a launch's worth."""
    return dataclasses.replace(GPU_BATCH_POLICY, launch_tokens=GPU_LAUNCH_TOKENS if lanes > 1 else 0)


def select_device(preference: str) -> str:
    if preference != "auto":
        return preference
    if torch.cuda.is_available():
        return "cuda"
    if torch.backends.mps.is_available():
        return "mps"
    return "cpu"


def cuda_has_native_bf16() -> bool:
    """Whether the current CUDA device computes bf16 in hardware (Ampere and later), not by emulation."""
    return torch.cuda.is_available() and torch.cuda.is_bf16_supported(including_emulation=False)


class CheckpointError(ValueError):
    """The checkpoint does not fit KModel (KModel itself would silently load nothing)."""


# Keys that KModel has but its forward never reads: PL-BERT's pooler. Checkpoints without it load in
# kokoro and Kokoro-FastAPI, so they load here too (the pooler keeps its initial values, unused).
UNUSED_KEY_PREFIXES = {"bert": ("pooler.",)}


def unused_key(component: str, key: str) -> bool:
    return key.startswith(UNUSED_KEY_PREFIXES.get(component, ()))


def check_checkpoint(checkpoint: Mapping[str, Any], model: torch.nn.Module) -> None:
    """Raise CheckpointError unless every component's keys and shapes match `model`'s."""
    unknown = set(checkpoint) - set(COMPONENTS)
    if unknown:
        raise CheckpointError(f"unknown components in checkpoint: {sorted(unknown)}")
    for component in COMPONENTS:
        if component not in checkpoint:
            raise CheckpointError(f"checkpoint lacks component '{component}'")
        _check_component(component, checkpoint[component], getattr(model, component))


def _check_component(component: str, state: Mapping[str, torch.Tensor], module: torch.nn.Module) -> None:
    expected = module.state_dict()
    found = {key.removeprefix(KEY_PREFIX): tensor for key, tensor in state.items()}
    missing = {
        key for key in set(expected) - set(found) - optional_keys(module) if not unused_key(component, key)
    }
    unexpected = set(found) - set(expected)
    if missing or unexpected:
        raise CheckpointError(
            f"{component}: {len(missing)} missing keys (e.g. {sorted(missing)[:3]}), "
            f"{len(unexpected)} unexpected keys (e.g. {sorted(unexpected)[:3]})"
        )
    wrong = [key for key, tensor in found.items() if tensor.shape != expected[key].shape]
    if wrong:
        shapes = ", ".join(
            f"{key} {tuple(found[key].shape)} (expected {tuple(expected[key].shape)})" for key in wrong[:3]
        )
        raise CheckpointError(f"{component}: {len(wrong)} tensors of the wrong shape: {shapes}")


def new_kmodel(config: Mapping[str, Any]) -> Any:
    """KModel with its initial weights: kokoro reads a checkpoint file in its constructor, here an empty
    one, so no checkpoint is read twice and nothing comes from the hub."""
    from kokoro import KModel

    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore", (FutureWarning, UserWarning))
        empty = Path(tmp) / "empty.pth"
        torch.save({}, empty)
        return KModel(repo_id=REPO_ID, config=dict(config), model=str(empty))


def load_kmodel(config: Mapping[str, Any], checkpoint_path: Path) -> Any:
    """KModel with the checkpoint's weights, checked key by key before (KModel loads wrong keys silently)
    and after. The checkpoint is memory-mapped and copied into the model once: kokoro's own loading holds
    the initial weights and two copies of the checkpoint at once (about 1 GiB for 0.33 GB of weights)."""
    checkpoint = torch.load(checkpoint_path, map_location="cpu", weights_only=True, mmap=True)
    check_checkpoint(checkpoint, kmodel_skeleton(config))
    model = new_kmodel(config)
    for component in COMPONENTS:
        state = {key.removeprefix(KEY_PREFIX): tensor for key, tensor in checkpoint[component].items()}
        getattr(model, component).load_state_dict(state, strict=False)  # the optional keys are checked
    check_loaded(checkpoint, model)
    return model


def check_loaded(checkpoint: Mapping[str, Any], model: torch.nn.Module) -> None:
    """Raise CheckpointError unless the model's tensors now equal the checkpoint's."""
    for component in COMPONENTS:
        params = getattr(model, component).state_dict()
        for key, tensor in checkpoint[component].items():
            if not torch.equal(params[key.removeprefix(KEY_PREFIX)].cpu(), tensor):
                raise CheckpointError(f"{component}.{key} was not loaded into the model")


class TorchEngine:
    """The kokoro KModel on one device: loads config + checkpoint explicitly, synthesizes token chunks."""

    name = "torch"
    sample_rate = SAMPLE_RATE
    gives_durations = True

    def __init__(
        self,
        weights_dir: Path,
        *,
        device: str = "auto",
        threads: int | None = None,
        precision: Precision = "fp32",
        compile: bool = True,
        seed: int | None = 0,
        warmup: bool = True,
        lanes: int | None = None,
        gpu_lanes: int = GPU_LANES,
        compile_cache_root: Path | None = None,
        ahead_of_time: bool | None = None,
        cuda_graphs: bool = True,
        graph_backend: Callable[[], Backend] | None = None,
        graph_buckets: Buckets | None = None,
        kernel_stores: KernelStores | None = None,
    ) -> None:
        self.weights_dir = weights_dir
        self.device_preference = device
        self.threads = threads
        self.precision = precision
        self.compile = compile
        self.seed = seed
        self.warmup = warmup
        self.requested_lanes = lanes
        self.gpu_lanes = gpu_lanes  # on a GPU, unless `lanes` says otherwise
        self.compile_cache_root = compile_cache_root  # None: KOKORO_COMPILE_CACHE_DIR or its default
        self.ahead_of_time = ahead_of_time  # None: on a CPU only (PreparedKernels)
        self.cuda_graphs = cuda_graphs  # on a GPU, or wherever `graph_backend` is given
        self.graph_backend = graph_backend  # None: CUDA graphs on a GPU, none elsewhere
        self.graph_buckets = graph_buckets  # None: Buckets.up_to the GPU's batch size
        self.kernel_stores = kernel_stores  # kept by the app across reloads; None: this engine's own
        self._graphs: BucketedForward | None = None
        self._lanes = 1
        self._all_threads = 1
        self._lane_threads = 1
        self._model: Any = None
        self._vocab: dict[str, int] = {}
        self._on_gpu = False
        self._kernels: PreparedKernels | None = None
        self._call_memory = CallMemory(reuses=tcmalloc_loaded())
        self._streams = threading.local()  # each lane thread's CUDA stream

    @property
    def vocab(self) -> Mapping[str, int]:
        return self._vocab

    @property
    def batch_defaults(self) -> BatchPolicy:
        return gpu_batch_policy(self._lanes) if self._on_gpu else CPU_BATCH_POLICY

    @property
    def lanes(self) -> int:
        return self._lanes

    @property
    def graphs(self) -> BucketedForward | None:
        """The captured graphs calls replay, None when calls launch their kernels from Python."""
        return self._graphs

    def kernel_status(self) -> KernelStatus | None:
        """Where the compiled kernels stand; None where there are none (not loaded, or kokoro's own path)."""
        return None if self._kernels is None else self._kernels.status()

    @property
    def pooled_threads(self) -> bool:
        return not self._on_gpu  # on a GPU each lane has a CUDA stream of its own

    def claim_threads(self, every_thread: bool) -> None:
        if self._on_gpu:
            if getattr(self._streams, "stream", None) is None:
                self._streams.stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]
            torch.cuda.set_stream(self._streams.stream)
        threads = self._all_threads if every_thread else self._lane_threads
        if torch.get_num_threads() != threads:  # per calling thread (OpenMP's own setting)
            torch.set_num_threads(threads)
        if self.compile:
            allow_recompiles()  # also per calling thread

    def load(self) -> None:
        if self.threads:
            torch.set_num_threads(self.threads)
        warn_if_oversubscribed(self.name, torch.get_num_threads())
        config = json.loads((self.weights_dir / "config.json").read_text(encoding="utf-8"))
        device = select_device(self.device_preference)
        self._model = load_kmodel(config, self.weights_dir / "kokoro-v1_0.pth").to(device).eval()
        self._on_gpu = device.startswith("cuda")
        self._vocab = dict(config["vocab"])
        flags, isa_cap = cpu_flags(), os.environ.get("ONEDNN_MAX_CPU_ISA")
        self._settle_lanes(device, flags, isa_cap)
        if device == "cpu" and cpu_kind(flags) != "x86":
            logger.info("prepared kernels not used: CPU (%s): %s", isa_summary(flags), NOT_X86)
        elif device == "cpu" or self._on_gpu:
            self._kernels = PreparedKernels(
                self._model.decoder,
                self._kernel_dtype(flags, isa_cap),
                compile=self.compile,
                int8=self.precision == "int8",
                int8_dot=bool(int8_dot(flags, isa_cap)),
                cache_root=self.compile_cache_root,
                ahead_of_time=self.ahead_of_time,
                stores=self.kernel_stores,
            )
            release_library_convolutions(self._model.decoder)
        fold_weight_norms(self._model)
        release_free_memory()
        kernels = ""
        if self._kernels is not None:
            kernels = ", prepared kernels" + (" (compiled)" if self.compile else " (eager)")
            if self._kernels.int8:
                kernels += f", the rest {str(self._kernels.dtype).removeprefix('torch.')}"
        logger.info(
            "KModel loaded from %s on %s (decoder %s%s)", self.weights_dir, device, self.precision, kernels
        )
        if self.warmup:
            for items in self._warmup_batches():
                self.synthesize(items)
            if self._lanes > 1:  # the kernels compiled for a lane's thread count are other kernels
                self.claim_threads(every_thread=False)
                self.synthesize(self._warmup_batches()[0])
                self.claim_threads(every_thread=True)
        if self._kernels is not None and self.compile:
            logger.info("%s", compile_cache_summary(self._kernels.ahead_of_time))
        if self.cuda_graphs and self.warmup and (self._on_gpu or self.graph_backend is not None):
            self._graphs = self._capture_graphs()

    def _capture_graphs(self) -> BucketedForward | None:
        """Every bucket's CUDA graphs, for every lane, then the warm-up batches through them against the
        eager forward: any failure or difference leaves graphs off (logged), never the engine."""
        graphs = BucketedForward(
            self._model,
            self.graph_buckets or Buckets.up_to(GPU_BATCH_POLICY.max_batch_size),
            self.graph_backend or CudaBackend,
            lanes=self._lanes,
            kernels=self._kernels,
            decoder_dtype=self._decoder_dtype(),
        )
        try:
            report = graphs.capture()
            for items in self._warmup_batches():
                check_graphs(graphs, self._forward(items, None, None, graphs=None), self._batch(items))
        except Exception:
            logger.exception("CUDA graphs: capture or its check failed; calls launch kernels from Python")
            del graphs
            if self._on_gpu:
                torch.cuda.empty_cache()
            return None
        logger.info(
            "CUDA graphs: %d captured in %.1f s (%d lanes), arenas %.2f GiB, GPU memory reserved %.2f GiB",
            report.graphs,
            report.seconds,
            self._lanes,
            report.arena_bytes / 2**30,
            torch.cuda.memory_reserved() / 2**30 if self._on_gpu else 0.0,
        )
        return graphs

    def _settle_lanes(self, device: str, flags: frozenset[str], isa_cap: str | None) -> None:
        """Calls side by side on a CPU: the requested number (default: `choose_cpu_lanes` for the CPU's
        `flags` and oneDNN's `isa_cap`), at most one per thread."""
        self._all_threads = torch.get_num_threads()
        if device != "cpu":
            self._lanes, self._lane_threads = 1, self._all_threads
            if self._on_gpu:
                self._lanes = self.requested_lanes or self.gpu_lanes
                logger.info("up to %d calls at once, each on its own CUDA stream", self._lanes)
            return
        if self.requested_lanes is None:
            choice = choose_cpu_lanes(flags, isa_cap)
            wanted, why = choice.lanes, f" ({choice.reason})"
        else:
            wanted, why = self.requested_lanes, f" (KOKORO_TORCH_LANES={self.requested_lanes})"
        self._lanes = max(1, min(wanted, self._all_threads))
        self._lane_threads = max(1, self._all_threads // self._lanes)
        if self._lanes == 1:
            logger.info("one call at a time on %d thread(s)%s", self._all_threads, why)
            return
        logger.info(
            "up to %d calls at once on %d thread(s) each; a call with nothing beside it gets %d%s",
            self._lanes,
            self._lane_threads,
            self._all_threads,
            why,
        )

    def _kernel_dtype(self, flags: frozenset[str], isa_cap: str | None) -> torch.dtype:
        """The prepared kernels' float dtype: int8 keeps the rest of the decoder in bf16 where the CPU's
        bf16 is native, in fp32 elsewhere."""
        if self.precision != "int8":
            return DTYPES[self.precision]
        if self._on_gpu:
            raise EngineError("KOKORO_TORCH_PRECISION=int8 runs on a CPU only (oneDNN's int8 convolutions)")
        native = native_bf16(flags, isa_cap)
        return torch.bfloat16 if native else torch.float32

    def _warmup_batches(self) -> list[list[SynthesisItem]]:
        """One chunk; on a GPU also batches of equal and of different lengths, short and long: the kinds of
        input the compiled kernels are built for (one item or several, masked or not, short or long),
        built at start rather than under load."""
        item = warmup_item(self._vocab)
        if not self._on_gpu:
            return [[item]]
        short = dataclasses.replace(item, tokens=item.tokens[: len(item.tokens) // 2])
        long = dataclasses.replace(item, tokens=(item.tokens * MAX_PHONEMES)[: MAX_PHONEMES // 2])
        return [[item], [item, item], [item, short], [long], [long, long], [long, item]]

    def synthesize(
        self, items: Sequence[SynthesisItem], on_ready: ReadyCallback | None = None
    ) -> list[ChunkAudio]:
        """Audio and durations for each item from one batched forward pass; vocoder noise is seeded per
        item, so an item's audio does not depend on its batch. On a CPU the vocoder runs item by item, in
        order, and `on_ready` hears of each item as soon as it is done."""
        if self._model is None:
            raise EngineError("the engine is not loaded")
        if self._on_gpu or self._graphs is not None:
            return self._synthesize_on_gpu(items, on_ready)
        results: dict[int, ChunkAudio] = {}

        def ready(index: int, audio: torch.Tensor, durations: torch.Tensor) -> None:
            samples = checked_audio(audio.float().cpu().numpy())
            results[index] = ChunkAudio(samples, durations.cpu().numpy())
            if on_ready is not None:
                on_ready(index, results[index])

        self._call_memory.started()
        try:
            self._forward(items, CPU_VOCODER_BATCH, ready)
        finally:
            self._call_memory.ended()
        return [results[index] for index in range(len(items))]

    def _synthesize_on_gpu(
        self, items: Sequence[SynthesisItem], on_ready: ReadyCallback | None
    ) -> list[ChunkAudio]:
        """The whole batch in one vocoder group, its audio and durations copied back in one transfer each
        (one host sync for the batch, not one per chunk), on the calling lane's CUDA stream."""
        output = self._forward(items, None, None, graphs=self._graphs)
        audio = torch.cat([samples.float() for samples in output.audio]).cpu().numpy()
        durations = torch.cat(output.durations).cpu().numpy()
        audio_ends = np.cumsum([len(samples) for samples in output.audio])
        duration_ends = np.cumsum([len(frames) for frames in output.durations])
        results = []
        for index in range(len(items)):
            audio_start = audio_ends[index - 1] if index else 0
            duration_start = duration_ends[index - 1] if index else 0
            chunk = ChunkAudio(
                checked_audio(audio[audio_start : audio_ends[index]]),
                durations[duration_start : duration_ends[index]],
            )
            results.append(chunk)
            if on_ready is not None:
                on_ready(index, chunk)
        return results

    def _forward(
        self,
        items: Sequence[SynthesisItem],
        vocoder_batch: int | None,
        on_audio: Callable[[int, torch.Tensor, torch.Tensor], None] | None,
        *,
        graphs: BucketedForward | None = None,
    ) -> BatchOutput:
        try:
            batch = self._batch(items)
            output = graphs.forward(batch) if graphs is not None else None
            if output is not None:
                return output
            return forward_batch(
                self._model,
                batch,  # a batch the graphs had no bucket for: its generators have not drawn yet
                vocoder_batch=vocoder_batch,
                decoder_dtype=self._decoder_dtype(),
                kernels=self._kernels,
                on_audio=on_audio,
            )
        except torch.cuda.OutOfMemoryError as exc:
            torch.cuda.empty_cache()
            raise EngineError(f"out of GPU memory for a batch of {len(items)} chunks") from exc

    def _decoder_dtype(self) -> torch.dtype | None:
        return torch.bfloat16 if self.precision == "bf16" else None

    def _batch(self, items: Sequence[SynthesisItem]) -> Batch:
        device = self._model.device
        generators = [self._generator(device) for _ in items]
        styles = [torch.from_numpy(item.style) for item in items]
        return make_batch(
            [item.tokens for item in items], styles, [item.speed for item in items], generators, device
        )

    def _generator(self, device: torch.device) -> torch.Generator | None:
        if self.seed is None:
            return None
        return torch.Generator(device=device).manual_seed(self.seed)
