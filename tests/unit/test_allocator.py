"""The allocator `python -m api` starts under, and when the torch engine gives freed memory back."""

from __future__ import annotations

import threading
import time

import pytest

from api.engine.allocator import (
    PRELOAD_ENV,
    TRIED_ENV,
    AllocatorError,
    describe_allocator,
    preload_environment,
    tcmalloc_loaded,
)
from api.engine.memory import CallMemory

LIBRARY = "libtcmalloc_minimal.so.4"


def environment(
    allocator: str,
    environ: dict[str, str],
    *,
    engine: str = "torch",
    loaded: bool = False,
    found: str | None = LIBRARY,
) -> dict[str, str] | None:
    return preload_environment(
        allocator,  # type: ignore[arg-type]
        environ,
        engine=engine,
        loaded=lambda: loaded,
        find=lambda: found,
    )


def test_auto_starts_again_under_tcmalloc_where_it_is_installed() -> None:
    env = environment("auto", {"PATH": "/usr/bin"})
    assert env == {"PATH": "/usr/bin", PRELOAD_ENV: LIBRARY, TRIED_ENV: "1"}


def test_a_preload_of_the_users_own_is_kept_after_tcmalloc() -> None:
    env = environment("tcmalloc", {PRELOAD_ENV: "/opt/libother.so"})
    assert env is not None
    assert env[PRELOAD_ENV] == f"{LIBRARY} /opt/libother.so"


@pytest.mark.parametrize("allocator", ["auto", "tcmalloc", "system"])
def test_a_process_already_under_tcmalloc_goes_on(allocator: str) -> None:
    assert environment(allocator, {}, loaded=True) is None


def test_auto_leaves_an_allocator_the_user_preloaded_but_tcmalloc_replaces_it() -> None:
    preloaded = {PRELOAD_ENV: "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"}
    assert environment("auto", preloaded) is None
    env = environment("tcmalloc", preloaded)
    assert env is not None
    assert env[PRELOAD_ENV].split()[0] == LIBRARY


def test_auto_keeps_malloc_for_the_onnx_engine_but_tcmalloc_overrides_that() -> None:
    assert environment("auto", {}, engine="onnx") is None
    assert environment("auto", {}, engine="torch")
    assert environment("tcmalloc", {}, engine="onnx")


def test_system_keeps_the_c_librarys_malloc() -> None:
    assert environment("system", {}) is None


def test_auto_without_tcmalloc_goes_on_with_malloc() -> None:
    assert environment("auto", {}, found=None) is None


def test_asking_for_tcmalloc_where_it_is_missing_is_an_error_that_says_how_to_install_it() -> None:
    with pytest.raises(AllocatorError, match="libtcmalloc-minimal4"):
        environment("tcmalloc", {}, found=None)


def test_a_refused_preload_does_not_start_the_server_again_and_again() -> None:
    # The first start set TRIED_ENV; tcmalloc is still not in use, so the loader refused it.
    assert environment("auto", {TRIED_ENV: "1", PRELOAD_ENV: LIBRARY}) is None
    with pytest.raises(AllocatorError, match="not in use"):
        environment("tcmalloc", {TRIED_ENV: "1", PRELOAD_ENV: LIBRARY})


@pytest.mark.skipif(tcmalloc_loaded(), reason="this test process itself runs under tcmalloc")
@pytest.mark.parametrize(
    ("allocator", "environ", "line"),
    [
        ("auto", {}, "allocator: the C library's malloc (tcmalloc is not installed"),
        ("system", {}, "allocator: the C library's malloc (KOKORO_ALLOCATOR=system)"),
        ("auto", {"KOKORO_ENGINE": "onnx"}, "malloc (the onnx engine: ONNX Runtime keeps its own arena)"),
        ("auto", {PRELOAD_ENV: "/lib/libjemalloc.so.2"}, "allocator: /lib/libjemalloc.so.2 (LD_PRELOAD)"),
        ("auto", {PRELOAD_ENV: LIBRARY, TRIED_ENV: "1"}, f"malloc (the loader did not take {LIBRARY})"),
    ],
)
def test_the_log_says_which_allocator_runs_and_why(
    allocator: str, environ: dict[str, str], line: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in (PRELOAD_ENV, TRIED_ENV):
        monkeypatch.delenv(name, raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    engine = environ.get("KOKORO_ENGINE", "auto")
    assert line in describe_allocator(allocator, engine)  # type: ignore[arg-type]


class Releases:
    def __init__(self) -> None:
        self.count = 0
        self.done = threading.Event()

    def __call__(self) -> None:
        self.count += 1
        self.done.set()


def test_without_reuse_memory_goes_back_after_every_call_even_beside_another() -> None:
    releases = Releases()
    memory = CallMemory(reuses=False, release=releases)
    memory.started()
    memory.started()
    memory.ended()
    assert releases.count == 1
    memory.ended()
    assert releases.count == 2


def test_with_reuse_memory_goes_back_once_the_engine_has_been_idle() -> None:
    releases = Releases()
    memory = CallMemory(reuses=True, idle_s=0.05, release=releases)
    memory.started()
    memory.started()
    memory.ended()
    time.sleep(0.2)
    assert releases.count == 0  # a call is still running
    memory.ended()
    assert releases.done.wait(5)
    assert releases.count == 1


def test_with_reuse_a_call_within_the_idle_time_starts_it_again() -> None:
    releases = Releases()
    memory = CallMemory(reuses=True, idle_s=0.3, release=releases)
    memory.started()
    memory.ended()
    memory.started()  # the next call comes and goes before the idle time is over
    memory.ended()
    assert releases.done.wait(5)
    time.sleep(0.6)
    assert releases.count == 1  # the first idle period's timer found a later one and did not release


def test_the_idle_time_cannot_be_negative() -> None:
    with pytest.raises(ValueError, match="idle_s"):
        CallMemory(reuses=True, idle_s=-1)
