"""Builds Dockerfile.cpu and Dockerfile.gpu and starts the CPU image, on a machine without a Docker engine
and without an image registry (the project's machines; docs/testing.md, "The images"):

1. base: a Python 3.11 image made from Debian bookworm's packages (debootstrap: python3, python3-venv,
   python3-dev, ca-certificates; apt set up with this machine's Debian sources), standing in for
   `python:3.11-slim-bookworm`, which cannot be pulled here. Made once, kept as BASE_IMAGE.
2. builds: `podman build --isolation chroot` of both files over that base, with this machine's package
   sources mounted read-only (pip's configuration files and the local wheel and index folders they name,
   the CA bundle, npm's global configuration; uv is told to trust the system's certificates). The CPU
   image takes torch==2.13.0+cpu from pip's own sources (PyTorch's index is not reachable), the GPU image
   PyPI's torch==2.13.0 (CUDA 13.0), with the folders offering a CPU torch left out.
3. the CPU image's file system started as its user with its environment and entrypoint
   (scripts/images/run_image.py): `/ready`; speech that whisper tiny.en hears correctly (the
   intelligibility test's sentences and word error rate); a second start ready from the compile cache kept
   on a host directory standing in for a named volume at the image's KOKORO_COMPILE_CACHE_DIR (the
   directory starts as a copy of the image's, owner included, as Docker's named volumes do); a start on one
   CPU with OMP_NUM_THREADS=4, which the entrypoint lowers to 1 and the engine logs; two starts with that
   cache copied into the image's own file system instead (owned by root, so read-only to the server; and
   owned by the server's user). Every start fails the check if its log shows a kernel falling back to
   eager (no compiler or no Python.h) or a traceback.
4. in the GPU image, as its user: gcc, Python.h, torch and triton import, a C file against Python.h built
   by Triton's own launcher builder, a function compiled by inductor on the CPU (g++), torch's and
   Triton's libraries resolving all they link, the nvidia-* wheels' libraries included (libcuda, the
   driver, excepted: the NVIDIA container toolkit mounts it); and its server started on the CPU
   (KOKORO_DEVICE=cpu, kernels eager), its speech heard by whisper. No GPU here: nothing runs on CUDA.

Sizes, each phase's time and each start's ready time and phases go to --out (JSON). Needs root, podman
and debootstrap (apt-get install podman debootstrap), about 30 GB of free disk while it builds, and the
project's .venv (whisper runs there, on the host).

    .venv/bin/python -m scripts.images.check_images --out bench-results/<machine>/images.json
    .venv/bin/python -m scripts.images.check_images --skip-gpu --out /tmp/images.json     # CPU only
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import lzma
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import traceback
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from scripts.bench.common import Report
from scripts.bench.ready import GRAPHS, phase_times
from scripts.harness import Server, free_port, spawn, stop_server, wait_ready
from scripts.images.run_image import (
    ImageConfig,
    bound,
    chroot_command,
    image_config,
    mounted_image,
    podman,
)

ROOT = Path(__file__).resolve().parents[2]

BASE_IMAGE = "localhost/kokoro-python-base:3.11-bookworm"
BASE_IMAGES = {"amd64": BASE_IMAGE, "arm64": f"{BASE_IMAGE}-arm64"}
IMAGES = {
    "cpu": "localhost/kokoro-openai-server:cpu",
    "gpu": "localhost/kokoro-openai-server:gpu",
    "arm64": "localhost/kokoro-openai-server:cpu-arm64",
}
# Each kind's Dockerfile and platform: the arm64 image is Dockerfile.cpu built for linux/arm64.
DOCKERFILES = {"cpu": "Dockerfile.cpu", "gpu": "Dockerfile.gpu", "arm64": "Dockerfile.cpu"}
ARCHES = {"cpu": "amd64", "gpu": "amd64", "arm64": "arm64"}
# The manifest list (--arm64) that joins the two CPU images, as `docker buildx --platform` would push it.
MANIFEST = "localhost/kokoro-openai-server:cpu-multiarch"
BASE_PACKAGES = ("python3", "python3-venv", "python3-dev", "ca-certificates")
# Docs, manuals and translations left out of every package installed, as debian:bookworm-slim (the base of
# python:3.11-slim) does with its own dpkg path-excludes.
DPKG_EXCLUDES = """\
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/locale/*
"""
# What python:3.11-slim-bookworm's configuration sets that the server's image relies on.
BASE_CHANGES = (
    "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "ENV LANG=C.UTF-8",
    'CMD ["python3"]',
)
BUILD_ARGS = {
    # Only the CPU build carries the +cpu label, so pip's own sources (here a local wheel) must offer it.
    "cpu": {"TORCH_SPEC": "torch==2.13.0+cpu", "TORCH_INDEX_URL": ""},
    # PyPI's torch==2.13.0: CUDA 13.0 (PyTorch's cu128 index, the file's default, is not reachable here).
    "gpu": {"TORCH_INDEX_URL": ""},
    # PyPI's aarch64 torch==2.13.0 is a CUDA build too (with its nvidia-* wheels); the file's default,
    # PyTorch's CPU index and its aarch64 CPU build, is not reachable here. Its CPU kernels are the ones
    # that build has: the CPU check below runs nothing on CUDA.
    "arm64": {"TORCH_SPEC": "torch==2.13.0", "TORCH_INDEX_URL": ""},
}
# Kokoro-FastAPI's images after its PR #361, for comparison (bytes, as `docker images` shows them).
KOKORO_FASTAPI_BYTES = {"cpu": 4.9e9, "gpu": 9.9e9}
# The log of a start that must fail the check: a fused kernel left eager (no compiler, no Python.h), a
# compiled function that could not be saved or loaded, any traceback.
FAILURES = re.compile(
    r"torch\.compile failed|running it eagerly|Python\.h|ahead of time failed|could not load the compiled"
    r"|Traceback"
)
ENTRYPOINT_THREADS = re.compile(r"entrypoint: OMP_NUM_THREADS=(\d+) but (\d+) CPUs are usable: using (\d+)")
# torch.get_num_threads() in the engine, as it logs it (api/engine/torch_engine.py).
ENGINE_THREADS = re.compile(r"one call at a time on (\d+) thread|a call with nothing beside it gets (\d+)")
# npm's global configuration file in Debian's npm package (the images install Debian's npm).
DEBIAN_NPMRC = "/etc/npmrc"
READY_TIMEOUT_S = 900.0
SPEECH_SENTENCES = 3
# Starts from the volume, and again from the cache baked into the image's file system.
WARM_STARTS = 3


class Phases:
    """Wall-clock seconds of each named step of the run."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def timed(self, name: str) -> Iterator[None]:
        started = time.monotonic()
        try:
            yield
        finally:
            self.seconds[name] = round(time.monotonic() - started, 1)
            print(f"[{name}: {self.seconds[name]:.0f} s]", flush=True)


# --- the base image -----------------------------------------------------------------------------------


def debian_mirror(sources: Mapping[str, str]) -> str:
    """The first Debian archive (not its security archive) named by apt's sources (file name: text)."""
    for text in sources.values():
        for url in re.findall(r"^\s*(?:URIs:|deb)\s+(\S+)", text, flags=re.MULTILINE):
            if "debian" in url and "security" not in url:
                return str(url)
    raise ValueError("no Debian archive in apt's sources")


def apt_sources() -> dict[str, str]:
    """This machine's Debian sources (sources.list and sources.list.d's enabled files that name a Debian
    archive), by their path."""
    paths = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    return {
        str(path): path.read_text()
        for path in paths
        if path.suffix in (".list", ".sources") and path.is_file() and "debian.org" in path.read_text()
    }


def make_base(work: Path, arch: str) -> None:
    """BASE_IMAGES[arch] from Debian's packages, with apt reading this machine's Debian sources and its
    Acquire:: settings (proxies, validity checks), and dpkg leaving out what debian:bookworm-slim does.
    A foreign `arch` runs its packages' scripts under emulation (`enable_arm64_emulation`)."""
    rootfs = work / f"base-rootfs-{arch}"
    shutil.rmtree(rootfs, ignore_errors=True)
    sources = apt_sources()
    packages = ",".join(BASE_PACKAGES)
    run(["debootstrap", f"--arch={arch}", "--variant=minbase", f"--include={packages}", "bookworm",
         str(rootfs), debian_mirror(sources)])  # fmt: skip
    (rootfs / "etc/apt/sources.list").unlink(missing_ok=True)
    for path, text in sources.items():
        (rootfs / path.lstrip("/")).write_text(text)
    (rootfs / "etc/dpkg/dpkg.cfg.d/docker-slim").write_text(DPKG_EXCLUDES)
    for conf in Path("/etc/apt/apt.conf.d").glob("*"):
        if conf.is_file() and "Acquire::" in conf.read_text():
            shutil.copy(conf, rootfs / "etc/apt/apt.conf.d" / conf.name)
    for cache in ("var/cache/apt/archives", "var/lib/apt/lists"):
        for item in (rootfs / cache).glob("*"):
            if item.is_file():
                item.unlink()
    changes = [arg for change in BASE_CHANGES for arg in ("--change", change)]
    tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
    command = ["podman", "import", "--os", "linux", "--arch", arch, *changes, "-", BASE_IMAGES[arch]]
    subprocess.run(command, stdin=tar.stdout, check=True)
    if tar.wait() != 0:
        raise RuntimeError("tar of the base's root failed")
    shutil.rmtree(rootfs)


# --- the builds ---------------------------------------------------------------------------------------


def pip_settings(config_list: str) -> dict[str, str]:
    """`pip config list`'s `section.key='value'` lines, by key (the environment's `:env:` ones included)."""
    found = {}
    for line in config_list.splitlines():
        match = re.match(r"^(?::env:|[\w-]+)\.([\w-]+)='(.*)'$", line.strip())
        if match:
            found[match.group(1)] = match.group(2)
    return found


def pip_config_files(config_debug: str) -> list[str]:
    """The configuration files `pip config debug` lists as existing."""
    return re.findall(r"^\s+(/\S+), exists: True$", config_debug, flags=re.MULTILINE)


def package_sources(settings: Mapping[str, str]) -> tuple[list[str], list[str]]:
    """(files, folders) that pip's `settings` name: its CA bundle and constraint file; its find-links
    folders, and the folders of its local (file://) indexes, a `simple` index with the `files` beside it
    that its pages link to (`../../files/...`)."""
    files = [settings[key] for key in ("cert", "constraint") if key in settings]
    folders = []
    for key in ("find-links", "extra-index-url", "index-url"):
        for location in settings.get(key, "").split():
            if location.startswith("/"):
                folders.append(location.rstrip("/"))
            elif location.startswith("file:///"):
                index = Path(location.removeprefix("file://").rstrip("/"))
                folders.append(str(index.parent if index.name == "simple" else index))
    return files, folders


def offers_cpu_torch(folder: Path) -> bool:
    """A find-links folder, or a local index's folder, with a CPU build of torch (a +cpu wheel)."""
    return any(folder.glob("torch-*+cpu-*.whl")) or any(folder.glob("*/torch-*+cpu-*.whl"))


def build_mounts(kind: str, work: Path) -> list[str]:
    """`podman build`'s read-only -v arguments that give a build this machine's package sources."""
    pip = [sys.executable, "-m", "pip"]
    settings = pip_settings(capture([*pip, "config", "list"]))
    files, folders = package_sources(settings)
    files += pip_config_files(capture([*pip, "config", "debug"]))
    if kind == "gpu":  # else pip prefers the local +cpu torch (a higher version than PyPI's 2.13.0)
        folders = [folder for folder in folders if not offers_cpu_torch(Path(folder))]
    npmrc = capture(["npm", "config", "get", "globalconfig"]) if shutil.which("npm") else ""
    if npmrc and Path(npmrc).is_file():
        files.append(npmrc)
    uv_config = work / "uv.toml"
    uv_config.write_text("system-certs = true\n")  # the CA bundle mounted below, not uv's built-in roots
    mounts = [(path, path) for path in dict.fromkeys([*files, *folders]) if Path(path).exists()]
    mounts.append((str(uv_config), "/etc/uv/uv.toml"))
    if npmrc and Path(npmrc).is_file() and npmrc != DEBIAN_NPMRC:  # where the image's own npm reads it
        mounts.append((npmrc, DEBIAN_NPMRC))
    return [arg for host, inside in mounts for arg in ("-v", f"{host}:{inside}:ro")]


def image_ids(*filters: str) -> set[str]:
    return set(podman("images", "--all", "--quiet", "--no-trunc", *filters).split())


def removed_image(image: str) -> bool:
    return subprocess.run(["podman", "rmi", image], capture_output=True, check=False).returncode == 0


def remove_images(images: set[str]) -> None:
    """`images`, children before their parents (a pass removes what has no children left)."""
    left = set(images)
    while left:
        removed = {image for image in sorted(left) if removed_image(image)}
        left = (left - removed) & image_ids()
        if not removed:
            break


def build(kind: str, work: Path, no_cache: bool, keep_cache: bool) -> None:
    """IMAGES[kind] built from its Dockerfile for its platform over that platform's base image. Unless
    `keep_cache`, what the build leaves beside it (its build stage's image, the layers it cached, the image
    it replaced under that name) is removed: about 12 GB for both x86 images."""
    before = image_ids()
    replaced = image_ids("--filter", f"reference={IMAGES[kind]}")
    base = BASE_IMAGES[ARCHES[kind]]
    args = [arg for key, value in BUILD_ARGS[kind].items() for arg in ("--build-arg", f"{key}={value}")]
    command = [
        "nice", "-n", "10", "podman", "build", "--isolation", "chroot", "--format", "docker",
        "--platform", f"linux/{ARCHES[kind]}", "-f", DOCKERFILES[kind],
        "--build-arg", f"PYTHON_IMAGE={base}", *args, *build_mounts(kind, work),
        *(["--no-cache"] if no_cache else []), "-t", IMAGES[kind], ".",
    ]  # fmt: skip
    log = work / f"build-{kind}.log"
    print(f"building {IMAGES[kind]} (log: {log})", flush=True)
    with log.open("wb") as out:
        result = subprocess.run(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, check=False)
    if not keep_cache:
        kept = image_ids("--filter", f"reference={IMAGES[kind]}").union(
            *(image_ids("--filter", f"reference={name}") for name in BASE_IMAGES.values())
        )
        remove_images(((image_ids() - before) | replaced) - kept)
    if result.returncode != 0:
        raise RuntimeError(f"the {kind} build failed:\n{log.read_text(errors='replace')[-6000:]}")


def image_sizes(image: str) -> dict[str, Any]:
    """The image's size and its layers' (newest first), in bytes."""
    history = json.loads(podman("history", "--format", "json", image))
    return {
        "bytes": int(podman("image", "inspect", "--format", "{{.Size}}", image)),
        "layers": [
            {"bytes": layer["size"], "created_by": layer.get("CreatedBy", layer.get("createdBy", ""))[:160]}
            for layer in history
            if layer["size"]
        ],
    }


# --- the CPU image, started -----------------------------------------------------------------------------


def start(
    root: Path, config: ImageConfig, log_path: Path, cpus: str | None, env: Mapping[str, str]
) -> Server:
    """The image's entrypoint and command (on 127.0.0.1 and a free port) in `root`, with `env` added to
    the image's environment, in a session of its own (the server's compile workers included), not waited
    for."""
    port = free_port()
    command = chroot_command(
        root, config, [*config.cmd, "--host", "127.0.0.1", "--port", str(port)], env, cpus
    )
    return spawn(command, log_path, port, preexec_fn=os.setsid)


def stop(server: Server) -> None:
    stop_server(server)
    with suppress(ProcessLookupError):
        os.killpg(server.process.pid, signal.SIGKILL)


def start_report(server: Server, started: float, ready_s: float | None) -> dict[str, Any]:
    """What a start's log says: phases, compiled graphs, thread counts, failures."""
    log = server.log()
    graphs = GRAPHS.search(log)
    entrypoint = ENTRYPOINT_THREADS.search(log)
    threads = ENGINE_THREADS.search(log)
    return {
        "ready_s": None if ready_s is None else round(ready_s, 2),
        "phases_s": phase_times(log, started),
        "graphs_loaded": None if graphs is None else int(graphs.group(1)),
        "graphs_built": None if graphs is None else int(graphs.group(2)),
        "engine_line": next((line for line in log.splitlines() if "api.server.app: engine:" in line), None),
        "entrypoint_threads": None if entrypoint is None else int(entrypoint.group(3)),
        "engine_threads": None if threads is None else int(threads.group(1) or threads.group(2)),
        "failures": [line for line in log.splitlines() if FAILURES.search(line)][:20],
        "failure_count": sum(1 for line in log.splitlines() if FAILURES.search(line)),
    }


def one_start(
    root: Path,
    config: ImageConfig,
    log_path: Path,
    cpus: str | None = None,
    speak: Any = None,
    env: Mapping[str, str] = {},  # noqa: B006 - read only
    ready_timeout_s: float = READY_TIMEOUT_S,
) -> dict[str, Any]:
    """A start to `/ready`, `speak(server)` while it runs where given, and the stop."""
    load_average = os.getloadavg()[0]
    started = time.time()
    server = start(root, config, log_path, cpus, env)
    ready_s = None
    extra: dict[str, Any] = {}
    try:
        wait_ready(server, ready_timeout_s)
        ready_s = time.time() - started
        environ = Path(f"/proc/{server.process.pid}/environ").read_bytes().split(b"\0")
        extra["server_omp_num_threads"] = next(
            (item.split(b"=", 1)[1].decode() for item in environ if item.startswith(b"OMP_NUM_THREADS=")),
            None,
        )
        if speak is not None:
            extra["speech"] = speak(server)
    finally:
        stop(server)
    report = {**start_report(server, started, ready_s), "load_average_1min": load_average, **extra}
    print(f"  {log_path.stem}: ready in {report['ready_s']} s, graphs loaded/built "
          f"{report['graphs_loaded']}/{report['graphs_built']}, failures {len(report['failures'])}",
          flush=True)  # fmt: skip
    return report


def hear(server: Server) -> dict[str, Any]:
    """The first SPEECH_SENTENCES of the intelligibility test, said by the server and transcribed by
    whisper tiny.en (scripts/hearing.py, as the intelligibility test listens), with their word error rate."""
    from scripts.hearing import MAX_WER, SENTENCES, load_whisper, say, transcribe, word_error_rate

    whisper = load_whisper()
    pairs = [(text, transcribe(whisper, say(server, text))) for text in SENTENCES[:SPEECH_SENTENCES]]
    wer = word_error_rate(pairs)
    return {"said_heard": pairs, "wer": round(wer, 3), "max_wer": MAX_WER, "understood": wer <= MAX_WER}


def in_image(
    root: Path,
    config: ImageConfig,
    args: Sequence[str],
    timeout_s: float = 600,
    env: Mapping[str, str] = {},  # noqa: B006 - read only
) -> str:
    """`args` run through the image's entrypoint as its user, with `env` added to the image's environment;
    their standard output."""
    command = chroot_command(root, config, args, env)
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, check=False)
    if result.returncode != 0:
        raise RuntimeError(
            f"{args[:3]} failed in the image ({result.returncode}):\n{result.stdout}{result.stderr}"
        )
    return result.stdout


def copy_cache(volume: Path, target: Path, owner: int) -> None:
    """The cache as an image build would put it into the image's file system (COPY, --chown or not)."""
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(volume, target, symlinks=True)
    for path in [target, *target.rglob("*")]:
        os.chown(path, owner, owner, follow_symlinks=False)
        if not path.is_symlink():
            path.chmod(0o755 if path.is_dir() else 0o644)


def check_cpu(work: Path) -> dict[str, Any]:
    config = image_config(IMAGES["cpu"])
    cache_path = config.env["KOKORO_COMPILE_CACHE_DIR"]
    volume = work / "volume"
    shutil.rmtree(volume, ignore_errors=True)
    logs = work / "logs"
    logs.mkdir(exist_ok=True)
    result: dict[str, Any] = {"cache_path": cache_path}
    with mounted_image(IMAGES["cpu"]) as root:
        in_root = root / cache_path.lstrip("/")
        stat = in_root.stat()
        result["cache_dir_in_image"] = {
            "uid": stat.st_uid,
            "gid": stat.st_gid,
            "mode": oct(stat.st_mode & 0o7777),
        }
        result["python_h"] = in_image(root, config, ["python", "-c", PYTHON_H]).strip()
        result["gxx"] = in_image(root, config, ["g++", "--version"]).splitlines()[0]
        # A new named volume starts as a copy of the image's directory, its owner and mode included.
        volume.mkdir()
        os.chown(volume, stat.st_uid, stat.st_gid)
        volume.chmod(stat.st_mode & 0o7777)
        starts = {}
        with bound(volume, in_root):
            starts["first_empty_volume"] = one_start(root, config, logs / "first.log", speak=hear)
        # The same kernels in the image's own file system, as a build step would leave them (COPY --chown
        # to the server's user, and COPY: owned by root), the volume unmounted; turn about with starts from
        # the volume, so that both meet the same load from anything else on the machine.
        copy_cache(volume, in_root, owner=stat.st_uid)
        for index in range(1, WARM_STARTS + 1):
            with bound(volume, in_root):
                starts[f"from_volume_{index}"] = one_start(root, config, logs / f"volume-{index}.log")
            log = logs / f"baked-user-{index}.log"
            starts[f"baked_owned_by_server_user_{index}"] = one_start(root, config, log)
        copy_cache(volume, in_root, owner=0)
        starts["baked_owned_by_root"] = one_start(root, config, logs / "baked-root.log")
        # Last, so that the starts above all find the same kernels: one CPU's are other kernels.
        with bound(volume, in_root):
            starts["one_cpu_from_volume"] = one_start(root, config, logs / "one-cpu.log", cpus="0")
    result["starts"] = starts
    baked_root = starts["baked_owned_by_root"]
    result["root_owned_baked_cache"] = {
        "ready_s": baked_root["ready_s"],
        "kernels_ran_eagerly": any("running it eagerly" in line for line in baked_root["failures"]),
        "log_lines_failing": baked_root["failure_count"],
    }
    result["checks"] = cpu_verdicts(result, len(os.sched_getaffinity(0)))
    return result


PYTHON_H = (
    "import os, sysconfig; p = sysconfig.get_paths()['include']; print(p, os.path.exists(p + '/Python.h'))"
)


def loaded_only(start: Mapping[str, Any]) -> bool:
    return (start["graphs_loaded"] or 0) > 0 and start["graphs_built"] == 0


def cpu_verdicts(result: Mapping[str, Any], cpus: int) -> dict[str, bool]:
    """Pass or fail of each check. The start from a root-owned cache is a measurement, not a check: the
    server cannot use a cache it may not write (inductor takes lock files in it)."""
    starts = result["starts"]
    first, one = starts["first_empty_volume"], starts["one_cpu_from_volume"]
    clean = [start for name, start in starts.items() if name != "baked_owned_by_root"]
    warm = [name for name in starts if name.startswith(("from_volume_", "baked_owned_by_server_user_"))]
    return {
        "cache_dir_owned_by_server_user": result["cache_dir_in_image"]["uid"] == 10001,
        "python_h": result["python_h"].endswith("True"),
        "ready": all(start["ready_s"] is not None for start in starts.values()),
        "no_eager_fallback_or_traceback": not any(start["failures"] for start in clean),
        "speech_understood": bool(first.get("speech", {}).get("understood")),
        "first_start_compiled": (first["graphs_built"] or 0) > 0,
        "later_starts_loaded_from_the_cache": all(loaded_only(starts[name]) for name in warm),
        "threads_lowered_to_cpus_given": (
            first["entrypoint_threads"] == min(4, cpus)
            and one["entrypoint_threads"] == 1
            and one["server_omp_num_threads"] == "1"
            and one["engine_threads"] == 1
        ),
    }


# --- the GPU image, inspected ----------------------------------------------------------------------------

# Run in the GPU image as its user: what Triton and inductor need at run time, without a GPU.
GPU_PROBE = r"""
import glob, importlib.util, json, os, shutil, subprocess, sys, sysconfig, tempfile
import torch, triton
found = {"torch": torch.__version__, "cuda": torch.version.cuda, "triton": triton.__version__,
         "cc": shutil.which("cc"), "gcc": shutil.which("gcc"), "gxx": shutil.which("g++")}
include = sysconfig.get_paths()["include"]
found["python_h"] = os.path.exists(os.path.join(include, "Python.h"))
# Triton's own launcher builder: a C extension against Python.h, compiled with the image's cc, imported.
from triton.runtime.build import _build
source = ('#include <Python.h>\n'
          'static struct PyModuleDef m = {PyModuleDef_HEAD_INIT, "probe", NULL, -1, NULL};\n'
          'PyMODINIT_FUNC PyInit_probe(void) { return PyModule_Create(&m); }\n')
with tempfile.TemporaryDirectory() as folder:
    with open(os.path.join(folder, "probe.c"), "w") as file:
        file.write(source)
    library = _build("probe", os.path.join(folder, "probe.c"), folder, [], [], [], [])
    spec = importlib.util.spec_from_file_location("probe", library)
    importlib.util.module_from_spec(spec)
    found["triton_build"] = os.path.basename(library)
# inductor on the CPU: C++ built with g++ against torch's and Python's headers.
compiled = torch.compile(lambda x: torch.sin(x) * 2 + 1)
x = torch.randn(64)
found["inductor_cpu"] = bool(torch.allclose(compiled(x), torch.sin(x) * 2 + 1))
# torch's and Triton's libraries resolve everything they link, the nvidia-* wheels' libraries included
# (ldd follows the links); libcuda (the driver) is the NVIDIA container toolkit's to mount. The wheels'
# plugins that nothing links (multi-node transports over RDMA, UCX, MPI) are listed, not checked.
site = os.path.dirname(os.path.dirname(torch.__file__))
def unresolved(libraries):
    missing = {}
    for library in libraries:
        lines = subprocess.run(["ldd", library], capture_output=True, text=True).stdout.splitlines()
        absent = [line.split()[0] for line in lines if "not found" in line and "libcuda.so" not in line]
        if absent:
            missing[os.path.relpath(library, site)] = absent
    return missing
linked = glob.glob(site + "/torch/lib/*.so*") + glob.glob(site + "/triton/_C/*.so")
found["libraries_checked"] = len(linked)
found["unresolved"] = unresolved(linked)
found["plugins_unresolved"] = unresolved(glob.glob(site + "/nvidia/**/lib/*.so*", recursive=True))
found["nvidia_wheels_mb"] = {
    os.path.basename(path): round(sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path)
                                      for f in fs) / 2**20)
    for path in sorted(glob.glob(site + "/nvidia/*")) if os.path.isdir(path)
}
print("PROBE " + json.dumps(found))
"""


# The GPU image's server on this machine's CPU, kernels left eager: its Python stack and baked weights
# (the checkpoint without the int8 model it was converted from) serve speech; CUDA itself is not run.
GPU_IMAGE_ON_CPU = {"KOKORO_DEVICE": "cpu", "KOKORO_TORCH_COMPILE": "false"}


def check_gpu(work: Path) -> dict[str, Any]:
    config = image_config(IMAGES["gpu"])
    with mounted_image(IMAGES["gpu"]) as root:
        output = in_image(root, config, ["python", "-c", GPU_PROBE])
        stat = (root / config.env["KOKORO_COMPILE_CACHE_DIR"].lstrip("/")).stat()
        log = work / "logs" / "gpu-image-on-cpu.log"
        on_cpu = one_start(root, config, log, speak=hear, env=GPU_IMAGE_ON_CPU)
    (line,) = [line for line in output.splitlines() if line.startswith("PROBE ")]
    found: dict[str, Any] = json.loads(line.removeprefix("PROBE "))
    found["server_on_cpu"] = on_cpu
    found["checks"] = {
        "gcc_and_python_h": bool(found["gcc"]) and found["python_h"],
        "torch_cuda_build": found["cuda"] is not None,
        "triton_builds_a_launcher": bool(found["triton_build"]),
        "inductor_cpu": found["inductor_cpu"],
        "cuda_libraries_resolve": found["libraries_checked"] > 0 and not found["unresolved"],
        "cache_dir_owned_by_server_user": stat.st_uid == 10001,
        "server_on_cpu_understood": (
            on_cpu["ready_s"] is not None
            and not on_cpu["failures"]
            and bool(on_cpu.get("speech", {}).get("understood"))
        ),
    }
    return found


# --- the arm64 CPU image, under emulation ---------------------------------------------------------------

BINFMT = Path("/proc/sys/fs/binfmt_misc")
# qemu-user 8.2 is the first whose aarch64 emulation shows the emulated CPU's own /proc/cpuinfo. Under
# bookworm's 7.2 an arm64 process reads the x86 host's, and `import torch` dies in a segmentation fault
# (the CPU-detection libraries under it find no ARM processor): Debian's bookworm-backports has 10.0,
# static, in its qemu-user package.
QEMU_MIN_VERSION = (8, 2)
QEMU_SUITE = "bookworm-backports"
DEBIAN_KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
# The kernel's match for an aarch64 ELF executable (as qemu's own binfmt files give it); flags F (the
# interpreter opened now, so it runs inside chroots and builds) and P (argv[0] kept).
AARCH64_MAGIC = r"\x7f\x45\x4c\x46\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\xb7\x00"
AARCH64_MASK = r"\xff\xff\xff\xff\xff\xff\xff\x00\xff\xff\xff\xff\xff\xff\xff\xff\xfe\xff\xff\xff"
# The emulated CPUs: Neoverse N1 (AWS Graviton 2, Ampere Altra: Oracle's A1, Hetzner's CAX; NEON and int8
# dot products, no SVE) runs the server on both engines, their speech and the numerics tests; Neoverse V1
# (Graviton 3: SVE, bf16, i8mm) and Cortex-A76 (Raspberry Pi 5) are asked what the engine would choose.
ARM64_SERVER_CPU = "neoverse-n1"
ARM64_NUMERICS_CPUS = ("neoverse-n1",)
ARM64_PROBE_CPUS = ("neoverse-n1", "neoverse-v1", "cortex-a76")
# The numerics tests run in the arm64 image under emulation: the torch engine, as the server runs it on
# ARM, against the library's own forward, and its determinism and speed setting. Emulated floating point
# is slow: one forward of "Hello world." (1.6 s of audio) took 240 s on the emulated Neoverse N1, against
# about 0.15 s on a real CPU, so each test takes minutes. Left out: the prepared kernels' tests (not chosen
# on ARM), the batched forward's (the CPU runs one chunk a call), the conversion's against the int8 ONNX
# model (real weights and long phrases: hours here).
ARM64_NUMERICS = (
    "tests/integration/test_torch_engine.py::test_output_equals_the_librarys_own_forward",
    "tests/integration/test_torch_engine.py::test_speed_and_determinism",
)
# What pytest needs in the image (pure-Python wheels, fetched here and installed there without an index).
TEST_WHEELS = ("pytest", "pytest-timeout")
ARM64_SPEECH = "The quick brown fox jumps over the lazy dog."
# Emulated, a start takes about 10 minutes to /ready and a sentence several minutes.
ARM64_READY_TIMEOUT_S = 2400.0
ARM64_REQUEST_TIMEOUT_S = 1800.0
# The engine's log line on ARM: the library's path, with the reason (api/engine/torch_engine.py).
ARM_LIBRARY_PATH = "prepared kernels not used: CPU (arm64"


def qemu_version(qemu: str) -> tuple[int, int]:
    first = capture([qemu, "--version"]).splitlines()[0]
    major, minor = re.search(r"version (\d+)\.(\d+)", first).groups()  # type: ignore[union-attr]
    return int(major), int(minor)


def fetched(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=120) as response:  # noqa: S310 - Debian's archive
        data: bytes = response.read()
    return data


def checked_sha256(data: bytes, expected: str, what: str) -> bytes:
    if hashlib.sha256(data).hexdigest() != expected:
        raise RuntimeError(f"{what}: its SHA256 is not the one the archive signed")
    return data


def qemu_from_backports(work: Path, mirror: str) -> Path:
    """qemu-user's static qemu-aarch64 from QEMU_SUITE, unpacked into `work`: its Packages index checked
    against the suite's InRelease, whose signature gpgv checks with Debian's archive keyring; the package
    checked against the index."""
    dist = f"{mirror}/dists/{QEMU_SUITE}"
    inrelease = work / "InRelease"
    inrelease.write_bytes(fetched(f"{dist}/InRelease"))
    run(["gpgv", "--keyring", DEBIAN_KEYRING, str(inrelease)])
    arch = capture(["dpkg", "--print-architecture"])
    index = f"main/binary-{arch}/Packages.xz"
    (signed,) = re.findall(
        rf"^ ([0-9a-f]{{64}})\s+\d+\s+{re.escape(index)}$", inrelease.read_text(), re.MULTILINE
    )
    packages = lzma.decompress(checked_sha256(fetched(f"{dist}/{index}"), signed, index)).decode()
    (stanza,) = [text for text in packages.split("\n\n") if text.startswith("Package: qemu-user\n")]
    fields = dict(re.findall(r"^(Filename|SHA256|Version): (\S+)$", stanza, flags=re.MULTILINE))
    deb = work / "qemu-user.deb"
    deb.write_bytes(checked_sha256(fetched(f"{mirror}/{fields['Filename']}"), fields["SHA256"], "qemu-user"))
    target = work / f"qemu-user-{fields['Version'].replace(':', '_')}"
    shutil.rmtree(target, ignore_errors=True)
    run(["dpkg-deb", "-x", str(deb), str(target)])
    return target / "usr/bin/qemu-aarch64"


def enable_arm64_emulation(work: Path) -> str:
    """arm64 programs run here under qemu-user: binfmt_misc mounted and an aarch64 interpreter of
    QEMU_MIN_VERSION or later registered (bookworm-backports' where the registered one is older or none
    is). Without systemd nothing registers one by itself. Returns the interpreter's version line."""
    if not (BINFMT / "register").exists():
        run(["mount", "-t", "binfmt_misc", "binfmt_misc", str(BINFMT)])
    entry = BINFMT / "qemu-aarch64"
    if entry.exists():
        (interpreter,) = re.findall(r"^interpreter (\S+)$", entry.read_text(), flags=re.MULTILINE)
        if Path(interpreter).exists() and qemu_version(interpreter) >= QEMU_MIN_VERSION:
            return capture([interpreter, "--version"]).splitlines()[0]
        entry.write_text("-1")  # unregistered
    qemu = qemu_from_backports(work, debian_mirror(apt_sources()))
    (BINFMT / "register").write_text(f":qemu-aarch64:M::{AARCH64_MAGIC}:{AARCH64_MASK}:{qemu}:FP")
    return capture([str(qemu), "--version"]).splitlines()[0]


def copy_tests(root: Path) -> str:
    """The repository's tracked api, scripts and tests and its pyproject.toml, copied into `root`'s /src
    (the container's own layer); the path in the image."""
    target = root / "src"
    shutil.rmtree(target, ignore_errors=True)
    files = capture(["git", "-C", str(ROOT), "ls-files", "api", "scripts", "tests", "pyproject.toml"])
    for name in files.splitlines():
        if (ROOT / name).is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, target / name)
    return "/src"


def with_pytest(root: Path, config: ImageConfig, work: Path) -> ImageConfig:
    """pytest installed into the container's layer (never the image) and the repository's tests copied
    there: the image's configuration as root, working in that copy."""
    wheels = work / "test-wheels"
    run([sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "--platform",
         "manylinux2014_aarch64", "--python-version", "3.11", "-d", str(wheels), *TEST_WHEELS])  # fmt: skip
    shutil.copytree(wheels, root / "tmp/test-wheels", dirs_exist_ok=True)
    as_root = dataclasses.replace(config, user="0", workdir=copy_tests(root))
    install = ["python", "-m", "pip", "install", "-q", "--no-index", "--find-links", "/tmp/test-wheels"]
    in_image(root, as_root, [*install, *TEST_WHEELS])
    return as_root


def arm64_numerics(root: Path, as_root: ImageConfig, cpu: str, log: Path) -> dict[str, Any]:
    """ARM64_NUMERICS run by pytest in the image on the emulated `cpu`, over the image's baked registry
    weights; pytest's summary and timings."""
    environment = {
        "QEMU_CPU": cpu,
        "PYTHONDONTWRITEBYTECODE": "1",
        "KOKORO_TEST_WEIGHTS_DIR": as_root.env["KOKORO_WEIGHTS_DIR"],
    }
    pytest = ["python", "-m", "pytest", *ARM64_NUMERICS, "-p", "no:cacheprovider", "--basetemp",
              f"/tmp/numerics-{cpu}", "-o", "timeout=3600", "--durations=0", "-q"]  # fmt: skip
    started = time.monotonic()
    with log.open("w") as out:
        result = subprocess.run(
            chroot_command(root, as_root, pytest, environment),
            stdout=out,
            stderr=subprocess.STDOUT,
            check=False,
        )
    text = log.read_text(errors="replace")
    summary = [line for line in text.splitlines() if re.search(r"\d+ (passed|failed|error)", line)]
    durations = re.findall(r"^([\d.]+)s (call|setup)\s+(\S+)$", text, flags=re.MULTILINE)
    print(f"  numerics on {cpu}: {summary[-1] if summary else 'no summary'}", flush=True)
    return {
        "returncode": result.returncode,
        "summary": summary[-1] if summary else None,
        "seconds": round(time.monotonic() - started, 1),
        "slowest_s": [{"s": float(s), "when": when, "test": test} for s, when, test in durations[:15]],
    }


def timed_speech(server: Server) -> dict[str, Any]:
    """ARM64_SPEECH said by the server and heard by whisper tiny.en (as `hear` does), with the request's
    seconds."""
    import httpx

    from scripts.hearing import MAX_WER, load_whisper, transcribe, word_error_rate

    body = {"model": "tts-1", "voice": "af_heart", "input": ARM64_SPEECH, "response_format": "wav"}
    started = time.monotonic()
    response = httpx.post(f"{server.url}/v1/audio/speech", json=body, timeout=ARM64_REQUEST_TIMEOUT_S)
    seconds = time.monotonic() - started
    response.raise_for_status()
    whisper = load_whisper()
    pairs = [(ARM64_SPEECH, transcribe(whisper, response.content))]
    wer = word_error_rate(pairs)
    return {
        "said_heard": pairs,
        "request_s": round(seconds, 1),
        "audio_s": round((len(response.content) - 44) / 2 / 24000, 2),
        "wer": round(wer, 3),
        "max_wer": MAX_WER,
        "understood": wer <= MAX_WER,
    }


ARM64_PROBE = """
import platform, torch, onnxruntime
from api.engine.choice import choose_engine, cpu_flags, isa_summary
flags = cpu_flags()
engine = choose_engine("auto", device="cpu", onnx_present=True, may_fetch=False, flags=flags)
print(platform.machine(), torch.__version__, torch.backends.cpu.get_cpu_capability(), onnxruntime.__version__,
      isa_summary(flags), engine.reason, sep="|")
"""
PROBE_FIELDS = ("machine", "torch", "torch_cpu_capability", "onnxruntime", "isa_summary", "engine_reason")


def check_arm64(work: Path) -> dict[str, Any]:
    config = image_config(IMAGES["arm64"])
    logs = work / "logs"
    logs.mkdir(exist_ok=True)
    entry = (BINFMT / "qemu-aarch64").read_text()
    (interpreter,) = re.findall(r"^interpreter (\S+)$", entry, flags=re.MULTILINE)
    result: dict[str, Any] = {
        "emulated": True,
        "qemu": capture([interpreter, "--version"]).splitlines()[0],
        "architecture": podman("image", "inspect", "--format", "{{.Architecture}}", IMAGES["arm64"]),
        "server_cpu": ARM64_SERVER_CPU,
    }
    with mounted_image(IMAGES["arm64"]) as root:
        probes = {}
        for cpu in ARM64_PROBE_CPUS:
            output = in_image(root, config, ["python", "-c", ARM64_PROBE], env={"QEMU_CPU": cpu})
            probes[cpu] = dict(zip(PROBE_FIELDS, output.strip().splitlines()[-1].split("|"), strict=True))
        result["probes"] = probes
        emulated = {"QEMU_CPU": ARM64_SERVER_CPU}
        result["start"] = one_start(
            root,
            config,
            logs / "arm64.log",
            speak=timed_speech,
            env=emulated,
            ready_timeout_s=ARM64_READY_TIMEOUT_S,
        )
        as_root = with_pytest(root, config, work)
        result["numerics"] = {
            cpu: arm64_numerics(root, as_root, cpu, logs / f"arm64-numerics-{cpu}.log")
            for cpu in ARM64_NUMERICS_CPUS
        }
        result["numerics_tests"] = list(ARM64_NUMERICS)
        # The int8 ONNX engine, ONNX Runtime's own ARM kernels (KOKORO_ENGINE=onnx).
        result["start_onnx"] = one_start(
            root,
            config,
            logs / "arm64-onnx.log",
            speak=timed_speech,
            env={**emulated, "KOKORO_ENGINE": "onnx"},
            ready_timeout_s=ARM64_READY_TIMEOUT_S,
        )
    start = result["start"]
    log = (logs / "arm64.log").read_text(errors="replace")
    result["checks"] = {
        "image_is_arm64": result["architecture"] == "arm64"
        and all(probe["machine"] == "aarch64" for probe in probes.values()),
        "arm_features_read": all(
            probe["isa_summary"].startswith("arm64: asimd") for probe in probes.values()
        ),
        "ready": start["ready_s"] is not None,
        "no_traceback": not start["failures"],
        "library_path_with_its_reason": ARM_LIBRARY_PATH in log,
        "speech_understood": bool(start.get("speech", {}).get("understood")),
        **{f"numerics_passed_{cpu}": run["returncode"] == 0 for cpu, run in result["numerics"].items()},
        "onnx_engine_understood": result["start_onnx"]["ready_s"] is not None
        and not result["start_onnx"]["failures"]
        and bool(result["start_onnx"].get("speech", {}).get("understood")),
    }
    return result


def join_manifest() -> dict[str, Any]:
    """MANIFEST made anew from the two CPU images (where both are built): the platforms it lists."""
    if subprocess.run(["podman", "manifest", "exists", MANIFEST], check=False).returncode == 0:
        podman("manifest", "rm", MANIFEST)
    podman("manifest", "create", MANIFEST)
    for kind in ("cpu", "arm64"):
        podman("manifest", "add", MANIFEST, f"containers-storage:{IMAGES[kind]}")
    listed = json.loads(podman("manifest", "inspect", MANIFEST))
    platforms = sorted(
        f"{item['platform']['os']}/{item['platform']['architecture']}" for item in listed["manifests"]
    )
    return {
        "name": MANIFEST,
        "platforms": platforms,
        "checks": {"both_platforms": platforms == ["linux/amd64", "linux/arm64"]},
    }


# --- the run ------------------------------------------------------------------------------------------


def checked(check: Callable[..., dict[str, Any]], *args: Any) -> dict[str, Any]:
    """`check(*args)`'s findings; where it raises, the error as a failed check, so the report is written."""
    try:
        return check(*args)
    except Exception as error:  # noqa: BLE001 - reported, and the run fails
        traceback.print_exc()
        return {"error": f"{type(error).__name__}: {error}"[-4000:], "checks": {"completed": False}}


def run(command: Sequence[str]) -> None:
    subprocess.run(list(command), check=True)


def capture(command: Sequence[str]) -> str:
    return subprocess.run(list(command), check=True, capture_output=True, text=True).stdout.strip()


def lscpu() -> dict[str, Any]:
    fields = dict(line.split(":", 1) for line in capture(["lscpu"]).splitlines() if ":" in line)
    fields = {key.strip(): value.strip() for key, value in fields.items()}
    keep = ("Model name", "CPU family", "Model", "Stepping", "CPU(s)", "Hypervisor vendor")
    return {**{key: fields.get(key) for key in keep}, "flags": fields.get("Flags", "").split()}


def image_exists(image: str) -> bool:
    return subprocess.run(["podman", "image", "exists", image], check=False).returncode == 0


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=Path("bench-results/images.json"), help="JSON report")
    parser.add_argument("--work", type=Path, default=Path("/var/tmp/kokoro-images"), help="logs, cache")
    parser.add_argument("--skip-gpu", action="store_true", help="build and check the CPU image only")
    parser.add_argument(
        "--arm64",
        action="store_true",
        help="instead: build and check the CPU image for linux/arm64 under emulation (qemu-user-static), and "
        "join it with the amd64 CPU image (where built) into a manifest list",
    )
    parser.add_argument("--no-build", action="store_true", help="check the images built before")
    parser.add_argument("--no-cache", action="store_true", help="build every layer again")
    parser.add_argument("--rebuild-base", action="store_true", help="make the base image again")
    parser.add_argument(
        "--keep-build-cache", action="store_true", help="keep the build stages' images and cached layers"
    )
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    kinds = ["arm64"] if args.arm64 else ["cpu"] if args.skip_gpu else ["cpu", "gpu"]
    arch = ARCHES[kinds[0]]
    phases = Phases()
    started = time.monotonic()
    written = Report(args, benchmark="images")
    report: dict[str, Any] = {"lscpu": lscpu()}
    if args.arm64:
        report["qemu"] = enable_arm64_emulation(args.work)
    if args.rebuild_base or not image_exists(BASE_IMAGES[arch]):
        with phases.timed("base"):
            make_base(args.work, arch)
    if not args.no_build:
        for kind in kinds:
            with phases.timed(f"build_{kind}"):
                build(kind, args.work, args.no_cache, args.keep_build_cache)
    report["images"] = {
        "base": {"name": BASE_IMAGES[arch], **image_sizes(BASE_IMAGES[arch])},
        **{kind: {"name": IMAGES[kind], **image_sizes(IMAGES[kind])} for kind in kinds},
    }
    report["kokoro_fastapi_bytes"] = KOKORO_FASTAPI_BYTES
    report["podman_images"] = capture(["podman", "images"]).splitlines()
    checks_of = {"cpu": check_cpu, "gpu": check_gpu, "arm64": check_arm64}
    for kind in kinds:
        with phases.timed(f"check_{kind}"):
            report[kind] = checked(checks_of[kind], args.work)
    if args.arm64 and image_exists(IMAGES["cpu"]):
        kinds.append("manifest")
        report["manifest"] = checked(join_manifest)
    report["phases_s"] = phases.seconds
    report["total_s"] = round(time.monotonic() - started, 1)
    checks = {f"{kind}.{name}": ok for kind in kinds for name, ok in report[kind]["checks"].items()}
    report["ok"] = all(checks.values())
    written.write(report)
    for name, ok in checks.items():
        print(f"{'ok  ' if ok else 'FAIL'} {name}")
    for kind in kinds:
        if kind in report["images"]:
            theirs = KOKORO_FASTAPI_BYTES.get(kind)
            compared = f" (Kokoro-FastAPI's: {theirs / 1e9:.1f} GB)" if theirs else ""
            print(f"{kind} image: {report['images'][kind]['bytes'] / 1e9:.2f} GB{compared}")
    print(f"total {report['total_s']:.0f} s; report in {args.out}")
    sys.exit(0 if report["ok"] else 1)


if __name__ == "__main__":
    if os.geteuid() != 0:
        sys.exit("check_images.py builds with podman and mounts file systems: run it as root")
    main()
