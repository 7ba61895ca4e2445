"""KOKORO_ENGINE=auto: torch on a GPU and on a CPU with native bf16 and a C++ compiler, else the int8 ONNX
engine on a CPU, torch where that model cannot be had."""

from __future__ import annotations

import logging
import re
import struct
from pathlib import Path

import pytest

from api.engine.base import usable_cores
from api.engine.choice import (
    EngineChoice,
    choose_cpu_lanes,
    choose_engine,
    choose_precision,
    cpu_flags,
    cpu_kind,
    engine_at_start,
    fast_cpu_torch,
    isa_summary,
    nvidia_gpu_present,
)
from api.engine.onnx_engine import default_threads
from api.server.app import resolve_engine
from api.settings import Settings
from api.weights.layout import CHECKPOINT_FILE, ONNX_FILE

ROOT = Path(__file__).resolve().parents[2]
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
    assert cpu_flags(cpuinfo, machine="x86_64") == {"fpu", "avx2", "amx_bf16"}
    assert cpu_flags(tmp_path / "absent", machine="x86_64") == frozenset()


def auxv(tmp_path: Path, hwcap: int, hwcap2: int) -> Path:
    """An auxiliary vector as /proc/self/auxv holds it: (type, value) pairs of machine words, ending in
    AT_NULL."""
    path = tmp_path / "auxv"
    entries = [(6, 4096), (16, hwcap), (26, hwcap2), (0, 0)]  # AT_PAGESZ, AT_HWCAP, AT_HWCAP2, AT_NULL
    path.write_bytes(b"".join(struct.pack("@QQ", entry, value) for entry, value in entries))
    return path


def test_under_arm64_emulation_the_features_come_from_the_auxiliary_vector(tmp_path: Path) -> None:
    """qemu-user shows the x86 host's /proc/cpuinfo to an arm64 process; its auxiliary vector is the
    emulated CPU's. The x86 flags are never taken for an ARM CPU's."""
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f\n")
    neoverse_v1 = auxv(tmp_path, hwcap=1 << 1 | 1 << 20 | 1 << 22 | 1 << 7, hwcap2=1 << 13 | 1 << 14)
    flags = cpu_flags(cpuinfo, neoverse_v1, machine="aarch64")
    assert flags == {"asimd", "asimddp", "sve", "i8mm", "bf16"}
    assert isa_summary(flags, "aarch64") == "arm64: asimd asimddp i8mm bf16 sve"
    assert cpu_flags(cpuinfo, tmp_path / "absent", machine="aarch64") == frozenset()
    # An ARM machine's own Features line wins; x86 ignores the auxiliary vector.
    cpuinfo.write_text("processor\t: 0\nFeatures\t: fp asimd\n")
    assert cpu_flags(cpuinfo, neoverse_v1, machine="aarch64") == {"fp", "asimd"}
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu avx2\n")
    assert cpu_flags(cpuinfo, neoverse_v1, machine="x86_64") == {"fpu", "avx2"}


def test_the_log_names_the_isa_that_decides_kernels() -> None:
    assert isa_summary(AVX2) == "avx2 fma"
    assert isa_summary(AMX) == "avx2 fma avx512f avx512_vnni avx512_bf16 amx_bf16 amx_int8"
    assert isa_summary(frozenset({"sse2"})) == "no AVX2"


def test_resolve_engine_makes_auto_concrete_and_logs_why(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = Settings(weights_dir=tmp_path, fetch_weights=False, device="cpu")
    assert settings.engine == "auto"
    with caplog.at_level(logging.INFO, logger="api.server.app"):
        assert resolve_engine(settings).engine == "torch"
        (tmp_path / ONNX_FILE).write_bytes(b"")
        assert resolve_engine(settings).engine == "onnx"
    messages = [record.getMessage() for record in caplog.records if record.getMessage().startswith("engine:")]
    assert messages[0].startswith("engine: torch (CPU (")
    assert messages[1].startswith("engine: onnx (CPU (")
    assert resolve_engine(settings.model_copy(update={"engine": "torch"})).engine == "torch"


def test_onnx_threads_are_always_explicit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert default_threads(None) == usable_cores()
    assert default_threads(3) == 3
    monkeypatch.setenv("OMP_NUM_THREADS", "5")
    assert default_threads(None) == 5


AVX512_BF16 = AVX2 | {"avx512f", "avx512bw", "avx512_vnni", "avx512_bf16"}
AVX512 = AVX2 | {"avx512f", "avx512bw", "avx512_vnni"}
# native bf16 without int8 dot products: not a CPU seen so far, but the flags are separate
BF16_ONLY = AVX2 | {"avx512f", "avx512bw", "avx512_bf16"}


def precision(
    requested: str = "auto", device: str = "cpu", flags: frozenset[str] = AVX512_BF16, cap: str | None = None
) -> str:
    return choose_precision(requested, device=device, flags=flags, isa_cap=cap).precision  # type: ignore[arg-type]


def test_int8_where_the_cpu_has_avx512_bf16_and_int8_dot_products() -> None:
    assert precision(flags=AVX512_BF16) == "int8"
    assert precision(flags=AVX512_BF16, cap="ALL") == "int8"
    assert precision(flags=AVX512_BF16, cap="avx512_core_bf16") == "int8"
    reason = choose_precision("auto", device="cpu", flags=AVX512_BF16, isa_cap=None).reason
    assert "avx512_bf16" in reason
    assert "avx512_vnni" in reason


@pytest.mark.parametrize("flags", [BF16_ONLY, AMX])
def test_bf16_on_amx_and_where_bf16_is_native_without_int8_dot_products(flags: frozenset[str]) -> None:
    assert precision(flags=flags) == "bf16"
    assert precision(flags=flags, cap="ALL") == "bf16"
    assert precision(flags=flags, cap="avx512_core_amx") == "bf16"


@pytest.mark.parametrize("flags", [AVX2, AVX512])
def test_int8_with_fp32_where_bf16_would_be_emulated_but_avx2_is_there(flags: frozenset[str]) -> None:
    choice = choose_precision("auto", device="cpu", flags=flags, isa_cap=None)
    assert choice.precision == "int8"
    assert "no native bf16" in choice.reason
    assert "fp32" in choice.reason


@pytest.mark.parametrize("flags", [frozenset(), frozenset({"sse4_2", "avx"}), frozenset({"avx2"})])
def test_fp32_without_avx2_and_fma(flags: frozenset[str]) -> None:
    assert precision(flags=flags) == "fp32"


@pytest.mark.parametrize("cap", ["AVX2", "avx512_core", "AVX512_CORE_VNNI"])
def test_an_isa_cap_below_bf16_keeps_int8_with_fp32(cap: str) -> None:
    choice = choose_precision("auto", device="cpu", flags=AMX, isa_cap=cap)
    assert choice.precision == "int8"
    assert cap.upper() in choice.reason


@pytest.mark.parametrize("cap", ["SSE41", "avx"])
def test_an_isa_cap_below_avx2_keeps_fp32(cap: str) -> None:
    choice = choose_precision("auto", device="cpu", flags=AMX, isa_cap=cap)
    assert choice.precision == "fp32"
    assert cap.upper() in choice.reason


def test_gpus_and_explicit_settings() -> None:
    assert precision(device="cuda") == "fp32"
    assert (
        choose_precision("auto", device="cuda", flags=AVX2, isa_cap=None, gpu_bf16=True).precision == "bf16"
    )
    assert (
        choose_precision("fp32", device="cuda", flags=AVX2, isa_cap=None, gpu_bf16=True).precision == "fp32"
    )
    assert precision(device="mps") == "fp32"
    assert precision("bf16", flags=AVX2) == "bf16"
    assert precision("int8", flags=AVX2) == "int8"
    assert precision("fp32") == "fp32"


def test_resolve_engine_logs_the_torch_precision(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("api.server.app.cpu_flags", lambda: AVX512_BF16)
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    settings = Settings(weights_dir=tmp_path, fetch_weights=False, device="cpu", engine="torch")
    with caplog.at_level(logging.INFO, logger="api.server.app"):
        assert resolve_engine(settings).torch_precision == "int8"
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "SSE41")
        assert resolve_engine(settings).torch_precision == "fp32"
        monkeypatch.setattr("api.server.app.cpu_flags", lambda: BF16_ONLY)
        monkeypatch.delenv("ONEDNN_MAX_CPU_ISA")
        assert resolve_engine(settings).torch_precision == "bf16"
    messages = [record.getMessage() for record in caplog.records if "precision" in record.getMessage()]
    assert messages[0].startswith(
        "torch precision: int8 (CPU has native bf16 (avx512_bf16) and int8 dot products (avx512_vnni)"
    )
    assert messages[1].startswith("torch precision: fp32 (ONEDNN_MAX_CPU_ISA=SSE41")
    assert messages[2].startswith("torch precision: bf16 (CPU has native bf16 (avx512_bf16):")


def test_a_cpu_with_fast_torch_gets_the_torch_engine() -> None:
    choice = choose_engine(
        "auto", device="cpu", onnx_present=True, may_fetch=False, flags=AMX, fast_torch="native bf16, g++"
    )
    assert choice.engine == "torch"
    assert "native bf16, g++" in choice.reason
    assert "amx_bf16" in choice.reason


def test_fast_torch_needs_its_checkpoint_or_fetching() -> None:
    absent = {"onnx_present": True, "checkpoint_present": False, "flags": AMX, "fast_torch": "bf16"}
    assert choose_engine("auto", device="cpu", may_fetch=False, **absent).engine == "onnx"  # type: ignore[arg-type]
    assert choose_engine("auto", device="cpu", may_fetch=True, **absent).engine == "torch"  # type: ignore[arg-type]


def test_fast_torch_needs_bf16_or_int8_compile_and_a_compiler(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    compiler = tmp_path / "c++"
    compiler.write_text("#!/bin/sh\n")
    compiler.chmod(0o755)
    monkeypatch.setenv("CXX", str(compiler))
    bf16 = choose_precision("auto", device="cpu", flags=BF16_ONLY, isa_cap=None)
    fp32 = choose_precision("auto", device="cpu", flags=frozenset({"sse4_2"}), isa_cap=None)
    avx2_int8 = choose_precision("auto", device="cpu", flags=AVX2, isa_cap=None)
    for fast in (bf16, avx2_int8, choose_precision("auto", device="cpu", flags=AMX, isa_cap=None)):
        reason = fast_cpu_torch(fast, compile=True)
        assert reason is not None
        assert str(compiler) in reason
    assert fast_cpu_torch(fp32, compile=True) is None
    assert fast_cpu_torch(bf16, compile=False) is None
    monkeypatch.setenv("CXX", str(tmp_path / "absent"))
    assert fast_cpu_torch(bf16, compile=True) is None


def test_resolve_engine_picks_fast_torch_where_the_cpu_allows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("api.server.app.cpu_flags", lambda: AMX)
    monkeypatch.setenv("CXX", "sh")  # any program on PATH stands for the compiler here
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    (tmp_path / ONNX_FILE).write_bytes(b"")
    (tmp_path / CHECKPOINT_FILE).write_bytes(b"")
    settings = Settings(weights_dir=tmp_path, fetch_weights=False, device="cpu")
    resolved = resolve_engine(settings)
    assert (resolved.engine, resolved.torch_precision) == ("torch", "bf16")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    resolved = resolve_engine(settings)
    assert (resolved.engine, resolved.torch_precision) == ("torch", "int8")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "SSE41")
    assert resolve_engine(settings).engine == "onnx"
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA")
    assert resolve_engine(settings.model_copy(update={"torch_compile": False})).engine == "onnx"


@pytest.mark.parametrize("flags", [AMX, AVX2, frozenset({"sse4_2"})])
@pytest.mark.parametrize("compiler", [True, False])
@pytest.mark.parametrize("cap", [None, "AVX2", "SSE41"])
def test_the_engine_told_before_the_start_is_the_one_the_workers_choose_on_a_cpu(
    flags: frozenset[str], compiler: bool, cap: str | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`python -m api` picks its allocator by the engine the workers will run (api/engine/allocator.py)."""
    monkeypatch.setattr("api.server.app.cpu_flags", lambda: flags)
    monkeypatch.setenv("CXX", "sh" if compiler else str(tmp_path / "absent"))
    if cap is None:
        monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    else:
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", cap)
    (tmp_path / ONNX_FILE).write_bytes(b"")
    (tmp_path / CHECKPOINT_FILE).write_bytes(b"")
    settings = Settings(weights_dir=tmp_path, fetch_weights=False, device="cpu")
    told = engine_at_start(settings, flags=flags, isa_cap=cap)
    assert told == resolve_engine(settings).engine
    auto = settings.model_copy(update={"device": "auto"})
    assert engine_at_start(auto, flags=flags, isa_cap=cap, gpu_present=lambda: False) == told


def test_before_the_start_a_gpu_the_driver_lists_means_the_torch_engine(tmp_path: Path) -> None:
    (tmp_path / ONNX_FILE).write_bytes(b"")
    settings = Settings(weights_dir=tmp_path, fetch_weights=False, device="auto", torch_compile=False)
    assert engine_at_start(settings, flags=AVX2, isa_cap=None, gpu_present=lambda: False) == "onnx"
    assert engine_at_start(settings, flags=AVX2, isa_cap=None, gpu_present=lambda: True) == "torch"
    cpu = settings.model_copy(update={"device": "cpu"})
    assert engine_at_start(cpu, flags=AVX2, isa_cap=None, gpu_present=lambda: True) == "onnx"


def test_the_drivers_gpu_list_is_read_without_torch(tmp_path: Path) -> None:
    gpus = tmp_path / "gpus"
    assert not nvidia_gpu_present(gpus)  # no NVIDIA driver
    gpus.mkdir()
    assert not nvidia_gpu_present(gpus)
    (gpus / "0000:00:04.0").mkdir()
    assert nvidia_gpu_present(gpus)


ZEN4 = AVX2 | {"avx512f", "avx512bw", "avx512_vnni", "avx512_bf16"}


@pytest.mark.parametrize(
    ("flags", "cap", "lanes"),
    [
        (AMX, None, 1),  # AMX's bf16 tiles: lanes gained nothing through the server there
        (AMX, "AVX512_CORE_AMX", 1),
        (AMX, "avx2", 2),  # capped below AMX: as an AVX2 CPU
        (AMX, "AVX512_CORE_BF16", 2),  # AVX512-BF16 without AMX, as a Zen 4
        (ZEN4, None, 2),
        (AVX2, None, 2),
        (frozenset(), None, 2),
    ],
)
def test_lanes_are_one_where_amx_computes_bf16_else_two(
    flags: frozenset[str], cap: str | None, lanes: int
) -> None:
    choice = choose_cpu_lanes(flags, cap)
    assert choice.lanes == lanes
    assert ("AMX computes bf16" in choice.reason) == (lanes == 1)


CITATION = re.compile(r"\(docs/journal/(?P<topic>[\w-]+)\.md, entry (?P<entry>\d+)\)")
FIGURE = re.compile(r"\d\s*x\b|\d+(?:\.\d+)?x\b|\bdB\b|%|audio-s/s")


def measured_reasons() -> list[str]:
    """The reason of every choice that rests on a measurement, for the CPUs and devices the tests know."""
    reasons = [
        choose(device="cuda").reason,
        choose(onnx=True).reason,
        choose_engine(
            "auto", device="cpu", onnx_present=True, may_fetch=False, flags=AMX, fast_torch="bf16, g++"
        ).reason,
        choose_precision("auto", device="cuda", flags=AVX2, isa_cap=None, gpu_bf16=True).reason,
    ]
    for flags in (AVX2, AMX, AVX512_BF16, BF16_ONLY):
        reasons.append(choose_precision("auto", device="cpu", flags=flags, isa_cap=None).reason)
        reasons.append(choose_cpu_lanes(flags, None).reason)
    return reasons


@pytest.mark.parametrize("reason", measured_reasons())
def test_a_measured_reason_cites_its_journal_entry_and_no_figures(reason: str) -> None:
    cited = CITATION.search(reason)
    assert cited is not None, reason
    journal = ROOT / "docs" / "journal" / f"{cited['topic']}.md"
    assert f"\n## {cited['entry']}. " in journal.read_text(encoding="utf-8"), reason
    assert FIGURE.search(reason) is None, reason


GRAVITON3 = (
    "processor\t: 0\nBogoMIPS\t: 2100.00\nFeatures\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics "
    "fphp asimdhp cpuid asimdrdm jscvt fcma lrcpc dcpop sha3 sm3 sm4 asimddp sha512 sve asimdfhm dit uscat "
    "ilrcpc flagm ssbs paca pacg dcpodp svei8mm svebf16 i8mm bf16 dgh rng\nCPU implementer\t: 0x41\n"
)
RASPBERRY_PI_5 = (
    "processor\t: 0\nBogoMIPS\t: 108.00\nFeatures\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp "
    "asimdhp cpuid asimdrdm lrcpc dcpop asimddp\nCPU implementer\t: 0x41\nCPU part\t: 0xd0b\n"
)


@pytest.mark.parametrize(
    ("cpuinfo", "summary"),
    [(GRAVITON3, "arm64: asimd asimddp i8mm bf16 sve"), (RASPBERRY_PI_5, "arm64: asimd asimddp")],
)
def test_an_arm_cpu_gets_the_library_path_with_its_features_in_the_reason(
    tmp_path: Path, cpuinfo: str, summary: str
) -> None:
    path = tmp_path / "cpuinfo"
    path.write_text(cpuinfo)
    flags = cpu_flags(path, machine="aarch64")
    assert cpu_kind(flags, "aarch64") == "arm"
    assert isa_summary(flags, "aarch64") == summary
    precision_choice = choose_precision("auto", device="cpu", flags=flags, isa_cap=None, machine="aarch64")
    assert precision_choice.precision == "fp32"  # ARM's bf16 and i8mm are not oneDNN's x86 paths
    assert summary in precision_choice.reason
    engine = choose_engine(
        "auto", device="cpu", onnx_present=True, may_fetch=True, flags=flags, machine="aarch64"
    )
    assert engine.engine == "torch"
    assert "measured on x86 only" in engine.reason
    assert "KOKORO_ENGINE=onnx" in engine.reason


def test_a_cpu_whose_features_cannot_be_read_is_known_by_its_machine() -> None:
    assert cpu_kind(frozenset(), "arm64") == "arm"  # macOS: no /proc/cpuinfo
    assert isa_summary(frozenset(), "arm64") == "arm64: features unknown"
    assert cpu_kind(frozenset(), "x86_64") == "x86"
    assert cpu_kind(frozenset(), "riscv64") == "unknown"
    choice = choose_engine(
        "auto", device="cpu", onnx_present=True, may_fetch=True, flags=frozenset(), machine="riscv64"
    )
    assert choice.engine == "torch"
    assert "riscv64, features unknown" in choice.reason
    # Named engines and GPUs are as before.
    assert (
        choose_engine(
            "onnx", device="cpu", onnx_present=True, may_fetch=True, flags=frozenset({"asimd"})
        ).engine
        == "onnx"
    )
    assert (
        choose_engine("auto", device="mps", onnx_present=True, may_fetch=True, flags=frozenset()).engine
        == "torch"
    )
