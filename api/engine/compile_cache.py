"""Where compiled kernels are kept, and the keys that name them: the cache directory per torch, Python,
device, fused code and CPU, and each variant's file name.

Inductor keeps what it built in an on-disk cache (its FX-graph and AOT-autograd caches: the C++ or Triton
kernels and the graphs around them), but its key does not tell CPU dispatch levels apart: a process run
with ATEN_CPU_CAPABILITY=avx2 after one without it loaded kernels that wrote NaN, and the other way round
one that corrupted the heap (torch 2.13, AMX Xeon). Unless TORCHINDUCTOR_CACHE_DIR is set, the cache
therefore lives under KOKORO_COMPILE_CACHE_DIR (default ~/.cache/kokoro-openai-server/compile-cache, kept
across starts, so that only a machine's first start compiles: how long that takes is measured in
docs/performance.md#time-to-ready), in a directory of its own per torch and Python version, device (a
GPU's name, compute capability and CUDA version), the fused functions' code (`SOURCE_KEY`), oneDNN ISA
cap, CPU dispatch level and CPU flags: a cache made on another CPU kind, dispatch level or GPU, or from
other code, is never found.
"""

from __future__ import annotations

import ast
import hashlib
import os
import sys
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from api.engine import fused
from api.engine.choice import cpu_flags

# Where compiled kernels are kept across starts: the setting `compile_cache_dir` (api/settings.py, the same
# default), which the server passes down (api/server/app.py's build_engine); an engine built without it
# (scripts, tests) reads the same variable here.
COMPILE_CACHE_ENV = "KOKORO_COMPILE_CACHE_DIR"
DEFAULT_COMPILE_CACHE_DIR = Path.home() / ".cache" / "kokoro-openai-server" / "compile-cache"


def source_key(source: str) -> str:
    """A hash of the code in `source` (a module's text): its syntax tree without docstrings, so that an
    edit to a comment, a docstring or the layout keeps the key, and any change to what runs changes it."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            node.body = body[1:] or [ast.Pass()]
    return hashlib.sha256(ast.dump(tree).encode()).hexdigest()[:10]


# The fused functions' code, hashed once: `compile_cache_dir` keys the cache by it. The variants compiled
# ahead of time run the code they were traced from, which is that module's only (api/engine/fused.py).
SOURCE_KEY = source_key(Path(fused.__file__).read_text(encoding="utf-8"))


def compile_cache_root() -> Path:
    """KOKORO_COMPILE_CACHE_DIR, else DEFAULT_COMPILE_CACHE_DIR."""
    chosen = os.environ.get(COMPILE_CACHE_ENV)
    return Path(chosen).expanduser() if chosen else DEFAULT_COMPILE_CACHE_DIR


def compile_cache_dir(root: Path, device: torch.device | str = "cpu") -> Path:
    """Inductor's cache directory under `root` for this torch and Python, device, the fused functions' code,
    oneDNN ISA cap, CPU dispatch level and CPU (see the module docstring). The code counts because a variant
    compiled ahead of time is loaded by name and runs the code it was traced from: after an upgrade that
    changed a fused function, the old code ran on (found by the test of entry 47,
    docs/journal/cpu-kernels-int8.md); Python's version, because a variant holds its byte code. The
    directory name ends in the dispatch level and the CPU flags' hash."""
    flags = hashlib.sha256(" ".join(sorted(cpu_flags())).encode()).hexdigest()[:12]
    level = torch.backends.cpu.get_cpu_capability().lower()
    isa_cap = _safe(os.environ.get("ONEDNN_MAX_CPU_ISA", "any").lower())
    device_name = device_key(torch.device(device))
    python = f"py{sys.version_info.major}{sys.version_info.minor}"
    key = f"torch{torch.__version__}-{python}-{device_name}-src{SOURCE_KEY}-{isa_cap}-{level}-{flags}"
    return root / f"kokoro-inductor-{key}"


def device_key(device: torch.device) -> str:
    """`cpu`, or a CUDA device's name, compute capability and CUDA version (Triton builds for all three)."""
    if device.type != "cuda":
        return device.type
    major, minor = torch.cuda.get_device_capability(device)
    name = _safe(torch.cuda.get_device_name(device).lower())
    return f"cuda{torch.version.cuda}_sm{major}{minor}_{name}"


def _safe(text: str) -> str:
    return "".join(char if char.isalnum() or char in "._" else "_" for char in text)


def use_compile_cache(path: Path) -> None:
    """Point inductor at `path`, unless the user chose a TORCHINDUCTOR_CACHE_DIR (inductor writes its
    default into that variable when it is first imported, so the default counts as not chosen)."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    current = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if current is None or os.path.abspath(current) == os.path.abspath(default_cache_dir()):
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(path)


def variant_key(args: tuple[Any, ...]) -> str:
    """A name for the variant that `args` need, from what dynamo's guards tell apart (each tensor's dtype,
    device, sizes of 1, memory order; each int; None; the thread count; grad mode): workers that compile
    the same variant at once write one file, not one each. Only a name: a loaded variant's own guards still
    decide which calls it takes."""
    parts: list[object] = [
        torch.get_num_threads(),
        torch.is_grad_enabled(),
        torch.is_inference_mode_enabled(),
    ]
    for arg in args:
        if isinstance(arg, Tensor):
            strides = arg.stride()
            order = sorted(range(arg.dim()), key=lambda dim: -strides[dim])
            ones = [size == 1 for size in arg.shape]
            parts.append((str(arg.dtype), arg.device.type, tuple(order), tuple(ones), arg.requires_grad))
        elif isinstance(arg, bool | int | torch.dtype) or arg is None:
            parts.append(repr(arg))
        else:
            parts.append(type(arg).__name__)
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:16]


def variant_name(key: str, held: set[str]) -> str:
    """The file name (less the function's) for a new variant of `key`: the key itself, or where a held
    variant has that name already, the key with the first ordinal no held variant has."""
    if key not in held:
        return key
    return next(f"{key}-{ordinal}" for ordinal in range(1, len(held) + 2) if f"{key}-{ordinal}" not in held)
