"""The README's two commands on a Python other than this machine's: in a Debian root file system made by
debootstrap (trixie: Python 3.13, Debian's own python3), as a newcomer on that system would run them.

1. root: `debootstrap --variant=minbase SUITE` with python3, python3-venv, ca-certificates, procps and git
   (the rest, g++ and the Python headers among it, is what scripts/setup.sh itself installs), apt reading this
   machine's Debian sources; this machine's CA bundle in it (the registries' TLS goes through it here).
2. a clone of this repository's HEAD in the root, and the weights copied into the root's cache (the hub,
   where a fresh machine gets them, is not reachable here; the registry source needs npm, which the root
   does not have): `bash scripts/serve.sh` run in a chroot until `/ready` answers 200 (the install's and the
   start's times from its log), then speech that whisper tiny.en hears (the sentences and word error rate of
   tests/integration/test_intelligibility.py), run from this machine's .venv against the server in the chroot.
3. `bash scripts/test.sh tests/unit` (lint, mypy, the unit tests) in the chroot; with --suite-tests, the whole
   `bash scripts/test.sh`.

The report (--out, JSON) has this machine's block, the root's interpreter and each step's time and result.
Needs root, debootstrap (apt-get install debootstrap) and about 15 GB of disk (PyPI's torch for Python 3.13 is
its CUDA build, with its nvidia-* wheels). Run from this repository's .venv:

    .venv/bin/python -m scripts.images.check_python --out bench-results/<machine>/python-3.13-debian13.json
    .venv/bin/python -m scripts.images.check_python --host-python python3.10 --out .../python-3.10.json
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scripts.bench.common import Report
from scripts.harness import Server, free_port, wait_ready
from scripts.images.check_images import apt_sources, debian_mirror

ROOT = Path(__file__).resolve().parents[2]

ROOT_PACKAGES = ("python3", "python3-venv", "ca-certificates", "procps", "git")
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
WEIGHTS = Path.home() / ".cache" / "kokoro-openai-server" / "Kokoro-82M"
CHECKOUT = "/opt/kokoro-openai-server"
# What a newcomer's shell has, plus where this machine's CA bundle is (every client reads one of these).
CHROOT_ENV = {
    "HOME": "/root",
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LANG": "C.UTF-8",
    "SSL_CERT_FILE": str(CA_BUNDLE),
    "PIP_CERT": str(CA_BUNDLE),
    "REQUESTS_CA_BUNDLE": str(CA_BUNDLE),
    "HF_HUB_OFFLINE": "1",
}
MOUNTS = ("proc", "sys", "dev", "dev/pts")
SERVE_TIMEOUT_S = 3600.0


def make_root(root: Path, suite: str) -> float:
    """A Debian `suite` root at `root` (kept when it is there already); returns the seconds it took."""
    if (root / "usr/bin/python3").exists():
        return 0.0
    began = time.monotonic()
    sources = apt_sources()
    command = ["debootstrap", "--variant=minbase", f"--include={','.join(ROOT_PACKAGES)}", suite, str(root)]
    subprocess.run([*command, debian_mirror(sources)], check=True)
    return round(time.monotonic() - began, 1)


def prepare(root: Path, suite: str) -> None:
    """apt's sources for `suite`, this machine's CA bundle, the repository's HEAD and the weights."""
    (root / "etc/apt/sources.list").write_text(
        f"deb {debian_mirror(apt_sources())} {suite} main\n", encoding="utf-8"
    )
    shutil.copy(CA_BUNDLE, root / str(CA_BUNDLE).lstrip("/"))
    checkout = root / CHECKOUT.lstrip("/")
    shutil.rmtree(checkout, ignore_errors=True)
    subprocess.run(["git", "clone", "-q", str(ROOT), str(checkout)], check=True)
    weights = root / "root/.cache/kokoro-openai-server/Kokoro-82M"
    if not weights.exists():
        shutil.copytree(WEIGHTS, weights, ignore=shutil.ignore_patterns("*.onnx"))


@contextlib.contextmanager
def mounted(root: Path) -> Iterator[None]:
    done = []
    try:
        for name in MOUNTS:
            target = root / name
            target.mkdir(parents=True, exist_ok=True)
            subprocess.run(["mount", "--bind", f"/{name}", str(target)], check=True)
            done.append(target)
        yield
    finally:
        for target in reversed(done):
            subprocess.run(["umount", "-l", str(target)], check=False)


@dataclass(frozen=True)
class Place:
    """Where the commands run: in a chroot of `root` (its checkout at CHECKOUT), or on this machine in a
    clone at `checkout` with `python` as PYTHON."""

    root: Path | None
    checkout: Path
    python: str | None = None

    def command(self, command: str, python: bool = True) -> list[str]:
        """`command` there; on this machine with PYTHON set when `python` (the tests would pass it on to
        what they start: it is only setup.sh's)."""
        if self.root is None:
            chosen = f"PYTHON={self.python} " if python else ""
            return ["bash", "-c", f"cd {self.checkout} && {chosen}{command}"]
        exports = [f"{key}={value}" for key, value in CHROOT_ENV.items()]
        inner = f"cd {CHECKOUT} && {command}"
        return ["chroot", str(self.root), "/usr/bin/env", "-i", *exports, "bash", "-c", inner]

    def interpreter(self) -> str:
        python = ["chroot", str(self.root), "python3"] if self.root is not None else [str(self.python)]
        return subprocess.run([*python, "--version"], capture_output=True, text=True).stdout.strip()


def serve(place: Place, log_path: Path) -> dict[str, Any]:
    """`bash scripts/serve.sh` there until `/ready`, then the speech whisper hears."""
    from scripts.images.check_images import hear

    port = free_port()
    began = time.monotonic()
    command = place.command(f"bash scripts/serve.sh --host 127.0.0.1 --port {port}")
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    server = Server(f"http://127.0.0.1:{port}", log_path, process)
    try:
        wait_ready(server, SERVE_TIMEOUT_S, compiled=False)
        ready_s = round(time.monotonic() - began, 1)
        heard = hear(server)
        wait_ready(server, SERVE_TIMEOUT_S)  # the kernels compiled in the background: full speed
        said = lines(server.log_tail(), "setup:", "engine", "compiled kernels", "torch precision")
        return {"ready_s": ready_s, "full_speed_s": round(time.monotonic() - began, 1), **heard, "log": said}
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, 15)
        process.wait(60)


def lines(text: str, *markers: str) -> list[str]:
    return [line for line in text.splitlines() if any(marker in line for marker in markers)][-40:]


def tests(place: Place, arguments: Sequence[str], log_path: Path) -> dict[str, Any]:
    began = time.monotonic()
    command = place.command(" ".join(["bash", "scripts/test.sh", *arguments]), python=False)
    with log_path.open("wb") as log:
        done = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, check=False)
    text = log_path.read_text(errors="replace")
    summary = [
        line for line in text.splitlines() if " passed" in line or " failed" in line or "error" in line
    ]
    return {"command": f"bash scripts/test.sh {' '.join(arguments)}".strip(), "returncode": done.returncode,
            "passed": done.returncode == 0, "seconds": round(time.monotonic() - began, 1),
            "summary": summary[-10:]}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--root", type=Path, default=Path("/var/tmp/kokoro-debian-root"), help="the root file system"
    )
    parser.add_argument("--suite", default="trixie", help="Debian suite (default trixie: Python 3.13)")
    parser.add_argument(
        "--host-python", help="instead of a root: this machine, a clone of HEAD, PYTHON=this interpreter"
    )
    parser.add_argument(
        "--suite-tests", action="store_true", help="the whole test command, not the unit tests only"
    )
    parser.add_argument("--logs", type=Path, default=Path("/tmp/kokoro-check-python"), help="logs directory")
    parser.add_argument("--out", type=Path, required=True, help="JSON report")
    args = parser.parse_args()
    args.logs.mkdir(parents=True, exist_ok=True)
    written = Report(args, benchmark="python")
    report: dict[str, Any] = {}
    with contextlib.ExitStack() as stack:
        if args.host_python:
            checkout = (
                Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="kokoro-python-"))) / "repo"
            )
            subprocess.run(["git", "clone", "-q", str(ROOT), str(checkout)], check=True)
            place = Place(None, checkout, args.host_python)
        else:
            report["root_s"] = make_root(args.root, args.suite)
            prepare(args.root, args.suite)
            place = Place(args.root, args.root / CHECKOUT.lstrip("/"))
            stack.enter_context(mounted(args.root))
        report["interpreter"] = place.interpreter()
        print(f"interpreter: {report['interpreter']}", flush=True)
        report["serve"] = serve(place, args.logs / "serve.log")
        print(f"serve: ready in {report['serve']['ready_s']} s, WER {report['serve']['wer']}", flush=True)
        report["tests"] = tests(place, [] if args.suite_tests else ["tests/unit"], args.logs / "tests.log")
        print(f"tests: {report['tests']['summary'][-1:]} in {report['tests']['seconds']} s", flush=True)
    written.write(report)


if __name__ == "__main__":
    main()
