"""A book shared by two replicas over a real PostgreSQL (Debian's, scripts/postgres.py), on real servers over
the real model code with random weights: each replica on its own data directory (nothing shared but the
database), both making the book's units, one killed with SIGKILL while it holds some, the other finishing
the book; its audio equal, sample for sample, to the same book made again by one replica alone, every unit
made once. Random weights, not the registry's: nothing here is heard, and their durations of about two
frames a token make the book's two renderings a third of the real weights' work (tests/integration/
test_books_server.py hears a resumed book on the real weights)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psycopg

from scripts.harness import Server, launch_server, started, stop_server
from tests.integration.test_books_server import decoded, poll

EPUB = Path(__file__).resolve().parents[1] / "data" / "books" / "alice.epub"
RATE = 24_000


def post(server: Server) -> str:
    response = httpx.post(
        f"{server.url}/v1/audio/jobs",
        files={"file": (EPUB.name, EPUB.read_bytes(), "application/epub+zip")},
        data={"response_format": "wav"},
        timeout=60,
    )
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


def wait_done(server: Server, job_id: str) -> dict[str, Any]:
    return poll(server, job_id, lambda job: job["state"] == "done")


def units_of(db: psycopg.Connection[Any], job_id: str, pid: int) -> tuple[int, int]:
    """How many of the job's units the process `pid` has made, and how many it holds unmade."""
    rows = db.execute(
        "SELECT done, COUNT(*) FROM units WHERE job_id = %s AND owner LIKE %s GROUP BY done",
        (job_id, f"%:{pid}:%"),
    ).fetchall()
    counts = dict(rows)
    return counts.get(1, 0), counts.get(0, 0)


def test_a_replica_killed_midway_leaves_the_book_whole(
    random_weights: Path, tmp_path: Path, postgres_url: str
) -> None:
    # Kernels compiled before ready: a replica started again after a kill must make the same samples from
    # its first unit, not eager ones while its kernels compile in the background.
    env = {
        "KOKORO_ENGINE": "torch",
        "KOKORO_JOBS_DATABASE": postgres_url,
        "KOKORO_COMPILE_IN_BACKGROUND": "false",
    }
    launched: list[Server] = []

    def replica(name: str) -> Server:
        log = tmp_path / f"{name}.log"
        launched.append(launch_server(random_weights, log, KOKORO_DATA_DIR=str(tmp_path / name), **env))
        return started(launched[-1])

    try:
        # One after the other: on a fresh machine the first compiles the kernels into the compile cache and
        # the second loads them from it, where two started at once compiled the same kernels each (73 s of
        # a core each on a 2-core AVX2 EPYC).
        one = replica("one")
        two = replica("two")
        job_id = post(one)
        with psycopg.connect(postgres_url, autocommit=True) as db:
            deadline = time.monotonic() + 300
            while True:  # both at work, and one holding units it has not made
                made_one, holds_one = units_of(db, job_id, one.process.pid)
                made_two, _ = units_of(db, job_id, two.process.pid)
                if made_one >= 1 and holds_one >= 1 and made_two >= 1:
                    break
                assert time.monotonic() < deadline, (made_one, holds_one, made_two)
                time.sleep(0.05)
            one.process.kill()  # SIGKILL: its units are left claimed
            one.process.wait()
            done = wait_done(two, job_id)
            rows = db.execute(
                "SELECT idx, done, owner FROM units WHERE job_id = %s ORDER BY idx", (job_id,)
            ).fetchall()
        book = httpx.get(f"{two.url}{done['audio_url']}", timeout=60).content
        assert [row[0] for row in rows] == list(range(len(rows)))  # every unit once, each made
        assert all(row[1] == 1 for row in rows)
        assert {row[2].split(":")[1] for row in rows} == {str(one.process.pid), str(two.process.pid)}
        # The same book, made by the replica left alone: the same audio.
        alone = wait_done(two, post(two))
        uninterrupted = httpx.get(f"{two.url}{alone['audio_url']}", timeout=60).content
    finally:
        for server in launched:
            stop_server(server)
    audio, expected = decoded(book), decoded(uninterrupted)
    differ = np.flatnonzero(audio != expected) if len(audio) == len(expected) else [0]
    assert len(differ) == 0, f"{len(differ)} samples differ, from {differ[0] / RATE:.2f} s"
    assert done["progress"]["audio_seconds"] == round(len(audio) / RATE, 3)
    assert [chapter["start_time"] for chapter in done["chapters"]] == [
        chapter["start_time"] for chapter in alone["chapters"]
    ]
