"""Giving freed heap memory back to the system.

glibc's malloc keeps what the process frees inside its heaps. Both engines' loading makes large temporary
copies of their models, and a CPU forward in PyTorch allocates and frees a few hundred MB of activations:
a torch worker that synthesized chunks of changing lengths grew from 1.5 to 3.0 GiB while holding 1.5 GiB
of live data. `malloc_trim(0)` after loading and after each torch engine call on a CPU returns the free
pages (measured: the same worker stayed at 1.5-1.6 GiB between calls, peak 2.1 GiB, no loss of speed;
docs/journal/cpu-torch-engine.md, entry 9). Under tcmalloc (api/engine/allocator.py) its own release does the
same; it reuses the spans it holds, so between calls that follow each other they stay with it
(docs/journal/allocator.md, entry 24).
Elsewhere (musl, macOS) this does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
import logging
import sys
import threading
from collections.abc import Callable

from api.engine.allocator import tcmalloc_loaded

logger = logging.getLogger(__name__)

# How long the torch engine waits with no call running before tcmalloc gives its free spans back: longer
# than the gap between one client's requests, so back-to-back calls keep reusing them.
IDLE_RELEASE_S = 2.0


def release_free_memory() -> None:
    """Return the allocator's free pages to the system: tcmalloc's ReleaseFreeMemory where the process runs
    under tcmalloc, else glibc's malloc_trim; a no-op where there is neither."""
    release = _release()
    if release is not None:
        release()


def free_model_memory() -> None:
    """After a model's last reference is dropped: collect it, give a GPU's cached blocks back to the driver
    (torch's caching allocator keeps them otherwise) and the heap's free pages back to the system."""
    gc.collect()
    torch = sys.modules.get("torch")  # never imported: no torch memory to free
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    release_free_memory()


@functools.cache
def _release() -> Callable[[], object] | None:
    if tcmalloc_loaded():
        tcmalloc: Callable[[], object] = ctypes.CDLL(None).MallocExtension_ReleaseFreeMemory
        return tcmalloc
    name = ctypes.util.find_library("c")
    try:
        trim: Callable[[int], int] = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError, TypeError):
        logger.info("no malloc_trim in this C library: freed heap memory stays with the process")
        return None
    return lambda: trim(0)


class CallMemory:
    """Gives freed memory back after engine calls, which may run on several threads at once.

    With an allocator that leaves holes (glibc) after every call; with one that reuses what it holds
    (tcmalloc) once no call has run for `idle_s`: releasing after each call cost 4-6% at AVX2 dispatch
    (docs/journal/allocator.md, entry 24), and an idle worker still goes back to its size after loading.
    """

    def __init__(
        self,
        reuses: bool,
        idle_s: float = IDLE_RELEASE_S,
        release: Callable[[], None] = release_free_memory,
    ) -> None:
        if idle_s < 0:
            raise ValueError(f"idle_s must be >= 0, got {idle_s}")
        self.reuses = reuses
        self.idle_s = idle_s
        self._release = release
        self._lock = threading.Lock()
        self._running = 0
        self._idle_periods = 0  # a timer releases only if no call ran since it was started

    def started(self) -> None:
        with self._lock:
            self._running += 1

    def ended(self) -> None:
        if not self.reuses:
            with self._lock:
                self._running -= 1
            self._release()
            return
        with self._lock:
            self._running -= 1
            if self._running:
                return
            self._idle_periods += 1
            timer = threading.Timer(self.idle_s, self._release_if_idle, args=(self._idle_periods,))
        timer.daemon = True
        timer.start()

    def _release_if_idle(self, period: int) -> None:
        with self._lock:
            if self._running or period != self._idle_periods:
                return
            self._release()
