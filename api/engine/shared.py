"""One engine for several worker processes: the engine process's loop, and each worker's proxy to it.

With `KOKORO_SHARED_ENGINE=true` and more than one worker, `python -m api` starts one engine process
(api/server/engine_process.py, which runs `serve`) beside the uvicorn workers. The engine process loads the
model once and runs the one scheduler that forms its batches; each worker's engine is a `RemoteEngine` that
sends the chunks its own scheduler hands it, with their priorities, over a Unix socket and hears of each
chunk's audio as soon as it exists. On a GPU, per-worker engines time-share the device with a quarter of the
clients' chunks each; one engine forms its batches over all of them (docs/journal/gpu.md, entry 13).

Frames on the socket: a 4-byte big-endian length, then a pickle. The socket lives in a directory made by
`tempfile.mkdtemp` (mode 0700), so only this user's processes reach it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import pickle
import queue
import signal
import socket
import struct
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from api.engine.base import SAMPLE_RATE, BatchPolicy, ChunkAudio, EngineError, ReadyCallback, SynthesisItem
from api.engine.scheduling.entries import LATER_CHUNK_PRIORITY
from api.engine.scheduling.lifecycle import EngineState
from api.engine.scheduling.scheduler import Scheduler

logger = logging.getLogger(__name__)

SOCKET_ENV = "KOKORO_ENGINE_SOCKET"
HEADER = struct.Struct("!I")
# How long a worker waits for the engine process to load its model and answer (a GPU compiles kernels).
CONNECT_TIMEOUT_S = 900.0
# Calls a worker keeps in flight to the engine process (KOKORO_SHARED_ENGINE_CALLS): with one, a worker
# handed over its next chunks only once every chunk of its previous call was done, and the engine process
# saw at most one call per worker (docs/journal/gpu.md, entry 13).
DEFAULT_CALLS = 8


# --- framing -------------------------------------------------------------------------------------------


def encode(message: Any) -> bytes:
    body = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return HEADER.pack(len(body)) + body


async def read_message(reader: asyncio.StreamReader) -> Any:
    """The next message, or None once the peer has closed the connection."""
    try:
        header = await reader.readexactly(HEADER.size)
        return pickle.loads(await reader.readexactly(HEADER.unpack(header)[0]))  # noqa: S301 - own socket
    except asyncio.IncompleteReadError:
        return None


def receive(sock: socket.socket) -> Any:
    (length,) = HEADER.unpack(_exactly(sock, HEADER.size))
    return pickle.loads(_exactly(sock, length))  # noqa: S301 - our own engine process, a private socket


def _exactly(sock: socket.socket, size: int) -> bytes:
    buffer = bytearray(size)
    view = memoryview(buffer)
    while view:
        count = sock.recv_into(view)
        if count == 0:
            raise EngineError("the engine process closed the connection")
        view = view[count:]
    return bytes(buffer)


# --- the worker's side ----------------------------------------------------------------------------------


class RemoteEngine:
    """A worker's engine: the engine process's model, reached over its socket. The worker's scheduler keeps
    up to `calls` calls in flight (its lanes), each on a connection of its own, so a worker hands over new
    chunks while its earlier ones are still in the engine process; there the one scheduler batches the
    chunks of every worker together."""

    def __init__(
        self, socket_path: Path, *, calls: int = DEFAULT_CALLS, connect_timeout: float = CONNECT_TIMEOUT_S
    ) -> None:
        if calls < 1:
            raise ValueError(f"calls must be at least 1, got {calls}")
        self.socket_path = socket_path
        self.calls = calls
        self.connect_timeout = connect_timeout
        self.name = "shared"
        self.sample_rate = SAMPLE_RATE
        self._hello: dict[str, Any] = {}
        self._idle: queue.SimpleQueue[socket.socket | None] = queue.SimpleQueue()
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()

    @property
    def vocab(self) -> Mapping[str, int]:
        return self._hello.get("vocab", {})  # type: ignore[no-any-return]

    @property
    def gives_durations(self) -> bool:
        return bool(self._hello.get("gives_durations", False))

    @property
    def lanes(self) -> int:
        return self.calls

    @property
    def pooled_threads(self) -> bool:
        return False  # a lane only waits on its own connection

    def claim_threads(self, every_thread: bool) -> None:
        return None

    @property
    def batch_defaults(self) -> BatchPolicy:
        """Hand every queued chunk over at once, without waiting for company: the engine process forms the
        batches (by its own policy) over all the workers' chunks."""
        engine: BatchPolicy = self._hello["policy"]
        return replace(
            engine,
            batch_timeout=0.0,
            busy_timeout=0.0,
            max_batch_tokens=engine.max_batch_tokens * 4,
            length_ratio=1e9,
            launch_tokens=0,
        )

    def load(self) -> None:
        """Connect (the engine process may still be starting) and read its description once it is ready;
        the other connections open when the first call needs them."""
        sock = self._connect(deadline=time.monotonic() + self.connect_timeout)
        self.name = f"{self._hello['name']} (shared)"
        self.sample_rate = int(self._hello["sample_rate"])
        self._idle.put(sock)
        for _ in range(self.calls - 1):
            self._idle.put(None)
        logger.info(
            "engine: the shared %s engine process at %s, up to %d calls in flight",
            self._hello["name"],
            self.socket_path,
            self.calls,
        )

    def _connect(self, deadline: float) -> socket.socket:
        while True:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(str(self.socket_path))
                break
            except OSError as exc:
                sock.close()
                if time.monotonic() > deadline:
                    raise EngineError(f"no engine process answered at {self.socket_path}: {exc}") from exc
                time.sleep(0.5)
        self._hello = receive(sock)
        with self._lock:
            self._open.add(sock)
        return sock

    def close(self) -> None:
        with self._lock:
            for sock in self._open:
                sock.close()
            self._open.clear()

    def synthesize(
        self, items: Sequence[SynthesisItem], on_ready: ReadyCallback | None = None
    ) -> list[ChunkAudio]:
        return self.synthesize_prioritized(items, [LATER_CHUNK_PRIORITY] * len(items), on_ready)

    def synthesize_prioritized(
        self, items: Sequence[SynthesisItem], priorities: Sequence[int], on_ready: ReadyCallback | None = None
    ) -> list[ChunkAudio]:
        """The chunks go to the engine process's queue with their priorities: there, too, a request's first
        chunk goes ahead of later chunks, whichever worker they came from."""
        if not self._hello:
            raise EngineError("the engine is not loaded")
        sock = self._idle.get()
        try:
            if sock is None:  # a lane's first call, or one after its connection broke
                sock = self._connect(deadline=time.monotonic())
            results, errors = self._exchange(sock, items, priorities, on_ready)
        except BaseException as exc:
            if sock is not None:
                with self._lock:
                    self._open.discard(sock)
                sock.close()
            self._idle.put(None)  # the next call on this lane connects again
            if isinstance(exc, OSError):
                raise EngineError(f"the connection to the engine process failed: {exc}") from exc
            raise
        self._idle.put(sock)
        if errors:
            raise EngineError(f"the engine process failed {len(errors)} of {len(items)} chunks: {errors[0]}")
        return [results[index] for index in range(len(items))]

    def _exchange(
        self,
        sock: socket.socket,
        items: Sequence[SynthesisItem],
        priorities: Sequence[int],
        on_ready: ReadyCallback | None,
    ) -> tuple[dict[int, ChunkAudio], list[str]]:
        """Send one call and read its answers (each chunk's audio or error, in the order they are done)."""
        sock.sendall(encode((list(items), list(priorities))))
        results: dict[int, ChunkAudio] = {}
        errors: list[str] = []
        for _ in items:
            index, audio, error = receive(sock)
            if error is not None:
                errors.append(error)
                continue
            results[index] = audio
            if on_ready is not None:
                on_ready(index, audio)
        return results, errors


# --- the engine process -----------------------------------------------------------------------------------


async def serve(scheduler: Scheduler, socket_path: Path, *, ready_timeout: float = CONNECT_TIMEOUT_S) -> None:
    """Run `scheduler` (its engine not yet loaded) and answer workers on `socket_path` until cancelled."""
    scheduler.start()
    deadline = time.monotonic() + ready_timeout
    while scheduler.state is EngineState.STARTING and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    if scheduler.state is not EngineState.READY:
        raise EngineError(f"the engine did not become ready: {scheduler.failure or scheduler.state.value}")
    engine = scheduler.engine
    hello = {
        "name": engine.name,
        "sample_rate": engine.sample_rate,
        "vocab": dict(engine.vocab),
        "gives_durations": engine.gives_durations,
        "policy": scheduler.policy,
    }
    calls = 0

    async def settle(index: int, future: asyncio.Future[ChunkAudio]) -> tuple[int, Any, str | None]:
        try:
            return index, await future, None
        except Exception as exc:  # noqa: BLE001 - passed on to the worker, whose scheduler splits the batch
            return index, None, f"{type(exc).__name__}: {exc}"

    async def worker(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal calls
        writer.write(encode(hello))
        while (message := await read_message(reader)) is not None:
            calls += 1
            items, priorities = message
            pending = []
            for index, (item, priority) in enumerate(zip(items, priorities, strict=True)):
                try:  # queued in the worker's order: equal priorities run first come, first served
                    future = scheduler.submit(item, f"shared-{calls}", priority=priority)
                except Exception as exc:  # noqa: BLE001 - a full queue: the worker hears of it
                    writer.write(encode((index, None, f"{type(exc).__name__}: {exc}")))
                    continue
                pending.append(settle(index, future))
            for done in asyncio.as_completed(pending):
                writer.write(encode(await done))
                await writer.drain()
        writer.close()

    server = await asyncio.start_unix_server(worker, path=str(socket_path))
    logger.info("shared engine: %s ready at %s", engine.name, socket_path)
    try:
        async with server:
            await server.serve_forever()
    finally:
        scheduler.stop()


def serve_until_stopped(scheduler: Scheduler, socket_path: Path) -> None:
    """`serve` on a new event loop until SIGTERM or SIGINT: an engine process's whole life."""

    async def run() -> None:
        task = asyncio.current_task()
        assert task is not None
        for signum in (signal.SIGTERM, signal.SIGINT):
            asyncio.get_running_loop().add_signal_handler(signum, task.cancel)
        with contextlib.suppress(asyncio.CancelledError):
            await serve(scheduler, socket_path)

    asyncio.run(run())
