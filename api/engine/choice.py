"""Which engine the server runs when `KOKORO_ENGINE=auto` (the default): decided at start-up from the
device and the files at hand, in microseconds (no benchmark), and logged with the reason.

The rule (docs/performance.md, "The defaults, and why"): on a GPU, kokoro's KModel under PyTorch with
batching. On a CPU with native bf16 (AMX or AVX512-BF16), or with AVX2, and a C++ compiler for
torch.compile, the PyTorch engine with its compiled CPU kernels (api/engine/kernels.py; bf16 where native,
and int8 for the vocoder's Snake-block convolutions on AVX512-BF16 CPUs with VNNI and on CPUs without
native bf16), faster there than the int8 model under ONNX Runtime (docs/journal/cpu-torch-engine.md,
entries 9 and 11; docs/journal/cpu-kernels-int8.md, entry 15). On other CPUs (no AVX2, or no compiler) the
int8 ONNX model, faster than the fp32 PyTorch engine and smaller (docs/journal/cpu-threads-and-replicas.md,
entry 4); there the PyTorch engine stays the choice only where the int8 model is absent and may not be
fetched. Each choice comes with a reason for the log: the decision and the journal entry behind it, never
the figures (they live in the journal).
"""

from __future__ import annotations

import os
import platform
import shutil
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from api.weights.layout import WeightsLayout

if TYPE_CHECKING:
    from api.settings import Settings

EngineName = Literal["torch", "onnx"]


@dataclass(frozen=True)
class EngineChoice:
    engine: EngineName
    reason: str


_X86_MACHINES = frozenset({"x86_64", "amd64", "i386", "i686"})
_ARM_MACHINES = frozenset({"aarch64", "arm64"})


def cpu_flags(
    cpuinfo: Path = Path("/proc/cpuinfo"), auxv: Path = Path("/proc/self/auxv"), machine: str | None = None
) -> frozenset[str]:
    """The CPU's instruction-set flags: x86's `flags` line, or ARM's `Features` (empty where /proc/cpuinfo
    is not there, e.g. macOS). On an ARM machine whose /proc/cpuinfo has no `Features`, the kernel's
    hardware capabilities from the process's auxiliary vector instead: under qemu-user emulation
    /proc/cpuinfo is the x86 host's, while the auxiliary vector is the emulated CPU's. An ARM machine never
    gets x86 flags."""
    key, flags = _cpuinfo_flags(cpuinfo)
    machine = (platform.machine() if machine is None else machine).lower()
    if machine in _ARM_MACHINES and key != "Features":
        return arm_hwcaps(auxv)
    return flags


def _cpuinfo_flags(cpuinfo: Path) -> tuple[str | None, frozenset[str]]:
    """(the line's key, its flags) of /proc/cpuinfo's first `flags` or `Features` line."""
    try:
        text = cpuinfo.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None, frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return key.strip(), frozenset(value.split())
    return None, frozenset()


# The auxiliary vector's entries (Linux's include/uapi/linux/auxvec.h) and the bits of arm64's hardware
# capabilities in them (arch/arm64/include/uapi/asm/hwcap.h), named as /proc/cpuinfo's `Features` names them.
_AT_HWCAP, _AT_HWCAP2 = 16, 26
_HWCAP_BITS = {
    _AT_HWCAP: {1: "asimd", 20: "asimddp", 22: "sve"},
    _AT_HWCAP2: {1: "sve2", 13: "i8mm", 14: "bf16"},
}


def arm_hwcaps(auxv: Path = Path("/proc/self/auxv")) -> frozenset[str]:
    """ARM_FEATURES that the auxiliary vector's AT_HWCAP and AT_HWCAP2 say this CPU has (empty where it
    cannot be read)."""
    try:
        data = auxv.read_bytes()
    except OSError:
        return frozenset()
    found: set[str] = set()
    for entry, value in struct.iter_unpack("@QQ", data[: len(data) // 16 * 16]):
        found.update(name for bit, name in _HWCAP_BITS.get(entry, {}).items() if value >> bit & 1)
    return frozenset(found)


CpuKind = Literal["x86", "arm", "unknown"]
# ARM's features that would decide kernel paths there: NEON (asimd), int8 dot products (asimddp, i8mm),
# bf16, and the scalable vectors.
ARM_FEATURES = ("asimd", "asimddp", "i8mm", "bf16", "sve", "sve2")


def cpu_kind(flags: frozenset[str], machine: str | None = None) -> CpuKind:
    """x86, ARM (its NEON feature, or the machine's name where no flags could be read, as on macOS), or
    unknown."""
    machine = (platform.machine() if machine is None else machine).lower()
    if "asimd" in flags or machine in _ARM_MACHINES:
        return "arm"
    if flags or machine in _X86_MACHINES:
        return "x86"
    return "unknown"


def isa_summary(flags: frozenset[str], machine: str | None = None) -> str:
    """The flags that decide kernel paths, for the log: e.g. 'avx2 avx512f amx_bf16', 'arm64: asimd i8mm'."""
    kind = cpu_kind(flags, machine)
    if kind == "arm":
        return "arm64: " + (" ".join(flag for flag in ARM_FEATURES if flag in flags) or "features unknown")
    if kind == "unknown":
        return f"{machine or platform.machine() or 'unknown machine'}, features unknown"
    wanted = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_bf16", "amx_int8")
    present = [flag for flag in wanted if flag in flags]
    return " ".join(present) or "no AVX2"


# Why a CPU that is not x86 gets kokoro's own fp32 path.
NOT_X86 = (
    "the compiled CPU kernels (oneDNN's x86 bf16 and int8 paths) and the int8 ONNX engine were measured on "
    "x86 only"
)


def choose_engine(
    requested: Literal["auto", "torch", "onnx"],
    *,
    device: str,
    onnx_present: bool,
    may_fetch: bool,
    flags: frozenset[str],
    fast_torch: str | None = None,
    checkpoint_present: bool = True,
    machine: str | None = None,
) -> EngineChoice:
    """`device` is the resolved torch device (cpu, cuda, mps); `onnx_present` and `checkpoint_present`
    whether the int8 model and the PyTorch checkpoint are in the weights directory; `may_fetch` whether
    the server may fetch what is missing; `fast_torch` why the PyTorch engine would run its compiled CPU
    kernels here (`fast_cpu_torch`), None where it would not."""
    if requested != "auto":
        return EngineChoice(requested, f"KOKORO_ENGINE={requested}")
    if device != "cpu":
        return EngineChoice(
            "torch",
            f"device {device}: kokoro's KModel with batched inference (docs/journal/gpu.md, entry 12)",
        )
    isa = isa_summary(flags, machine)
    if cpu_kind(flags, machine) != "x86":
        return EngineChoice(
            "torch",
            f"CPU ({isa}): kokoro's fp32 KModel, the library's own path: {NOT_X86} (KOKORO_ENGINE=onnx "
            "runs ONNX Runtime's own kernels for this CPU)",
        )
    if fast_torch is not None and (checkpoint_present or may_fetch):
        return EngineChoice(
            "torch",
            f"CPU ({isa}): {fast_torch}: kokoro's KModel with compiled CPU kernels, faster here than the "
            "int8 ONNX engine (docs/journal/cpu-torch-engine.md, entry 9)",
        )
    if onnx_present or may_fetch:
        return EngineChoice(
            "onnx",
            f"CPU ({isa}): the int8 ONNX Runtime engine, faster and smaller than fp32 PyTorch "
            "(docs/journal/cpu-threads-and-replicas.md, entry 4)",
        )
    return EngineChoice(
        "torch",
        f"CPU ({isa}): the int8 ONNX model is not in the weights directory and fetching is off, so kokoro's "
        "fp32 KModel",
    )


Precision = Literal["fp32", "bf16", "int8"]

# CPU flags of native bf16 arithmetic (AVX512-BF16 dot products, AMX tiles); without one, oneDNN emulates
# bf16 and it is slower than fp32.
NATIVE_BF16_FLAGS = ("amx_bf16", "avx512_bf16")
# oneDNN ISA caps (ONEDNN_MAX_CPU_ISA) below the first one with native bf16.
_ISA_CAPS_WITHOUT_BF16 = frozenset(
    {"SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI"}
)
# oneDNN ISA caps below its AMX kernels.
_ISA_CAPS_WITHOUT_AMX = _ISA_CAPS_WITHOUT_BF16 | {"AVX512_CORE_BF16", "AVX512_CORE_FP16"}
# CPU flags of int8 dot products (VNNI, AMX tiles), and the oneDNN ISA caps below them.
INT8_DOT_FLAGS = ("amx_int8", "avx512_vnni", "avx_vnni")
_ISA_CAPS_WITHOUT_INT8_DOT = frozenset({"SSE41", "AVX", "AVX2", "AVX512_CORE"})
# oneDNN ISA caps below AVX2, whose int8 convolutions were not measured (SSE4.1 ones are slow).
_ISA_CAPS_BELOW_AVX2 = frozenset({"SSE41", "AVX"})


@dataclass(frozen=True)
class PrecisionChoice:
    precision: Precision
    reason: str


def _cap_name(isa_cap: str | None) -> str:
    """ONEDNN_MAX_CPU_ISA as oneDNN reads it (case-insensitive), "" where unset."""
    return (isa_cap or "").strip().upper()


def native_bf16(flags: frozenset[str], isa_cap: str | None) -> list[str]:
    """The CPU's flags of native bf16 arithmetic that oneDNN may use (none where ONEDNN_MAX_CPU_ISA,
    `isa_cap`, leaves them out)."""
    if _cap_name(isa_cap) in _ISA_CAPS_WITHOUT_BF16:
        return []
    return [flag for flag in NATIVE_BF16_FLAGS if flag in flags]


def int8_dot(flags: frozenset[str], isa_cap: str | None) -> list[str]:
    """The CPU's flags of int8 dot products that oneDNN may use (none where `isa_cap` leaves them out)."""
    if _cap_name(isa_cap) in _ISA_CAPS_WITHOUT_INT8_DOT:
        return []
    return [flag for flag in INT8_DOT_FLAGS if flag in flags]


def avx2(flags: frozenset[str], isa_cap: str | None) -> bool:
    """Whether oneDNN may use AVX2 with FMA here (its int8 convolutions' path on CPUs without VNNI)."""
    return "avx2" in flags and "fma" in flags and _cap_name(isa_cap) not in _ISA_CAPS_BELOW_AVX2


def choose_precision(
    requested: Literal["auto", "fp32", "bf16", "int8"],
    *,
    device: str,
    flags: frozenset[str],
    isa_cap: str | None,
    gpu_bf16: bool = False,
    machine: str | None = None,
) -> PrecisionChoice:
    """The torch engine's decoder precision. `isa_cap` is ONEDNN_MAX_CPU_ISA where set; `gpu_bf16` says
    whether a CUDA device computes bf16 natively (compute capability 8.0 and up).

    auto: on a CPU with AVX512-BF16 and int8 dot products (not capped away), int8 for the convolutions of
    the vocoder's Snake blocks and bf16 for the rest of the decoder and vocoder (docs/journal/
    cpu-kernels-int8.md, entry 14); bf16 on an AMX CPU, where int8 convolutions lost to its bf16 tiles
    (docs/journal/cpu-torch-engine.md, entry 20), on a CPU whose bf16 is native but has no int8 dot
    products (docs/journal/cpu-torch-engine.md, entry 11), and on a GPU whose bf16 is native
    (docs/journal/gpu.md, entry 13). On a CPU without native bf16 but with AVX2 and FMA, int8 for the
    Snake-block convolutions and fp32 for the rest (docs/journal/cpu-kernels-int8.md, entry 15); fp32
    elsewhere. The text side stays fp32, because there bf16 changed the predicted durations."""
    if requested != "auto":
        return PrecisionChoice(requested, f"KOKORO_TORCH_PRECISION={requested}")
    if device.startswith("cuda"):
        if gpu_bf16:
            return PrecisionChoice(
                "bf16",
                f"device {device} computes bf16 natively: decoder and vocoder in bf16 "
                "(docs/journal/gpu.md, entry 13)",
            )
        return PrecisionChoice("fp32", f"device {device} has no native bf16: fp32")
    if device != "cpu":
        return PrecisionChoice("fp32", f"device {device}: fp32 (bf16 not measured there)")
    if cpu_kind(flags, machine) != "x86":
        return PrecisionChoice("fp32", f"CPU ({isa_summary(flags, machine)}): fp32: {NOT_X86}")
    bf16 = native_bf16(flags, isa_cap)
    if not bf16:
        if any(flag in flags for flag in NATIVE_BF16_FLAGS):
            cpu = f"ONEDNN_MAX_CPU_ISA={_cap_name(isa_cap)} leaves out the CPU's native bf16"
        else:
            cpu = f"CPU ({isa_summary(flags)}) has no native bf16"
        if avx2(flags, isa_cap):
            return PrecisionChoice(
                "int8",
                f"{cpu}, has AVX2: the vocoder's Snake-block convolutions in int8, the rest of decoder and "
                "vocoder in fp32 (docs/journal/cpu-kernels-int8.md, entry 15)",
            )
        return PrecisionChoice("fp32", f"{cpu}, and no AVX2: fp32")
    dot = int8_dot(flags, isa_cap)
    if dot and "amx_bf16" not in bf16:
        return PrecisionChoice(
            "int8",
            f"CPU has native bf16 ({' '.join(bf16)}) and int8 dot products ({' '.join(dot)}): the vocoder's "
            "Snake-block convolutions in int8, the rest of decoder and vocoder in bf16 "
            "(docs/journal/cpu-kernels-int8.md, entry 14)",
        )
    reason = f"CPU has native bf16 ({' '.join(bf16)}): decoder and vocoder in bf16"
    if dot:
        return PrecisionChoice(
            "bf16",
            f"{reason}, not int8 convolutions, which lose to AMX here "
            "(docs/journal/cpu-torch-engine.md, entry 20)",
        )
    return PrecisionChoice("bf16", f"{reason} (docs/journal/cpu-torch-engine.md, entry 11)")


@dataclass(frozen=True)
class LanesChoice:
    lanes: int
    reason: str


def choose_cpu_lanes(flags: frozenset[str], isa_cap: str | None) -> LanesChoice:
    """How many torch engine calls run side by side on a CPU by default (KOKORO_TORCH_LANES unset).

    Two, one thread each, where a call's small operations leave a thread idle
    (docs/journal/cpu-threads-and-replicas.md, entry 19). One where AMX runs the decoder in bf16: there two
    lanes gained nothing through the server and cost throughput and first audio at one client
    (docs/journal/cpu-torch-engine.md, entry 20)."""
    amx = "amx_bf16" in native_bf16(flags, isa_cap) and _cap_name(isa_cap) not in _ISA_CAPS_WITHOUT_AMX
    if amx:
        return LanesChoice(
            1, "AMX computes bf16 here: one call at a time (docs/journal/cpu-torch-engine.md, entry 20)"
        )
    return LanesChoice(
        2,
        "no AMX bf16 here: two calls side by side, one thread each "
        "(docs/journal/cpu-threads-and-replicas.md, entry 19)",
    )


def fast_cpu_torch(precision: PrecisionChoice, compile: bool) -> str | None:
    """Why the PyTorch engine would run bf16 or int8 compiled kernels on this CPU, or None: it needs one of
    them chosen (`precision`, as chosen for the torch engine), KOKORO_TORCH_COMPILE on and a C++ compiler
    (inductor builds the fused kernels with $CXX, else g++)."""
    if precision.precision not in ("bf16", "int8") or not compile:
        return None
    compiler = cxx_compiler()
    if compiler is None:
        return None
    return f"{precision.reason}, C++ compiler {compiler}"


def cxx_compiler() -> str | None:
    """The C++ compiler torch.compile's inductor would use on Linux ($CXX, else g++), if it is there."""
    return shutil.which(os.environ.get("CXX", "g++"))


def choose(
    settings: Settings, *, device: str, flags: frozenset[str], isa_cap: str | None, gpu_bf16: bool = False
) -> tuple[EngineChoice, PrecisionChoice]:
    """The engine and the torch engine's precision for `settings` on this machine (`device` resolved)."""
    precision = choose_precision(
        settings.torch_precision, device=device, flags=flags, isa_cap=isa_cap, gpu_bf16=gpu_bf16
    )
    layout = WeightsLayout(settings.weights_dir)
    engine = choose_engine(
        settings.engine,
        device=device,
        onnx_present=layout.onnx_path.is_file(),
        checkpoint_present=layout.checkpoint_path.is_file(),
        may_fetch=settings.fetch_weights,
        flags=flags,
        fast_torch=fast_cpu_torch(precision, settings.torch_compile) if device == "cpu" else None,
    )
    return engine, precision


def nvidia_gpu_present(gpus: Path = Path("/proc/driver/nvidia/gpus")) -> bool:
    """Whether the NVIDIA driver lists a GPU (read without loading torch)."""
    try:
        return any(gpus.iterdir())
    except OSError:
        return False


def engine_at_start(
    settings: Settings,
    *,
    flags: frozenset[str] | None = None,
    isa_cap: str | None = None,
    gpu_present: Callable[[], bool] = nvidia_gpu_present,
) -> EngineName:
    """The engine the workers will choose (`choose`), told before torch is loaded, for the allocator
    `python -m api` starts under (api/engine/allocator.py). Exact where KOKORO_DEVICE is set; with `auto` a
    GPU the NVIDIA driver lists stands for CUDA, which a CPU build of torch would not use."""
    device = settings.device
    if device == "auto":
        device = "cuda" if gpu_present() else "cpu"
    engine, _ = choose(
        settings,
        device=device,
        flags=cpu_flags() if flags is None else flags,
        isa_cap=os.environ.get("ONEDNN_MAX_CPU_ISA") if isa_cap is None else isa_cap,
    )
    return engine.engine
