"""The background compiler's requests: files of a call's arguments in DIRECTORY/requests, which the child
process `python -m api.engine.compile_worker DIRECTORY` compiles into variants where `AheadOfTime` loads
them (api/engine/compiled.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

# The background compiler's requests (the arguments of a call that found no variant) and its failures.
REQUESTS = "requests"
FAILED_SUFFIX = ".failed"


class BackgroundCompiler:
    """Compiles the variants calls ask for in a child process, `python -m api.engine.compile_worker
    DIRECTORY` (api/engine/compile_worker.py): each request is a file of a call's arguments in
    DIRECTORY/requests, and the child saves each variant where `AheadOfTime` loads it. A process of its own,
    at a lower priority, because tracing and inductor's code generation are Python: in a thread they would
    hold this process's GIL for tens of seconds at a time, and an eager call, which needs it between every
    two of its thousands of operations, would wait for it. One child per directory works at a time (a lock
    file), whichever worker process asked; it ends when no request is left, or when its parent ends."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def requests(self) -> Path:
        return self.directory / REQUESTS

    def request(self, function: str, key: str, args: tuple[Any, ...]) -> None:
        """Ask for the variant of `function` that `args` need (`key` is its `variant_key`), then make sure
        the child runs."""
        self.requests.mkdir(parents=True, exist_ok=True)
        path = self.requests / f"{function}-{key}.pt"
        path.with_suffix(FAILED_SUFFIX).unlink(missing_ok=True)  # a new start tries again
        request = {
            "function": function,
            "threads": torch.get_num_threads(),
            "grad": torch.is_grad_enabled(),
            "inference": torch.is_inference_mode_enabled(),
            "args": tuple(portable(arg) for arg in args),
        }
        partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
        torch.save(request, partial)
        partial.replace(path)
        self.ensure_running()

    def waiting(self, function: str, key: str) -> bool:
        """Whether that request is still the compiler's to do."""
        return (self.requests / f"{function}-{key}.pt").exists()

    def failure(self, function: str, key: str) -> str | None:
        """Why the child could not compile that variant, None if it has not failed."""
        try:
            return (self.requests / f"{function}-{key}{FAILED_SUFFIX}").read_text(errors="replace").strip()
        except FileNotFoundError:
            return None

    def ensure_running(self) -> None:
        if self._process is not None and self._process.poll() is None:
            return
        # One inductor compile thread: the calls beside it keep the other cores.
        env = {**os.environ, "TORCHINDUCTOR_COMPILE_THREADS": "1"}
        command = [sys.executable, "-m", "api.engine.compile_worker", str(self.directory)]
        self._process = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL)


def portable(arg: Any) -> Any:
    """What a compile request holds of a call's argument: a tensor as dynamo's guards see it (`rebuilt` makes
    it again), anything else as it is. The guards read a tensor's sizes, strides and storage offset (a plain
    clone makes a view with gaps contiguous), whether it is a view and its base's (they read a view's base),
    and whether it is an inference tensor: a variant compiled for a copy that differed would not take the
    calls it was compiled for (they ran eagerly for good)."""
    if not isinstance(arg, Tensor):
        return arg
    base = arg._base
    view = None
    if base is not None:
        view = (tuple(arg.shape), tuple(arg.stride()), arg.storage_offset() - base.storage_offset())
    root = arg if base is None else base
    return {"tensor": _dense_copy(root), "view": view, "inference": arg.is_inference()}


def rebuilt(arg: Any) -> Any:
    """The argument `portable` made of a call's, as the call had it."""
    if not isinstance(arg, dict):
        return arg
    with torch.inference_mode(arg["inference"]):
        root = _dense_copy(arg["tensor"])
        if arg["view"] is None:
            return root
        shape, stride, offset = arg["view"]
        return root.as_strided(shape, stride, root.storage_offset() + offset)


def _dense_copy(tensor: Tensor) -> Tensor:
    """A tensor of its own (no view) with `tensor`'s sizes, strides, offset and values."""
    if tensor.storage_offset() == 0:
        copy = torch.empty_strided(tensor.shape, tensor.stride(), dtype=tensor.dtype, device=tensor.device)
        return copy.copy_(tensor.detach())
    extent = 1 + sum((size - 1) * stride for size, stride in zip(tensor.shape, tensor.stride(), strict=True))
    storage = torch.empty(tensor.storage_offset() + extent, dtype=tensor.dtype, device=tensor.device)
    copy = torch.empty(0, dtype=tensor.dtype, device=tensor.device)
    copy.set_(storage.untyped_storage(), tensor.storage_offset(), tensor.shape, tensor.stride())
    return copy.copy_(tensor.detach())
