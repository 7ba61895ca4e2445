"""Giving freed heap memory back to the system.

glibc's malloc keeps what the process frees inside its heaps. Both engines' loading makes large temporary
copies of their models, and a CPU forward in PyTorch allocates and frees a few hundred MB of activations:
a torch worker that synthesized chunks of changing lengths grew from 1.5 to 3.0 GiB while holding 1.5 GiB
of live data. `malloc_trim(0)` after loading and after each torch engine call on a CPU returns the free
pages (measured: the same worker stayed at 1.5-1.6 GiB between calls, peak 2.1 GiB, no loss of speed;
docs/performance.md, section 9). Elsewhere (musl, macOS) it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
from collections.abc import Callable

logger = logging.getLogger(__name__)


def release_free_memory() -> None:
    """Return the heap's free pages to the system (glibc's malloc_trim); a no-op where there is none."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    try:
        trim: Callable[[int], int] = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError, TypeError):
        logger.info("no malloc_trim in this C library: freed heap memory stays with the process")
        return None
    return trim
