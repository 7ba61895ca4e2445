"""`python -m api.engine.compile_worker DIRECTORY`: the background compiler's child process
(api/engine/compile_requests.py, `BackgroundCompiler`). It compiles each request in DIRECTORY/requests (a
call's arguments) into a variant saved in DIRECTORY, where the server's `AheadOfTime` finds it, then removes
the request; one that fails leaves a `.failed` file saying why. At a lower priority than the server, one at a
time per DIRECTORY (a lock file), and never past its parent: a server that stops takes it along.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from api.engine import fused
from api.engine.compile_requests import FAILED_SUFFIX, REQUESTS, rebuilt
from api.engine.compiled import AheadOfTime, allow_recompiles

logger = logging.getLogger("api.engine.compile_worker")

# The compiler's niceness: the lowest, so that it takes the cores the server's calls leave idle and little of
# the rest. Against 10, one client's requests meanwhile ran 1.36x the library instead of 0.94x, and full speed
# came as soon (110 against 105 s; docs/performance.md, "Time to ready").
NICE = 19
# How often it checks that its parent still runs, in seconds.
PARENT_CHECK_S = 1.0
STARTED_SUFFIX = ".started"


def main(argv: list[str] | None = None) -> int:
    directory = Path((argv if argv is not None else sys.argv[1:])[0])
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    with contextlib.suppress(OSError):
        os.nice(NICE)
    watch_parent(os.getppid())
    store = AheadOfTime(directory)
    while pending(directory):
        with exclusive(directory / "compile.lock") as held:
            if not held:
                return 0  # another compiler works on this directory; it takes these requests too
            while requests := pending(directory):
                for path in requests:
                    answer(store, path)
    return 0


def pending(directory: Path) -> list[Path]:
    return sorted((directory / REQUESTS).glob("*.pt"))


def answer(store: AheadOfTime, path: Path) -> None:
    """Compile the variant `path` asks for, unless one on disk takes its arguments already; a request that a
    compiler died on before (its `.started` mark is there) fails instead of killing the next."""
    started = path.with_suffix(STARTED_SUFFIX)
    failed = path.with_suffix(FAILED_SUFFIX)
    try:
        if started.exists():
            failed.write_text("the compiler died compiling it before\n")
            return
        started.touch()
        request = torch.load(path, weights_only=True)
        function = getattr(fused, request["function"])
        begun = time.monotonic()
        args = tuple(rebuilt(arg) for arg in request["args"])
        with call_mode(request):
            built = store.compile(function, args)
        if built:
            logger.info("compiled %s (%s) in %.1f s", function.__name__, path.stem, time.monotonic() - begun)
    except Exception as exc:  # noqa: BLE001 - any failure is the request's: its calls stay eager
        logger.warning("could not compile %s", path.name, exc_info=True)
        failed.write_text(f"{type(exc).__name__}: {exc}\n")
    finally:
        path.unlink(missing_ok=True)
        started.unlink(missing_ok=True)


@contextlib.contextmanager
def call_mode(request: dict[str, Any]) -> Iterator[None]:
    """The thread count and grad modes of the call that asked: dynamo's guards and the kernels' threads
    depend on them."""
    torch.set_num_threads(int(request["threads"]))
    allow_recompiles()
    inference = torch.inference_mode() if request["inference"] else contextlib.nullcontext()
    with inference, torch.set_grad_enabled(bool(request["grad"])):
        yield


@contextlib.contextmanager
def exclusive(path: Path) -> Iterator[bool]:
    """Whether this process holds `path`'s lock for the block (False at once if another does)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as file:
        try:
            fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(file, fcntl.LOCK_UN)


def watch_parent(parent: int) -> None:
    """Exit as soon as `parent` is gone (its children are adopted by another process)."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_CHECK_S)
        os._exit(0)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


if __name__ == "__main__":
    sys.exit(main())
