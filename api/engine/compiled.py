"""The fused functions (api/engine/fused.py) compiled by inductor: kept on disk across starts (where, and
under which keys: api/engine/compile_cache.py), and compiled in the background while the calls run them
eagerly.

On a CPU the fused functions are compiled ahead of time (`AheadOfTime`): each variant dynamo traced is saved
whole, guards and all, beside inductor's cache, and loaded at the next start instead of traced again
(docs/journal/cpu-kernels-int8.md, entry 35). In the server a variant that is not on disk yet is compiled in
the background (`BackgroundCompiler`: a child process at a lower priority), and the calls that need it run
the same function eagerly until it is there: a first start is ready in seconds instead of after minutes of
compiling, and no call ever waits on a compile (docs/performance.md, "Time to ready").
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from api.engine.base import KernelStatus
from api.engine.compile_cache import variant_key, variant_name
from api.engine.compile_requests import BackgroundCompiler

logger = logging.getLogger(__name__)

# Compiled versions kept per fused function (see allow_recompiles).
RECOMPILE_LIMIT = 64
# How often a call that found no compiled variant for its input looks on disk for new ones, in seconds.
REFRESH_S = 1.0
# Answers to one request (the compiler found a variant on disk for it) after which its calls, should they
# still find none that takes them, run eagerly for good instead of asking again.
ANSWERS_AT_MOST = 3


def allow_recompiles() -> None:
    """Raise dynamo's limit of compiled versions per function to RECOMPILE_LIMIT on the calling thread.

    Each function meets up to a few dozen kinds of input (float32 or the kernels' dtype, three memory
    layouts, one item or a batch, masked or not, short or long, one thread or several): past dynamo's
    default of 8 the rest would run eagerly, at a third of the speed. torch keeps every change to its
    config per thread (a ContextVar), so each thread that calls the kernels must call this first: a lane
    that did not hit the default limit within minutes (docs/journal/cpu-threads-and-replicas.md, entry 19).
    dynamo is imported here, not with this module: its 1.3 s would be paid by every process that imports
    the server's app, the ONNX engine's and its supervisor's too."""
    from torch._dynamo import config as dynamo_config

    dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, RECOMPILE_LIMIT)


class Fused:
    """A function compiled with torch.compile (dynamic shapes), run eagerly instead once compiling fails.

    Given a store (`AheadOfTime`), each kind of input it meets is compiled ahead of time instead, and what
    any earlier start compiled there is loaded from it; if that fails, just in time."""

    def __init__(self, function: Callable[..., Any], compile: bool, store: AheadOfTime | None = None) -> None:
        self._eager = function
        self._store = store if compile else None
        self._run: Callable[..., Any] = function
        if compile and store is None:
            self._run = torch.compile(function, dynamic=True)

    def __call__(self, *args: Any) -> Any:
        if self._store is not None:
            try:
                return self._store.run(self._eager, args)
            except Exception:  # noqa: BLE001 - see AheadOfTime: the just-in-time compiler takes over
                logger.warning(
                    "compiling %s ahead of time failed: compiling it just in time",
                    self._eager.__name__,
                    exc_info=True,
                )
                self._store = None
                self._run = torch.compile(self._eager, dynamic=True)
        if self._run is self._eager:
            return self._eager(*args)
        try:
            return self._run(*args)
        except Exception:  # noqa: BLE001 - any inductor failure (no compiler, unsupported op) falls back
            logger.warning(
                "torch.compile failed for %s: running it eagerly", self._eager.__name__, exc_info=True
            )
            self._run = self._eager
            return self._eager(*args)


class AheadOfTime:
    """The fused functions compiled ahead of time (torch.compile's `aot_compile`), one variant per kind of
    input (dtype, layout, masked or not, sizes of 1), saved in `directory` and loaded from it at the next
    start. The just-in-time compiler keeps only inductor's work on disk: each start traced every variant
    again, 20 s of a warm start of the int8 engine (docs/journal/cpu-kernels-int8.md, entries 34 and 35),
    where loading a saved variant takes 15-80 ms. A call runs the first variant whose guards (dynamo's
    own, saved with it) accept its arguments. When none does, a new variant is compiled and saved (named by
    `variant_key`, so that workers compiling it at once leave one file; a new variant with a held one's key,
    told apart from it by a guard the key does not see, is saved under the key and the first free ordinal
    instead of over that one's file): in the calling thread, or with `background`, by a `BackgroundCompiler`
    while the call and those like it run the function eagerly, until a thread that watches the disk every
    REFRESH_S has loaded it.
    Variants of another torch, device or CPU are never found (`compile_cache_dir`)."""

    def __init__(self, directory: Path, *, background: bool = False) -> None:
        self.directory = directory
        self.loaded = 0
        self.built = 0
        self._variants: dict[str, list[Any]] = {}
        self._names: dict[str, set[str]] = {}  # per function, the held variants' names (`variant_name`)
        self._functions: dict[str, Callable[..., Any]] = {}
        self._lock = threading.Lock()
        self._compiler = BackgroundCompiler(directory) if background else None
        self._pending: set[tuple[str, str]] = set()  # (function, key) asked of the background compiler
        self._failed: set[tuple[str, str]] = set()
        self._first_request: float | None = None
        self._all_done: float | None = None
        self._refreshed = 0.0
        self._unloadable: set[Path] = set()
        self._watcher: threading.Thread | None = None
        self._answers: dict[tuple[str, str], int] = {}
        self._modes: dict[str, tuple[bool, bool]] = {}  # per function, its calls' (inference, grad) modes

    def run(self, function: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        variants = self._variants.get(function.__name__)
        if variants is None:
            variants = self._load(function)
        index, variant = _accepting(variants, args)
        if variant is None and self._compiler is not None:
            variant = self._from_background(function, args)
            if variant is None:
                return function(*args)
        elif variant is None:
            with self._lock:
                variant = self._compile(function, args)
        elif index:
            self._to_front(function.__name__, variant)
        return variant(*args)

    def compile(self, function: Callable[..., Any], args: tuple[Any, ...]) -> bool:
        """Make sure a variant that accepts `args` is on disk (the background compiler's work): True when
        one was compiled, False when one was there already."""
        if function.__name__ not in self._variants:
            self._load(function)
        with self._lock:
            built = self.built
            self._compile(function, args)
            return self.built > built

    def status(self) -> KernelStatus:
        """Read without the lock, which a compile in the calling thread holds for minutes: /ready asks from
        the event loop. Each count is read whole; together they may be a moment apart."""
        compiled = sum(len(variants) for variants in list(self._variants.values()))
        pending, failed = len(self._pending), len(self._failed)
        since = self._first_request
        end = self._all_done if not pending else time.monotonic()
        seconds = None if since is None or end is None else round(end - since, 1)
        if pending:
            return KernelStatus("compiling", compiled, pending, failed, seconds)
        return KernelStatus("compiled" if compiled else "eager", compiled, 0, failed, seconds)

    def _from_background(self, function: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        """None (the caller runs the function eagerly) until the background compiler has saved a variant for
        `args` and the watcher has loaded it: the first such call asks for it."""
        request = (function.__name__, variant_key(args))
        if request not in self._pending and request not in self._failed:
            with self._lock:
                if request not in self._pending and request not in self._failed:
                    assert self._compiler is not None
                    variants = self._variants[function.__name__]
                    if variants:
                        logger.info("no compiled %s takes this call (%s): asking for one",
                                    function.__name__, _refusal(variants[0], args))  # fmt: skip
                    self._pending.add(request)
                    self._first_request = self._first_request or time.monotonic()
                    self._compiler.request(*request, args)
                    self._modes[function.__name__] = call_mode()
                    self._watch()
        return _accepting(self._variants[function.__name__], args)[1]

    def _watch(self) -> None:
        """Start the watcher, a thread that loads the compiler's variants every REFRESH_S while requests are
        left (the lock is held)."""
        if self._watcher is None:
            self._watcher = threading.Thread(target=self._watch_loop, name="kernel-watch", daemon=True)
            self._watcher.start()

    def _watch_loop(self) -> None:
        while True:
            time.sleep(REFRESH_S)
            with self._lock:
                self._refresh()
                if not self._pending:
                    self._watcher = None
                    return

    def _refresh(self) -> None:
        """Load the variants saved since (by this process's compiler or another's), and settle the requests
        the compiler is done with: answered (their variant is among those loaded: the compiler saves it
        before it removes the request) or failed. Starts the compiler again where requests are left."""
        self._refreshed = time.monotonic()
        assert self._compiler is not None
        done = {request for request in self._pending if not self._compiler.waiting(*request)}
        for name, function in self._functions.items():
            for path in sorted(self.directory.glob(f"{name}-*.bin")):
                stem = path.stem.removeprefix(f"{name}-")
                if stem not in self._names[name] and path not in self._unloadable:
                    # under the mode of the calls that asked: the loaded guards read tensors through it
                    inference, grad = self._modes.get(name, (False, True))
                    with torch.inference_mode(inference), torch.set_grad_enabled(grad):
                        self._load_variant(function, path, stem)
        for request in sorted(done):
            reason = self._compiler.failure(*request)
            if reason is not None:
                logger.warning(
                    "compiling %s in the background failed: running it eagerly (%s)", request[0], reason
                )
                self._failed.add(request)
        for request in done - self._failed:
            # The compiler says a variant on disk takes this request's arguments; a call that still found
            # none asks again, and after ANSWERS_AT_MOST such answers it runs eagerly for good.
            self._answers[request] = self._answers.get(request, 0) + 1
            if self._answers[request] >= ANSWERS_AT_MOST:
                logger.warning("the compiled %s variants do not take a call's arguments: it runs eagerly",
                               request[0])  # fmt: skip
                self._failed.add(request)
        self._pending -= done
        if self._pending:
            self._compiler.ensure_running()
        if done:
            self._log_progress()

    def _log_progress(self) -> None:
        since = self._first_request or self._refreshed
        compiled = sum(len(variants) for variants in self._variants.values())
        if self._pending:
            logger.info(
                "compiled kernels: %d in use, %d still compiling in the background (%.0f s so far)",
                compiled,
                len(self._pending),
                self._refreshed - since,
            )
            return
        self._all_done = self._refreshed
        logger.info(
            "compiled kernels: all %d in use, %.0f s after the first call asked for one: full speed",
            compiled,
            self._refreshed - since,
        )

    def _to_front(self, name: str, variant: Any) -> None:
        """Check `variant` first from now on (a function's calls meet a few of its variants over and over;
        each check costs about 15 us), unless another thread is changing the list."""
        if self._lock.acquire(blocking=False):
            try:
                self._variants[name] = [
                    variant,
                    *(other for other in self._variants[name] if other is not variant),
                ]
            finally:
                self._lock.release()

    def _load(self, function: Callable[..., Any]) -> list[Any]:
        with self._lock:
            name = function.__name__
            if name in self._variants:
                return self._variants[name]
            self._functions[name] = function
            self._variants[name], self._names[name] = [], set()
            for path in sorted(self.directory.glob(f"{name}-*.bin")):
                self._load_variant(function, path, path.stem.removeprefix(f"{name}-"))
            return self._variants[name]

    def _load_variant(self, function: Callable[..., Any], path: Path, stem: str) -> bool:
        """Add the variant saved at `path` (named `stem`) to `function`'s; False if it does not load."""
        namespace = sys.modules[function.__module__].__dict__
        try:
            with path.open("rb") as file:
                variant: Any = torch.compiler.load_compiled_function(file, f_globals=namespace)
        except Exception:  # noqa: BLE001 - a damaged or foreign file: compiled again if needed
            logger.warning("could not load the compiled %s: skipped", path, exc_info=True)
            self._unloadable.add(path)
            return False
        variant.disable_guard_check()  # `run` checks them itself, once
        self._variants[function.__name__] = [*self._variants[function.__name__], variant]
        self._names[function.__name__].add(stem)
        self.loaded += 1
        return True

    def _compile(self, function: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        variants = self._variants[function.__name__]
        _, meanwhile = _accepting(variants, args)  # another thread may have compiled it
        if meanwhile is not None:
            return meanwhile
        traced: Any = torch.compile(function, dynamic=True, fullgraph=True)
        compiled = traced.aot_compile((args, {}))
        self.directory.mkdir(parents=True, exist_ok=True)
        names = self._names[function.__name__]
        name = variant_name(variant_key(args), names)
        # torch writes it beside and renames it into place: whole or not at all, whichever process writes.
        compiled.save_compiled_function(str(self.directory / f"{function.__name__}-{name}.bin"))
        compiled.disable_guard_check()
        names.add(name)
        self._variants[function.__name__] = [*variants, compiled]
        self.built += 1
        return compiled


def call_mode() -> tuple[bool, bool]:
    """The calling thread's (inference mode, grad mode): a variant's guards, as loaded, depend on both."""
    return torch.is_inference_mode_enabled(), torch.is_grad_enabled()


def _refusal(variant: Any, args: tuple[Any, ...]) -> str:
    """Why `variant`'s guards refuse `args`, in dynamo's words (its private API: a best effort)."""
    try:
        verbose = variant._artifacts.guard_manager.check_verbose(variant.prepare_f_locals(*args))
        return "; ".join(verbose.verbose_code_parts)[:300]
    except Exception as exc:  # noqa: BLE001 - only a log line's detail
        return f"reason unknown: {type(exc).__name__}"


def _accepting(variants: list[Any], args: tuple[Any, ...]) -> tuple[int, Any]:
    """The first of `variants` whose guards accept `args`, and where it stands; (-1, None) if none does."""
    for index, variant in enumerate(variants):
        if variant.guard_check(*args):
            return index, variant
    return -1, None


class KernelStores:
    """The kernels compiled ahead of time that a process has loaded, one `AheadOfTime` per directory, kept
    across engines: a worker that frees its model when idle and loads it again reuses them. Loading them
    again for each new engine kept about 5 MiB more each time (torch holds every loaded variant's runtime
    metadata; docs/journal/voices-and-unload.md, entry 45). `background` is the stores' `AheadOfTime`'s."""

    def __init__(self, *, background: bool = False) -> None:
        self.background = background
        self._stores: dict[Path, AheadOfTime] = {}
        self._lock = threading.Lock()

    def ahead_of_time(self, directory: Path) -> AheadOfTime:
        with self._lock:
            if directory not in self._stores:
                self._stores[directory] = AheadOfTime(directory, background=self.background)
            return self._stores[directory]


def compile_cache_summary(ahead_of_time: AheadOfTime | None = None) -> str:
    """How many compiled graphs this process loaded and how many it built, and where the cache is: the
    variants compiled `ahead_of_time` where given, else inductor's FX-graph cache (torch's own counters)."""
    from torch._dynamo.utils import counters

    where = os.environ.get("TORCHINDUCTOR_CACHE_DIR", "inductor's default")
    if ahead_of_time is None:
        hits, misses = counters["inductor"]["fxgraph_cache_hit"], counters["inductor"]["fxgraph_cache_miss"]
        return f"compiled kernels: {hits} graphs loaded from the cache, {misses} built (cache {where})"
    where += f", compiled ahead of time in {ahead_of_time.directory.name}"
    status = ahead_of_time.status()
    if status.state == "compiling":
        return (
            f"compiled kernels: {ahead_of_time.loaded} graphs loaded from the cache, {status.pending} "
            f"compiling in the background, eager meanwhile (cache {where})"
        )
    return (
        f"compiled kernels: {ahead_of_time.loaded} graphs loaded from the cache, {ahead_of_time.built} built "
        f"(cache {where})"
    )
