"""Starts what a container image holds where podman builds images but cannot run them (on the project's
machines its OCI runtime is refused when it sets rlimits): the image's file system is mounted (podman
create + mount), the host's /proc, /dev and /sys are bound into it, and the image's entrypoint and command
run in a chroot as the image's user, with the image's environment, working directory and HOME (from the
image's /etc/passwd, as Docker sets it). The host's network is shared. Needs root.

    .venv/bin/python scripts/images/run_image.py localhost/kokoro-openai-server:cpu \\
        --volume /tmp/cache:/home/kokoro/.cache/kokoro-openai-server/compile-cache \\
        -- python -m api --host 127.0.0.1 --port 8890

scripts/images/check_images.py starts the CPU image through `mounted_image` and `chroot_command`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

# The host's file systems a process in the image needs: /proc (ps, torch's CPU count), /dev (null,
# urandom, shm), /sys (the CPU's caches and, with cgroup v2, the entrypoint's CPU quota).
HOST_FILESYSTEMS = ("proc", "dev", "sys")


@dataclass(frozen=True)
class ImageConfig:
    """What `docker run` takes from an image: its user, environment, entrypoint, command and working
    directory."""

    user: str
    env: dict[str, str]
    entrypoint: list[str]
    cmd: list[str]
    workdir: str

    @classmethod
    def from_inspect(cls, inspected: Mapping[str, object]) -> ImageConfig:
        """From one image of `podman image inspect`'s JSON."""
        config = inspected["Config"]
        assert isinstance(config, dict)
        return cls(
            user=config.get("User") or "0",
            env=parse_env(config.get("Env") or []),
            entrypoint=list(config.get("Entrypoint") or []),
            cmd=list(config.get("Cmd") or []),
            workdir=config.get("WorkingDir") or "/",
        )


def podman(*args: str) -> str:
    return subprocess.run(["podman", *args], check=True, capture_output=True, text=True).stdout.strip()


def image_config(image: str) -> ImageConfig:
    (inspected,) = json.loads(podman("image", "inspect", image))
    return ImageConfig.from_inspect(inspected)


def parse_env(pairs: Sequence[str]) -> dict[str, str]:
    """`["KEY=value", ...]` as a dict (a value may hold `=`)."""
    return dict(pair.split("=", 1) for pair in pairs)


def user_ids(user: str, passwd: str) -> tuple[int, int, str]:
    """(uid, gid, home) of `user` ("uid", "uid:gid", "name" or "name:group" by number) from the image's
    /etc/passwd text; a uid that is not listed gets its own number as gid and / as home, as Docker does."""
    name, _, group = user.partition(":")
    for line in passwd.splitlines():
        fields = line.split(":")
        if len(fields) >= 6 and name in (fields[0], fields[2]):
            return int(fields[2]), int(group or fields[3]), fields[5]
    if not name.isdigit():
        raise ValueError(f"user {name!r} is not in the image's /etc/passwd")
    return int(name), int(group or name), "/"


def run(command: Sequence[str]) -> None:
    subprocess.run(list(command), check=True)


@contextmanager
def bound(source: Path, target: Path, read_only: bool = False) -> Iterator[Path]:
    """`source` bound (recursively) at `target`, which is made if missing; unbound on leaving, lazily if
    something still uses it."""
    target.mkdir(parents=True, exist_ok=True)
    run(["mount", "--rbind", str(source), str(target)])
    try:
        run(["mount", "--make-rslave", str(target)])
        if read_only:
            run(["mount", "-o", "remount,bind,ro", str(target)])
        yield target
    finally:
        if subprocess.run(["umount", "-R", str(target)], check=False).returncode != 0:
            run(["umount", "-R", "-l", str(target)])


@contextmanager
def mounted_image(image: str, volumes: Mapping[str, Path] = {}) -> Iterator[Path]:  # noqa: B006 - read only
    """The root of a new container of `image` (writable, as a container's is), with the host's /proc, /dev
    and /sys bound in and each of `volumes` (path in the image: host directory) bound at its path. Everything
    is unmounted and the container removed on leaving."""
    container = podman("create", image)
    try:
        root = Path(podman("mount", container))
        try:
            with ExitStack() as stack:
                for name in HOST_FILESYSTEMS:
                    stack.enter_context(bound(Path("/") / name, root / name))
                for inside, host in volumes.items():
                    stack.enter_context(bound(host, root / inside.lstrip("/")))
                yield root
        finally:
            podman("umount", container)
    finally:
        podman("rm", "--force", container)


def chroot_command(
    root: Path,
    config: ImageConfig,
    args: Sequence[str] = (),
    env: Mapping[str, str] = {},  # noqa: B006 - read only
    cpus: str | None = None,
) -> list[str]:
    """The command that runs the image's entrypoint with `args` (else the image's command) in `root` as the
    image's user, with only the image's environment, HOME and `env`; on the CPUs `cpus` (taskset's list)
    when given. Each program execs the next, so the process started is the server itself."""
    uid, gid, home = user_ids(config.user, (root / "etc" / "passwd").read_text())
    environment = {**config.env, "HOME": home, **env}
    pinned = ["taskset", "--cpu-list", cpus] if cpus else []
    return [
        *pinned,
        "chroot",
        f"--userspec={uid}:{gid}",
        str(root),
        "/usr/bin/env",
        "-i",
        "-C",
        config.workdir,
        *(f"{key}={value}" for key, value in environment.items()),
        *config.entrypoint,
        *(args or config.cmd),
    ]


def parse_volume(text: str) -> tuple[str, Path]:
    host, _, inside = text.partition(":")
    if not inside.startswith("/"):
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST_DIR:/PATH/IN/IMAGE")
    return inside, Path(host).resolve()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("image")
    parser.add_argument("--volume", type=parse_volume, action="append", default=[], metavar="HOST:PATH")
    parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--cpus", help="taskset's CPU list, e.g. 0 or 0-3")
    parser.add_argument("args", nargs="*", help="after --: the command (default: the image's)")
    args = parser.parse_args()
    config = image_config(args.image)
    with mounted_image(args.image, dict(args.volume)) as root:
        command = chroot_command(root, config, args.args, parse_env(args.env), args.cpus)
        sys.exit(subprocess.run(command, check=False).returncode)


if __name__ == "__main__":
    if os.geteuid() != 0:
        sys.exit("run_image.py mounts file systems: run it as root")
    main()
