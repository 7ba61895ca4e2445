"""The shared engine's protocol: workers' RemoteEngines against one engine process's scheduler (here a
thread running `serve` over a FakeEngine, on a real Unix socket)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest

from api.engine.base import ChunkAudio, EngineError, SynthesisItem
from api.engine.scheduling.entries import FIRST_CHUNK_PRIORITY, LATER_CHUNK_PRIORITY
from api.engine.shared import RemoteEngine
from scripts.harness import engine_process
from tests.fakes import FakeEngine

STYLE = np.zeros(256, dtype=np.float32)


def item(tokens: int, token: int = 5) -> SynthesisItem:
    return SynthesisItem(tokens=(token,) * tokens, style=STYLE, speed=1.0)


def test_a_remote_engine_gets_what_the_engine_makes(tmp_path: Path) -> None:
    engine = FakeEngine(max_batch_size=8, batch_timeout=0.01)
    path = tmp_path / "engine.sock"
    with engine_process(engine, path):
        remote = RemoteEngine(path, connect_timeout=10)
        remote.load()
        assert remote.vocab == engine.vocab
        assert remote.gives_durations
        assert remote.batch_defaults.max_batch_size == 8
        assert remote.batch_defaults.batch_timeout == 0.0  # the engine process waits for company, not it
        ready: list[int] = []
        items = [item(3), item(30), item(12)]
        audio = remote.synthesize(items, on_ready=lambda index, _: ready.append(index))
        remote.close()
    expected = FakeEngine().synthesize(items)
    assert sorted(ready) == [0, 1, 2]
    for got, want in zip(audio, expected, strict=True):
        assert isinstance(got, ChunkAudio)
        np.testing.assert_array_equal(got.samples, want.samples)
        np.testing.assert_array_equal(got.durations, want.durations)


def test_two_workers_are_batched_together(tmp_path: Path) -> None:
    """Chunks handed over by two workers at once go into one engine call."""
    engine = FakeEngine(max_batch_size=8, batch_timeout=1.0)
    path = tmp_path / "engine.sock"
    with engine_process(engine, path):
        workers = [RemoteEngine(path, connect_timeout=10) for _ in range(2)]
        for worker in workers:
            worker.load()
        threads = [
            threading.Thread(target=worker.synthesize, args=([item(10, token=5 + n), item(11, token=5 + n)],))
            for n, worker in enumerate(workers)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)
        for worker in workers:
            worker.close()
    assert [len(batch) for batch in engine.batches] == [4]


def test_a_first_chunk_from_another_worker_goes_ahead_of_later_chunks(tmp_path: Path) -> None:
    """Priorities cross the socket: worker B's first chunk runs before worker A's queued later chunks."""
    engine = FakeEngine(delay=0.5)  # one chunk per call
    path = tmp_path / "engine.sock"
    with engine_process(engine, path):
        a, b = RemoteEngine(path, connect_timeout=10), RemoteEngine(path, connect_timeout=10)
        a.load()
        b.load()
        later = [item(4, token=5), item(4, token=6), item(4, token=7)]
        first = [item(4, token=8)]
        worker_a = threading.Thread(target=a.synthesize_prioritized, args=(later, [LATER_CHUNK_PRIORITY] * 3))
        worker_a.start()
        deadline = time.monotonic() + 10
        while not engine.batches and time.monotonic() < deadline:  # A's first chunk is running...
            time.sleep(0.01)
        time.sleep(0.05)  # ...and its other two are queued
        b.synthesize_prioritized(first, [FIRST_CHUNK_PRIORITY])
        worker_a.join(10)
        a.close()
        b.close()
    assert [call.tokens[0] for call in engine.calls] == [5, 8, 6, 7]


def test_a_failing_chunk_fails_the_call_and_the_others_still_arrive(tmp_path: Path) -> None:
    engine = FakeEngine(fail_token=7)
    path = tmp_path / "engine.sock"
    with engine_process(engine, path):
        remote = RemoteEngine(path, connect_timeout=10)
        remote.load()
        ready: list[int] = []
        with pytest.raises(EngineError, match="1 of 2 chunks.*fake engine failure"):
            remote.synthesize([item(4), item(4, token=7)], on_ready=lambda index, _: ready.append(index))
        assert ready == [0]
        assert len(remote.synthesize([item(6)])) == 1  # the connection is still in step
        remote.close()


def test_no_engine_process_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(EngineError, match="no engine process answered"):
        RemoteEngine(tmp_path / "missing.sock", connect_timeout=0.5).load()


@pytest.mark.parametrize(("calls", "batches"), [(1, [1, 1, 1]), (3, [3])])
def test_a_worker_keeps_several_calls_in_flight(tmp_path: Path, calls: int, batches: list[int]) -> None:
    """Three calls from one worker at once: with one connection they reach the engine process one after
    another (each waits for the last to be answered); with three, its scheduler batches them together."""
    engine = FakeEngine(max_batch_size=8, batch_timeout=0.5)
    path = tmp_path / "engine.sock"
    with engine_process(engine, path):
        remote = RemoteEngine(path, calls=calls, connect_timeout=10)
        remote.load()
        assert remote.lanes == calls
        assert not remote.pooled_threads
        results: list[list[ChunkAudio]] = []
        threads = [
            threading.Thread(target=lambda n=n: results.append(remote.synthesize([item(8, token=5 + n)])))
            for n in range(3)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)
        remote.close()
    assert [len(batch) for batch in engine.batches] == batches
    assert sorted(len(audio) for audio in results) == [1, 1, 1]


def test_a_broken_connection_is_replaced_at_the_next_call(tmp_path: Path) -> None:
    engine = FakeEngine()
    path = tmp_path / "engine.sock"
    with engine_process(engine, path):
        remote = RemoteEngine(path, calls=1, connect_timeout=10)
        remote.load()
        remote.close()  # every open connection goes, as when the engine process drops one
        with pytest.raises(EngineError, match="connection to the engine process failed"):
            remote.synthesize([item(4)])
        assert len(remote.synthesize([item(5)])) == 1
        remote.close()
