"""A real PostgreSQL server for the tests and the benchmarks: Debian's (scripts/test.sh installs it), a
throwaway cluster on loopback under a temporary folder, run as the `postgres` user where this runs as root
(the server refuses root). `server` starts one (a `Cluster`, which can be stopped and started again);
`database` makes a fresh database on it."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg

_ROOT_USER = "postgres"  # Debian's package makes it


def binaries() -> Path:
    """The newest installed PostgreSQL's bin folder."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres"), key=lambda path: int(path.parts[-3]))
    if not found:
        raise RuntimeError("PostgreSQL is not installed: `apt-get install postgresql` (scripts/test.sh does)")
    return found[-1].parent


def _as_server_user(command: list[str]) -> list[str]:
    return ["runuser", "-u", _ROOT_USER, "--", *command] if os.geteuid() == 0 else command


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass(frozen=True)
class Cluster:
    """A throwaway PostgreSQL cluster: its URL (database `postgres`, user `kokoro`, no password), and a
    stop and a start again on the same data and port, for a database restarted under its clients."""

    url: str
    data: Path
    options: str
    log: Path

    def start(self) -> None:
        self._pg_ctl("-o", self.options, "-l", str(self.log), "-w", "start")

    def stop(self) -> None:
        """Stopped at once (`immediate`): its clients' connections are cut, as when its machine goes."""
        self._pg_ctl("-m", "immediate", "-w", "stop")

    def _pg_ctl(self, *arguments: str) -> None:
        command = [str(binaries() / "pg_ctl"), "-D", str(self.data), *arguments]
        subprocess.run(_as_server_user(command), check=True, capture_output=True, timeout=120)


@contextmanager
def server() -> Iterator[Cluster]:
    """A running PostgreSQL server on loopback, removed with its data on exit."""
    bin_dir = binaries()
    root = Path(tempfile.mkdtemp(prefix="kokoro-pg-"))
    if os.geteuid() == 0:
        user = pwd.getpwnam(_ROOT_USER)
        os.chown(root, user.pw_uid, user.pw_gid)
    data, port = root / "data", _free_port()
    options = f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=100"
    cluster = Cluster(f"postgresql://kokoro@127.0.0.1:{port}/postgres", data, options, root / "log")
    try:
        subprocess.run(
            _as_server_user(
                [str(bin_dir / "initdb"), "-D", str(data), "-A", "trust", "-U", "kokoro", "--no-sync"]
            ),
            check=True,
            capture_output=True,
            timeout=120,
        )
        cluster.start()
        try:
            yield cluster
        finally:
            with contextlib.suppress(subprocess.CalledProcessError):  # already stopped
                cluster.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def database(url: str) -> str:
    """A fresh, empty database on the server at `url`; its URL."""
    name = f"test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute(f"CREATE DATABASE {name}")
    return url.rsplit("/", 1)[0] + f"/{name}"
