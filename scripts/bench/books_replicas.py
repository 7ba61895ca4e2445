"""A book's wall time on two server instances sharing it through PostgreSQL, against one.

Each instance is pinned to a core of its own with one thread (`taskset`), as a one-core machine would be,
on its own data directory; the instances share nothing but a PostgreSQL database (Debian's, a throwaway
cluster: scripts/postgres.py). In one run, the same book (--book-chars characters of the built-in
paragraphs, wav) is posted to:

1. `one`: one instance on core 0;
2. `two`: two instances, on cores 0 and 1;
3. `one_whole_machine`: one instance on every core with as many threads (what a single server would do).

Each phase starts its servers, waits for them to be ready, posts the book and times it from the post to
`done`; the units each instance made are counted from the database. Ratio: `one` over `two` (2 would be
a perfect share; the PostgreSQL server and the job's planning and assembly run on the same cores).

    python -m scripts.bench books-replicas --out bench-results/<machine>/books-replicas.json
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx
import psycopg

from scripts import postgres
from scripts.bench.common import Report, add_weights, book_text, positive_int, ratio
from scripts.harness import Server, launch, process_env, stop_server, wait_engines_ready


@contextmanager
def instances(
    args: argparse.Namespace, url: str, folder: Path, placements: Sequence[tuple[str, int]]
) -> Iterator[list[Server]]:
    """Servers on the jobs database `url`, each on the cores `cpus` ("0", "0-1") with `threads` threads."""
    folder.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        servers = []
        for number, (cpus, threads) in enumerate(placements):
            data = str(folder / f"data-{number}")
            env = process_env(args.weights, threads=threads, KOKORO_DATA_DIR=data, KOKORO_JOBS_DATABASE=url)
            server = launch(env, folder / f"server-{number}.log", prefix=["taskset", "-c", cpus])
            stack.callback(stop_server, server)
            servers.append(server)
        for server in servers:
            wait_engines_ready(server)
        yield servers


def book_wall_time(args: argparse.Namespace, url: str, server: Server, pids: Sequence[int]) -> dict[str, Any]:
    body = {"input": book_text(args.book_chars), "response_format": "wav", "title": "bench"}
    started = time.monotonic()
    job = httpx.post(f"{server.url}/v1/audio/jobs", json=body, timeout=60).json()
    while True:
        state = httpx.get(f"{server.url}/v1/audio/jobs/{job['id']}", timeout=30).json()
        if state["state"] in ("done", "failed"):
            break
        time.sleep(0.2)
    wall_s = time.monotonic() - started
    if state["state"] != "done":
        raise RuntimeError(f"the book job failed: {state['error']}")
    with psycopg.connect(url) as db:
        made = {
            str(pid): db.execute(
                "SELECT COUNT(*) FROM units WHERE job_id = %s AND owner LIKE %s", (job["id"], f"%:{pid}:%")
            ).fetchone()[0]  # type: ignore[index]
            for pid in pids
        }
    audio_s = state["progress"]["audio_seconds"]
    return {
        "wall_s": round(wall_s, 2),
        "audio_s": audio_s,
        "audio_s_per_s": round(audio_s / wall_s, 3),
        "chunks": state["progress"]["chunks_total"],
        "units_made_by_instance": made,
    }


def measure(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        raise SystemExit("needs two cores")
    phases = {
        "one": [(str(cores[0]), 1)],
        "two": [(str(cores[0]), 1), (str(cores[1]), 1)],
        "one_whole_machine": [(",".join(map(str, cores)), len(cores))],
    }
    results: dict[str, Any] = {}
    with postgres.server() as cluster:
        for name, placements in phases.items():
            url = postgres.database(cluster.url)
            with instances(args, url, folder / name, placements) as servers:
                print(f"{name}: {placements}", flush=True)
                pids = [server.process.pid for server in servers]
                results[name] = {"placements": placements, **book_wall_time(args, url, servers[0], pids)}
                print(f"  {results[name]}", flush=True)
    return results


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_weights(parser)
    parser.add_argument("--book-chars", type=positive_int, default=6_000, help="the book's length")


def run(args: argparse.Namespace) -> int:
    report = Report(args)
    with tempfile.TemporaryDirectory(prefix="bench-books-replicas-") as folder:
        result = measure(args, Path(folder))
    wall = {name: phase["wall_s"] for name, phase in result.items()}
    ratios = {
        "one_over_two_wall": round(ratio(wall["one"], wall["two"]) or 0, 3),
        "whole_machine_over_two_wall": round(ratio(wall["one_whole_machine"], wall["two"]) or 0, 3),
    }
    report.write({**result, "ratios": ratios})
    print(ratios)
    return 0
