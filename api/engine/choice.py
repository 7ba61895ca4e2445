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


Precision = Literal["fp32", "bf16"]

# CPU flags of native bf16 arithmetic (AVX512-BF16 dot products, AMX tiles); without one, oneDNN emulates
# bf16 and it is slower than fp32.
NATIVE_BF16_FLAGS = ("amx_bf16", "avx512_bf16")
# oneDNN ISA caps (ONEDNN_MAX_CPU_ISA) below the first one with native bf16.
_ISA_CAPS_WITHOUT_BF16 = frozenset(
    {"SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI"}
)


@dataclass(frozen=True)
class PrecisionChoice:
    precision: Precision
    reason: str


def choose_precision(
    requested: Literal["auto", "fp32", "bf16"],
    *,
    device: str,
    flags: frozenset[str],
    isa_cap: str | None,
) -> PrecisionChoice:
    """The torch engine's decoder precision. `isa_cap` is ONEDNN_MAX_CPU_ISA where set.

    auto: bf16 autocast for the decoder and vocoder on a CPU whose bf16 is native (and not capped away),
    fp32 elsewhere. On an AVX-512-BF16 CPU this was 1.5x faster than fp32 at a log-mel distance to fp32
    of 0.45-0.65 dB, a third of the int8 model's own 1.2-2.1 dB (docs/performance.md); the text side
    stays fp32, because there bf16 changed the predicted durations."""
    if requested != "auto":
        return PrecisionChoice(requested, f"KOKORO_TORCH_PRECISION={requested}")
    if device != "cpu":
        return PrecisionChoice("fp32", f"device {device}: fp32 (bf16 not measured there)")
    native = [flag for flag in NATIVE_BF16_FLAGS if flag in flags]
    if not native:
        return PrecisionChoice("fp32", f"CPU ({isa_summary(flags)}) has no native bf16: fp32")
    cap = (isa_cap or "").strip().upper()
    if cap in _ISA_CAPS_WITHOUT_BF16:
        return PrecisionChoice("fp32", f"ONEDNN_MAX_CPU_ISA={cap} leaves out the CPU's native bf16: fp32")
    return PrecisionChoice("bf16", f"CPU has native bf16 ({' '.join(native)}): decoder and vocoder in bf16")
