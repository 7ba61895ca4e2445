"""The PyTorch engine over the real kokoro KModel: checkpoint checks and equality with the library."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch._dynamo import config as dynamo_config

from api.engine.base import SynthesisItem
from api.engine.choice import avx2, choose_cpu_lanes, cpu_flags, int8_dot
from api.engine.compiled import RECOMPILE_LIMIT
from api.engine.torch_engine import (
    GPU_BATCH_POLICY,
    GPU_LANES,
    GPU_LAUNCH_TOKENS,
    REPO_ID,
    SHARED_GPU_LANES,
    CheckpointError,
    TorchEngine,
)

# The tests marked numerics compare audio with the library's or with itself, and run again at a lower CPU
# dispatch level (scripts/test.sh, docs/testing.md). The others check loading, lanes' threads and the
# random checkpoint's durations, which do not depend on which kernels compute them.

ROOT = Path(__file__).resolve().parents[2]
PHONEMES = "ðə kwˈɪk bɹˈWn fˈɑks ʤˈʌmps ˌOvəɹ ðə lˈAzi dˈɔɡ."


@pytest.fixture(scope="module")
def engine(random_weights: Path) -> TorchEngine:
    engine = TorchEngine(random_weights, device="cpu", seed=0, warmup=False, lanes=2)  # on any CPU
    engine.load()
    return engine


def item_for(engine: TorchEngine, pack: np.ndarray, speed: float = 1.0) -> SynthesisItem:
    tokens = tuple(engine.vocab[p] for p in PHONEMES if p in engine.vocab)
    return SynthesisItem(tokens=tokens, style=pack[len(tokens) - 1], speed=speed)


def voice(random_weights: Path, name: str = "af_heart") -> np.ndarray:
    return torch.load(random_weights / "voices" / f"{name}.pt").reshape(510, 256).numpy()


@pytest.mark.numerics
def test_output_equals_the_librarys_own_forward(engine: TorchEngine, random_weights: Path) -> None:
    from kokoro import KModel

    pack = voice(random_weights)
    item = item_for(engine, pack)
    result = engine.synthesize([item])[0]
    ours = result.samples
    config, checkpoint = random_weights / "config.json", random_weights / "kokoro-v1_0.pth"
    library = KModel(repo_id=REPO_ID, config=str(config), model=str(checkpoint)).eval()
    torch.manual_seed(0)
    theirs = library(PHONEMES, torch.from_numpy(item.style).unsqueeze(0), return_output=True)
    assert ours.shape == tuple(theirs.audio.shape)
    assert np.allclose(ours, theirs.audio.numpy(), atol=1e-5)
    # The durations word timings come from are the library's own pred_dur.
    assert result.durations is not None
    np.testing.assert_array_equal(result.durations, theirs.pred_dur.numpy())


def test_durations_are_realistic(engine: TorchEngine, random_weights: Path) -> None:
    item = item_for(engine, voice(random_weights))
    frames = len(engine.synthesize([item])[0].samples) / 600
    assert 1.5 < frames / (len(item.tokens) + 2) < 3.0


@pytest.mark.numerics
def test_speed_and_determinism(engine: TorchEngine, random_weights: Path) -> None:
    pack = voice(random_weights)
    normal = engine.synthesize([item_for(engine, pack)])[0].samples
    again = engine.synthesize([item_for(engine, pack)])[0].samples
    fast = engine.synthesize([item_for(engine, pack, speed=2.0)])[0].samples
    assert np.array_equal(normal, again)
    assert len(fast) < 0.7 * len(normal)


def test_calls_side_by_side_on_lanes_give_the_audio_of_calls_alone(
    engine: TorchEngine, random_weights: Path
) -> None:
    every_thread = torch.get_num_threads()
    assert engine.lanes == max(1, min(2, every_thread))
    pack = voice(random_weights)
    items = [item_for(engine, pack), item_for(engine, pack, speed=1.3)]
    alone = [engine.synthesize([item])[0].samples for item in items]
    side_by_side: dict[int, np.ndarray] = {}
    lane_threads: dict[int, int] = {}
    limits: dict[int, int] = {}
    both_ready = threading.Barrier(len(items))

    def lane(index: int) -> None:
        engine.claim_threads(every_thread=False)
        lane_threads[index] = torch.get_num_threads()
        limits[index] = dynamo_config.recompile_limit
        both_ready.wait()
        side_by_side[index] = engine.synthesize([items[index]])[0].samples

    workers = [threading.Thread(target=lane, args=(index,)) for index in range(len(items))]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert lane_threads == {index: max(1, every_thread // engine.lanes) for index in range(len(items))}
    assert torch.get_num_threads() == every_thread  # a lane's share is its own thread's setting
    # torch's config is per thread too: each lane gets the kernels' recompile limit, not dynamo's default
    assert limits == {index: RECOMPILE_LIMIT for index in range(len(items))}
    for index, samples in side_by_side.items():
        assert samples.shape == alone[index].shape
        np.testing.assert_allclose(samples, alone[index], atol=1e-5)


# Chunks of every kind of length once warmed up: a token alone (six frames on the random weights: under one
# step-statistics block at the 256-channel Snake blocks), also at the fastest speed, and longer ones.
CHUNKS_UNDER_LOAD = [(1, 1.0), (1, 4.0), (2, 1.0), (3, 2.0), (5, 1.0), (60, 1.0), (250, 1.0)]


def compiles_after_warmup(weights: Path, compile_cache: Path | None = None) -> dict[str, Any]:
    """Loads and warms up the engine the server builds on this CPU (its precision, its lanes, compiled
    kernels) and runs CHUNKS_UNDER_LOAD through it: the precision chosen, and how many graphs dynamo
    captured and variants were compiled after the warm-up."""
    from torch._dynamo.utils import counters

    from api.server.app import build_engine, resolve_engine
    from api.settings import Settings

    settings = Settings(weights_dir=weights, engine="torch", fetch_weights=False)
    if compile_cache is not None:
        settings = settings.model_copy(update={"compile_cache_dir": compile_cache})
    settings = resolve_engine(settings)
    engine = build_engine(settings)
    assert isinstance(engine, TorchEngine)
    engine.load()
    captured = counters["stats"]["unique_graphs"]
    assert engine._kernels is not None
    assert engine._kernels.ahead_of_time is not None
    built = engine._kernels.ahead_of_time.built
    pack = voice(weights)
    symbols = [index for symbol, index in engine.vocab.items() if symbol.isalpha()]
    for length, speed in CHUNKS_UNDER_LOAD:
        tokens = tuple((symbols * 10)[:length])
        engine.synthesize([SynthesisItem(tokens=tokens, style=pack[length - 1], speed=speed)])
    return {
        "precision": settings.torch_precision,
        "int8_dot": engine._kernels.int8 and engine._kernels.int8_dot,
        "captured": counters["stats"]["unique_graphs"] - captured,
        "built": engine._kernels.ahead_of_time.built - built,
    }


def test_once_warmed_up_the_engine_compiles_nothing_for_any_chunk_length(random_weights: Path) -> None:
    """Nothing compiles under load (issues 46 and 64): once loaded and warmed up, the engine runs chunks of
    every length with the graphs it built at start, so no first request waits for a compile."""
    compiled = compiles_after_warmup(random_weights)
    assert (compiled["captured"], compiled["built"]) == (0, 0), compiled


@pytest.mark.skipif(
    not avx2(cpu_flags(), None) or not int8_dot(cpu_flags(), os.environ.get("ONEDNN_MAX_CPU_ISA")),
    reason="this CPU is the AVX2 kind itself (the test above), or has no AVX2",
)
def test_as_on_an_avx2_cpu_the_engine_compiles_nothing_for_any_chunk_length(
    random_weights: Path, tmp_path: Path
) -> None:
    """The same where the engine's choices are an AVX2 EPYC's (int8 with fp32 around it, oneDNN dilating,
    64 weight levels): a 9th graph compiled under load there (issue 64) where this CPU's choices compiled
    none. oneDNN capped from the process's start, in a fresh compile cache."""
    program = (
        "import json, sys; from pathlib import Path; "
        "from tests.integration.test_torch_engine import compiles_after_warmup; "
        "print(json.dumps(compiles_after_warmup(Path(sys.argv[1]), Path(sys.argv[2]))))"
    )
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, "-c", program, str(random_weights), str(tmp_path / "compile-cache")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    compiled = json.loads(done.stdout.strip().splitlines()[-1])
    assert (compiled["precision"], compiled["int8_dot"]) == ("int8", False), compiled
    assert (compiled["captured"], compiled["built"]) == (0, 0), compiled


@pytest.mark.parametrize(
    ("requested", "device", "expected"),
    [(None, "cpu", None), (1, "cpu", 1), (64, "cpu", 64), (None, "cuda", 1), (4, "cuda", 1)],
)
def test_lanes_are_settled_per_device_at_most_one_per_thread(
    random_weights: Path, requested: int | None, device: str, expected: int | None
) -> None:
    if expected is None:  # this CPU's default
        expected = choose_cpu_lanes(cpu_flags(), os.environ.get("ONEDNN_MAX_CPU_ISA")).lanes
    engine = TorchEngine(random_weights, lanes=requested, warmup=False)
    engine._settle_lanes(device, cpu_flags(), os.environ.get("ONEDNN_MAX_CPU_ISA"))
    threads = torch.get_num_threads()
    assert engine.lanes == max(1, min(expected, threads))
    assert engine._lane_threads == max(1, threads // engine.lanes)


@pytest.mark.parametrize(
    ("gpu_lanes", "launch_tokens"), [(GPU_LANES, 0), (SHARED_GPU_LANES, GPU_LAUNCH_TOKENS)]
)
def test_on_a_gpu_only_an_engine_with_lanes_tops_its_batches_up(
    random_weights: Path, gpu_lanes: int, launch_tokens: int
) -> None:
    # A worker's own engine (one lane) keeps the length ratio; the shared engine's (two lanes) fills calls
    # the GPU would run in less than a launch's time.
    engine = TorchEngine(random_weights, gpu_lanes=gpu_lanes, warmup=False)
    engine._on_gpu = True  # as load() sets it on a CUDA device; settling the lanes touches no GPU
    engine._settle_lanes("cuda", cpu_flags(), None)
    assert engine.lanes == gpu_lanes
    assert engine.batch_defaults == dataclasses.replace(GPU_BATCH_POLICY, launch_tokens=launch_tokens)


def copy_weights(random_weights: Path, tmp_path: Path) -> Path:
    target = tmp_path / "weights"
    target.mkdir()
    shutil.copy(random_weights / "config.json", target / "config.json")
    return target


def test_checkpoint_with_wrong_keys_is_refused(random_weights: Path, tmp_path: Path) -> None:
    # KModel itself would load nothing from this (its fallback strips a 7-character prefix) and say nothing.
    target = copy_weights(random_weights, tmp_path)
    checkpoint = torch.load(random_weights / "kokoro-v1_0.pth", weights_only=True)
    renamed = {
        part: {"model." + key[7:]: v for key, v in state.items()} for part, state in checkpoint.items()
    }
    renamed["bert"] = {"xx" + key: v for key, v in checkpoint["bert"].items()}
    torch.save(renamed, target / "kokoro-v1_0.pth")
    with pytest.raises(CheckpointError, match="bert"):
        TorchEngine(target, device="cpu", warmup=False).load()


def test_checkpoint_missing_a_component_is_refused(random_weights: Path, tmp_path: Path) -> None:
    target = copy_weights(random_weights, tmp_path)
    checkpoint = torch.load(random_weights / "kokoro-v1_0.pth", weights_only=True)
    del checkpoint["decoder"]
    torch.save(checkpoint, target / "kokoro-v1_0.pth")
    with pytest.raises(CheckpointError, match="decoder"):
        TorchEngine(target, device="cpu", warmup=False).load()


def test_checkpoint_with_missing_keys_is_refused(random_weights: Path, tmp_path: Path) -> None:
    target = copy_weights(random_weights, tmp_path)
    checkpoint = torch.load(random_weights / "kokoro-v1_0.pth", weights_only=True)
    dropped = next(key for key in checkpoint["predictor"] if "duration_proj" in key)
    del checkpoint["predictor"][dropped]
    torch.save(checkpoint, target / "kokoro-v1_0.pth")
    with pytest.raises(CheckpointError, match="missing"):
        TorchEngine(target, device="cpu", warmup=False).load()


def save_edited(random_weights: Path, tmp_path: Path, edit: Callable[[dict[str, Any]], None]) -> Path:
    target = copy_weights(random_weights, tmp_path)
    checkpoint = torch.load(random_weights / "kokoro-v1_0.pth", weights_only=True)
    edit(checkpoint)
    torch.save(checkpoint, target / "kokoro-v1_0.pth")
    return target


def test_checkpoint_without_the_bert_pooler_is_accepted(random_weights: Path, tmp_path: Path) -> None:
    """KModel's forward never reads PL-BERT's pooler; kokoro and Kokoro-FastAPI load such checkpoints."""

    def drop_pooler(checkpoint: dict[str, Any]) -> None:
        pooler = [key for key in checkpoint["bert"] if key.startswith("module.pooler.")]
        assert len(pooler) == 2
        for key in pooler:
            del checkpoint["bert"][key]

    target = save_edited(random_weights, tmp_path, drop_pooler)
    # Eager kernels: the checkpoint is the question here (7 s against 11 s compiled, AMX Xeon).
    engine = TorchEngine(target, device="cpu", seed=0, warmup=False, compile=False)
    engine.load()
    reference = TorchEngine(random_weights, device="cpu", seed=0, warmup=False, compile=False)
    reference.load()
    item = item_for(engine, voice(random_weights))
    assert np.array_equal(engine.synthesize([item])[0].samples, reference.synthesize([item])[0].samples)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda c: c["bert"].pop("module.embeddings.word_embeddings.weight"), "1 missing keys"),
        (lambda c: c["bert"].update({"module.pooler.extra": torch.zeros(1)}), "1 unexpected keys"),
        (
            lambda c: c["bert"].update({"module.pooler.weight": torch.zeros(3, 3)}),
            r"wrong shape: pooler.weight \(3, 3\) \(expected \(768, 768\)\)",
        ),
    ],
    ids=["missing-bert-key", "unexpected-pooler-key", "misshapen-pooler"],
)
def test_other_bert_key_faults_are_still_refused(
    random_weights: Path, tmp_path: Path, edit: Callable[[dict[str, Any]], object], message: str
) -> None:
    target = save_edited(random_weights, tmp_path, edit)
    with pytest.raises(CheckpointError, match=f"bert: .*{message}"):
        TorchEngine(target, device="cpu", warmup=False).load()
