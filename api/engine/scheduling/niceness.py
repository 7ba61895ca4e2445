"""OS thread priorities for the scheduler's threads: lanes a little nicer than the process, a book's idle.

With several lanes, their threads run LANE_NICENESS nicer than the process, and a first chunk that starts
beside busy lanes runs on a thread of the process's own niceness: the OS gives it the cores, and the lanes'
calls go on when it is done (a thread may raise its niceness but not lower it again, hence a thread of its
own). Measured: first audio p50 2.36 s with the first chunk on a lane's share, 1.35 s this way.

A book's chunks run under Linux's SCHED_IDLE: the OS gives the cores to a request's call that starts beside
a book's. With SCHED_IDLE alone, a request's first audio at 1 client came 1.33x later with a book running
than without, and at niceness 19 alone 1.52x (docs/journal/books.md, entry 48); the scheduler also starts a
book's call only while no request's call runs or waits (api/engine/scheduling/lanes.py).
"""

from __future__ import annotations

import logging
import os
import threading

logger = logging.getLogger(__name__)

LANE_NICENESS = 10
BOOK_NICENESS = 19  # where SCHED_IDLE is not to be had


def run_when_idle() -> None:
    """Put the calling thread (and the threads it starts) under SCHED_IDLE (Linux): it runs only on a core
    no other thread wants. Elsewhere, or where that is refused, as nice as a thread gets."""
    try:
        os.sched_setscheduler(threading.get_native_id(), os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError) as exc:
        logger.info("a book's chunks run at niceness %d, not SCHED_IDLE (%s)", BOOK_NICENESS, exc)
        lower_priority(BOOK_NICENESS)


def lower_priority(steps: int) -> None:
    """Raise the calling thread's niceness by `steps` (Linux: per thread); elsewhere nothing."""
    try:
        thread = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, thread, min(os.getpriority(os.PRIO_PROCESS, thread) + steps, 19))
    except (AttributeError, OSError) as exc:
        logger.info("engine lanes keep the process's priority (%s)", exc)
