"""Starting the server under tcmalloc where the machine has it.

A CPU forward in PyTorch allocates and frees activations of tens to hundreds of MB per call. glibc's malloc
maps each one over 32 MiB afresh (the kernel faults in and zeroes its pages every time) and leaves holes
in its heap that the next call's tensors do not fit. tcmalloc (Debian's libtcmalloc-minimal4) keeps freed
spans and reuses them: the bare torch engine at AVX2 dispatch ran 6-11% faster with a 200-290 MiB lower
peak (docs/journal/allocator.md, entry 24). An allocator is chosen when a process starts, so `python -m api`
runs itself again with tcmalloc in LD_PRELOAD before it loads anything heavy; its workers inherit it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
from collections.abc import Callable, Mapping
from typing import Literal

logger = logging.getLogger(__name__)

Allocator = Literal["auto", "tcmalloc", "system"]

TCMALLOC_LIBRARY = "tcmalloc_minimal"
PRELOAD_ENV = "LD_PRELOAD"
# Set before the new start, so that a preload the loader refused cannot make the server start itself again
# and again.
TRIED_ENV = "KOKORO_ALLOCATOR_TRIED"


class AllocatorError(RuntimeError):
    """The allocator asked for cannot be used on this machine."""


def tcmalloc_loaded() -> bool:
    """Whether this process allocates through tcmalloc (its C API is then in the global namespace)."""
    return hasattr(ctypes.CDLL(None), "MallocExtension_ReleaseFreeMemory")


def find_tcmalloc() -> str | None:
    """The path or soname of tcmalloc's library on this machine, if any."""
    return ctypes.util.find_library(TCMALLOC_LIBRARY)


def preload_environment(
    allocator: Allocator,
    environ: Mapping[str, str],
    *,
    engine: str = "auto",
    loaded: Callable[[], bool] = tcmalloc_loaded,
    find: Callable[[], str | None] = find_tcmalloc,
) -> dict[str, str] | None:
    """The environment to start the server again with, under tcmalloc; None to go on as this process is.

    `auto` uses tcmalloc where it is installed, no other allocator is preloaded and the engine (as the
    workers will choose it, `engine_at_start`) is not onnx (ONNX Runtime keeps its own arena: 3% faster but
    40 MiB more under tcmalloc, docs/journal/allocator.md, entry 24);
    `tcmalloc` requires it (AllocatorError where it is missing or the loader refused it); `system` keeps
    the C library's malloc.
    """
    if allocator == "system" or loaded():
        return None
    if allocator == "auto" and (engine == "onnx" or user_allocator(environ)):
        return None
    if environ.get(TRIED_ENV):
        if allocator == "tcmalloc":
            raise AllocatorError(f"tcmalloc was preloaded ({environ.get(PRELOAD_ENV, '')}) but is not in use")
        return None
    library = find()
    if library is None:
        if allocator == "tcmalloc":
            raise AllocatorError(
                "KOKORO_ALLOCATOR=tcmalloc but libtcmalloc_minimal is not installed "
                "(Debian/Ubuntu: apt-get install libtcmalloc-minimal4)"
            )
        return None
    preload = " ".join(part for part in (library, environ.get(PRELOAD_ENV, "")) if part)
    return {**environ, PRELOAD_ENV: preload, TRIED_ENV: "1"}


def user_allocator(environ: Mapping[str, str]) -> str | None:
    """An allocator the user preloaded (jemalloc, mimalloc, ...), which `auto` leaves in place."""
    names = environ.get(PRELOAD_ENV, "").replace(":", " ").split()
    return next((name for name in names if "malloc" in os.path.basename(name)), None)


def describe_allocator(allocator: Allocator, engine: str = "auto") -> str:
    """One log line on the allocator this process runs with, and why."""
    if tcmalloc_loaded():
        return "allocator: tcmalloc (reuses freed activations; KOKORO_ALLOCATOR=system for glibc's malloc)"
    if allocator == "auto" and engine == "onnx":
        return "allocator: the C library's malloc (the onnx engine: ONNX Runtime keeps its own arena)"
    if os.environ.get(TRIED_ENV):
        return f"allocator: the C library's malloc (the loader did not take {os.environ.get(PRELOAD_ENV)})"
    preloaded = user_allocator(os.environ)
    if preloaded is not None and allocator == "auto":
        return f"allocator: {preloaded} (LD_PRELOAD)"
    if allocator == "system":
        return "allocator: the C library's malloc (KOKORO_ALLOCATOR=system)"
    return (
        "allocator: the C library's malloc (tcmalloc is not installed; with Debian's libtcmalloc-minimal4 "
        "the torch engine on a CPU runs faster in less memory)"
    )


def restart_under_tcmalloc(allocator: Allocator, engine: str, command: list[str], executable: str) -> None:
    """Replace this process with `command` (its whole command line, interpreter first: `sys.orig_argv`)
    under tcmalloc, where `preload_environment` says so."""
    environment = preload_environment(allocator, os.environ, engine=engine)
    if environment is not None:
        os.execve(executable, command, environment)
