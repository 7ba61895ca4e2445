"""Who holds a job's work: each server process's id, and whether a holder on this host is gone."""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Callable


def owner_id() -> str:
    """This process, as a holder of work: host, process id, and a nonce (a restarted container's new
    server process may have the old one's host name and process id)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def process_alive(pid: int) -> bool:
    """Whether process `pid` exists on this host (another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def orphaned(holder: str | None, claimer: str, alive: Callable[[int], bool] = process_alive) -> bool:
    """Whether `holder` was a process of the claimer's host that is gone: its id is not `alive`, or it is
    the claimer's own id with another nonce (the process before a restart)."""
    if holder is None:
        return True
    host, _, rest = holder.partition(":")
    pid_text, _, nonce = rest.partition(":")
    my_host, my_pid, my_nonce = claimer.split(":")
    if host != my_host or not pid_text.isdigit():
        return False
    if pid_text == my_pid:
        return nonce != my_nonce
    return not alive(int(pid_text))
