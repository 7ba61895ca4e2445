"""KOKORO_ENGINE=auto: torch on a GPU, the int8 ONNX engine on a CPU, torch where that model cannot be had."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from api.app import resolve_engine
from api.engine.base import usable_cores
from api.engine.choice import EngineChoice, choose_engine, cpu_flags, isa_summary
from api.engine.onnx_engine import default_threads
from api.settings import Settings
from api.weights.layout import ONNX_FILE

AVX2 = frozenset({"fpu", "sse4_2", "avx", "avx2", "fma"})
AMX = AVX2 | {"avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8", "amx_tile"}


def choose(
    requested: str = "auto", device: str = "cpu", onnx: bool = True, fetch: bool = True
) -> EngineChoice:
    return choose_engine(
        requested,  # type: ignore[arg-type]
        device=device,
        onnx_present=onnx,
        may_fetch=fetch,
        flags=AVX2,
    )


def test_the_setting_wins_when_it_names_an_engine() -> None:
    assert choose("torch").engine == "torch"
    assert choose("onnx", device="cuda").engine == "onnx"
    assert choose("torch").reason == "KOKORO_ENGINE=torch"


@pytest.mark.parametrize("device", ["cuda", "mps"])
def test_a_gpu_gets_the_batched_torch_engine(device: str) -> None:
    choice = choose(device=device)
    assert choice.engine == "torch"
    assert device in choice.reason


@pytest.mark.parametrize(("onnx", "fetch"), [(True, False), (False, True), (True, True)])
def test_a_cpu_gets_the_int8_engine_when_its_model_can_be_had(onnx: bool, fetch: bool) -> None:
    choice = choose(onnx=onnx, fetch=fetch)
    assert choice.engine == "onnx"
    assert "avx2" in choice.reason


def test_a_cpu_without_the_int8_model_and_no_fetching_keeps_torch() -> None:
    choice = choose(onnx=False, fetch=False)
    assert choice.engine == "torch"
    assert "not in the weights directory" in choice.reason


def test_cpu_flags_come_from_cpuinfo(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Some Xeon\nflags\t\t: fpu avx2 amx_bf16\n\n")
    assert cpu_flags(cpuinfo) == {"fpu", "avx2", "amx_bf16"}
    assert cpu_flags(tmp_path / "absent") == frozenset()


def test_the_log_names_the_isa_that_decides_kernels() -> None:
    assert isa_summary(AVX2) == "avx2 fma"
    assert isa_summary(AMX) == "avx2 fma avx512f avx512_vnni avx512_bf16 amx_bf16 amx_int8"
    assert isa_summary(frozenset({"sse2"})) == "no AVX2"


def test_resolve_engine_makes_auto_concrete_and_logs_why(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = Settings(weights_dir=tmp_path, fetch_weights=False, device="cpu")
    assert settings.engine == "auto"
    with caplog.at_level(logging.INFO, logger="api.app"):
        assert resolve_engine(settings).engine == "torch"
        (tmp_path / ONNX_FILE).write_bytes(b"")
        assert resolve_engine(settings).engine == "onnx"
    messages = [record.getMessage() for record in caplog.records]
    assert messages[0].startswith("engine: torch (CPU (")
    assert messages[1].startswith("engine: onnx (CPU (")
    assert resolve_engine(settings.model_copy(update={"engine": "torch"})).engine == "torch"


def test_onnx_threads_are_always_explicit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert default_threads(None) == usable_cores()
    assert default_threads(3) == 3
    monkeypatch.setenv("OMP_NUM_THREADS", "5")
    assert default_threads(None) == 5
