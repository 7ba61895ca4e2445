"""Compiled kernels persist across starts under KOKORO_COMPILE_CACHE_DIR, keyed so that a cache made at
another CPU dispatch level is never loaded (api/engine/kernels.py's docstring says why)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from api.engine.compile_cache import COMPILE_CACHE_ENV, DEFAULT_COMPILE_CACHE_DIR
from api.settings import Settings

ROOT = Path(__file__).resolve().parents[2]

# One start of the kernels in a fresh process: PreparedKernels chooses the cache directory, one fused
# function compiles (or loads) and runs, and torch's compile counters say which.
START = """
import json, os, torch
from torch._dynamo.utils import counters
from api.engine.kernels import PreparedKernels
kernels = PreparedKernels(torch.nn.Sequential(), compile=True)
x, h = torch.randn(1, 4, 30), torch.randn(1, 8)
w, b, a = torch.ones(4), torch.zeros(4), torch.full((1, 4, 1), 0.7)
kernels._norm_snake(x, None, h, w, b, a, 1e-5, torch.float32)
store = kernels.ahead_of_time
print(json.dumps({"dir": os.environ["TORCHINDUCTOR_CACHE_DIR"], "variants": sorted(
    path.name for path in store.directory.iterdir()), "loaded": store.loaded, "built": store.built,
    **counters["inductor"], **counters["stats"]}))
"""


def start(cache_root: Path) -> dict[str, Any]:
    env = {key: value for key, value in os.environ.items() if key != "TORCHINDUCTOR_CACHE_DIR"}
    env[COMPILE_CACHE_ENV] = str(cache_root)
    done = subprocess.run(
        [sys.executable, "-c", START], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_a_second_start_loads_the_kernels_from_the_cache(tmp_path: Path) -> None:
    first, second = start(tmp_path), start(tmp_path)
    assert Path(first["dir"]).parent == tmp_path
    assert (first["loaded"], first["built"]) == (0, 1)
    assert first.get("unique_graphs", 0) == 1
    assert [name.split("-")[0] for name in first["variants"]] == ["norm_snake"]
    assert second["dir"] == first["dir"]
    # The variant compiled ahead of time is loaded whole: dynamo traces nothing and inductor builds nothing.
    assert (second["loaded"], second["built"]) == (1, 0)
    assert second["variants"] == first["variants"]
    assert second.get("unique_graphs", 0) == 0
    assert second.get("fxgraph_cache_miss", 0) == 0
    # A process at another dispatch level is given another directory under the same root, so it cannot load
    # these kernels: tests/unit/test_kernels.py checks that without compiling (a third start here compiled
    # again for 20 s to show the same).


def test_the_setting_and_the_kernels_agree_on_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(COMPILE_CACHE_ENV, raising=False)
    assert Settings().compile_cache_dir == DEFAULT_COMPILE_CACHE_DIR


# A start whose store compiles in the background: the first call runs eagerly and asks the child process for
# the variant; the same call, repeated, takes the compiled variant once the watcher has loaded it. x is a view
# with gaps, as a convolution's trimmed output is, and the weights are a module's parameters: the child must
# compile for tensors its guards see as the call's.
BACKGROUND_START = """
import json, logging, sys, time, torch
from pathlib import Path
from api.engine.compiled import AheadOfTime, Fused
from api.engine.fused import norm_snake
logging.basicConfig(level=logging.INFO)
store = AheadOfTime(Path(sys.argv[1]), background=True)
fused = Fused(norm_snake, compile=True, store=store)
weights = [torch.nn.Parameter(value) for value in (torch.ones(4), torch.zeros(4), torch.full((1, 4, 1), 0.7))]
states, began = [], time.monotonic()
with torch.inference_mode():  # as the engine calls the kernels: activations made here, parameters detached
    x, h = torch.randn(1, 4, 40)[..., :30], torch.randn(1, 8)
    w, b, a = (weight.detach() for weight in weights)
    want = norm_snake(x, None, h, w, b, a, 1e-5, torch.float32)
    while time.monotonic() - began < 240 and (not states or states[-1] != "compiled"):
        assert torch.allclose(fused(x, None, h, w, b, a, 1e-5, torch.float32), want, atol=1e-5)
        states.append(store.status().state)
        time.sleep(0.2)
print(json.dumps({"states": states, "loaded": store.loaded, "built": store.built,
    "failed": store.status().failed, "files": sorted(path.name for path in store.directory.iterdir())}))
"""


def test_kernels_compile_in_the_background_and_take_over(tmp_path: Path) -> None:
    """No call waits on a compile: the calls run eagerly (the same values) while a child process compiles,
    then the compiled variant takes over in the same process; the next start loads it at once."""
    store = tmp_path / "ahead-of-time"
    command = [sys.executable, "-c", BACKGROUND_START, str(store)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    first = json.loads(done.stdout.strip().splitlines()[-1])
    assert first["states"][0] == "compiling"
    assert first["states"][-1] == "compiled"
    # built by the child, loaded by this process; the request settled and nothing failed
    assert (first["loaded"], first["built"], first["failed"]) == (1, 0, 0)
    assert [name.split("-")[0] for name in first["files"] if name.endswith(".bin")] == ["norm_snake"]
    assert sorted((store / "requests").iterdir()) == []
    assert "compiled kernels: all 1 in use" in done.stderr
    again = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    second = json.loads(again.stdout.strip().splitlines()[-1])
    assert second["states"] == ["compiled"]
    assert (second["loaded"], second["built"]) == (1, 0)
