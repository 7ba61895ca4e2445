"""Which engine the server runs when `KOKORO_ENGINE=auto` (the default): decided at start-up from the
device and the files at hand, in microseconds (no benchmark), and logged with the reason.

The rule follows the measurements in docs/performance.md: on a GPU, kokoro's KModel under PyTorch with
batching; on a CPU, the int8 model under ONNX Runtime, which was 1.4-1.9x faster than the fp32 PyTorch
engine on an AVX2 CPU (AMD EPYC), about as fast on an AVX-512/AMX Xeon, and needs a third of the memory
on both. The PyTorch engine stays the CPU's choice only where the int8 model is absent and may not be
fetched.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

EngineName = Literal["torch", "onnx"]


@dataclass(frozen=True)
class EngineChoice:
    engine: EngineName
    reason: str


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The CPU's instruction-set flags (empty where /proc/cpuinfo is not there, e.g. macOS)."""
    try:
        text = cpuinfo.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


def isa_summary(flags: frozenset[str]) -> str:
    """The flags that decide kernel paths, for the log: e.g. 'avx2 avx512f amx_bf16'."""
    wanted = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_bf16", "amx_int8")
    present = [flag for flag in wanted if flag in flags]
    return " ".join(present) or "no AVX2"


def choose_engine(
    requested: Literal["auto", "torch", "onnx"],
    *,
    device: str,
    onnx_present: bool,
    may_fetch: bool,
    flags: frozenset[str],
) -> EngineChoice:
    """`device` is the resolved torch device (cpu, cuda, mps); `onnx_present` whether the int8 model is
    in the weights directory; `may_fetch` whether the server may fetch it."""
    if requested != "auto":
        return EngineChoice(requested, f"KOKORO_ENGINE={requested}")
    if device != "cpu":
        return EngineChoice("torch", f"device {device}: kokoro's KModel with batched inference")
    isa = isa_summary(flags)
    if onnx_present or may_fetch:
        return EngineChoice(
            "onnx",
            f"CPU ({isa}): the int8 ONNX Runtime engine, faster than fp32 PyTorch on AVX2 CPUs and as fast "
            "on AVX-512/AMX ones, at a third of the memory (docs/performance.md)",
        )
    return EngineChoice(
        "torch",
        f"CPU ({isa}): the int8 ONNX model is not in the weights directory and fetching is off, so kokoro's "
        "fp32 KModel",
    )
