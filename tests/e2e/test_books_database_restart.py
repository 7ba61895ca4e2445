"""PostgreSQL stopped and started again under a book job that two replicas share (real servers over the
tone engine, Debian's PostgreSQL): while it is down a job's status is a 503 with Retry-After, and once it
is back the job goes on to its end with every unit made once, none lost and none made twice (the replicas'
own count of the units they kept, `kokoro_book_units_total`), its audio as long as the book's."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx
import psycopg
import pytest

from scripts import postgres
from scripts.bench.soak import units_made
from scripts.harness import Server, running_server
from tests.integration.test_books_server import decoded, poll

LEASE_S = 30  # longer than the outage and the queries that wait it out: the work in hand is kept
OUTAGE_S = 4
TEXT = " ".join(f"Sentence number {n} of the book, which goes on for a while." for n in range(60))
RATE = 24_000


@pytest.fixture
def cluster() -> Iterator[postgres.Cluster]:
    """A cluster of the test's own: it is stopped in the middle."""
    with postgres.server() as running:
        yield running


def post(server: Server) -> str:
    response = httpx.post(
        f"{server.url}/v1/audio/jobs",
        files={"file": ("book.txt", TEXT.encode(), "text/plain")},
        data={"response_format": "wav"},
        timeout=60,
    )
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


def status_again(server: Server, job_id: str, timeout_s: float = 60) -> float:
    """When the job's status is answered again (200, not 503) once the database is back."""
    deadline = time.monotonic() + timeout_s
    while True:
        response = httpx.get(f"{server.url}/v1/audio/jobs/{job_id}", timeout=30)
        if response.status_code == 200:
            return time.monotonic()
        assert response.status_code == 503, response.text
        assert response.headers.get("retry-after")
        assert time.monotonic() < deadline, response.text
        time.sleep(0.2)


def test_a_book_goes_on_when_its_database_restarts(
    random_weights: Path, tmp_path: Path, cluster: postgres.Cluster
) -> None:
    url = postgres.database(cluster.url)
    env = {
        "KOKORO_JOBS_DATABASE": url,
        "KOKORO_JOB_LEASE_S": str(LEASE_S),
        "TONE_ENGINE_DELAY_S": "0.25",  # a unit takes time, as on a real model
    }
    with ExitStack() as stack:
        one, two = (
            stack.enter_context(
                running_server(
                    random_weights,
                    tmp_path / f"{name}.log",
                    module="tests.tone_server",
                    KOKORO_DATA_DIR=str(tmp_path / name),
                    **env,
                )
            )
            for name in ("one", "two")
        )
        job_id = post(one)
        with psycopg.connect(url, autocommit=True) as db:
            deadline = time.monotonic() + 120
            while True:  # both at work, and the book far from done
                rows = db.execute(
                    "SELECT owner, done FROM units WHERE job_id = %s AND owner IS NOT NULL", (job_id,)
                ).fetchall()
                owners = {owner.split(":")[1] for owner, done in rows if done}
                if len(owners) == 2:
                    break
                assert time.monotonic() < deadline, rows
                time.sleep(0.05)
            total = db.execute("SELECT COUNT(*) FROM units WHERE job_id = %s", (job_id,)).fetchone()
        assert total is not None
        done_before = sum(1 for _, done in rows if done)
        assert done_before < total[0] / 2, (done_before, total)
        cluster.stop()
        time.sleep(OUTAGE_S)
        status = httpx.get(f"{one.url}/v1/audio/jobs/{job_id}", timeout=30)
        assert status.status_code == 503, status.text  # the database's absence is said, not hidden
        assert status.headers.get("retry-after")
        assert status.json()["error"]["code"] == "jobs_database_unreachable"
        cluster.start()
        restarted = time.monotonic()
        back = status_again(two, job_id)  # the pools reconnect with backoff: 503s for a few seconds
        print(f"the job's status answered again {back - restarted:.1f} s after the restart")
        done = poll(two, job_id, lambda job: job["state"] == "done", timeout=180)
        book = httpx.get(f"{two.url}{done['audio_url']}", timeout=60).content
        with psycopg.connect(url, autocommit=True) as db:
            rows = db.execute(
                "SELECT idx, done, samples FROM units WHERE job_id = %s ORDER BY idx", (job_id,)
            ).fetchall()
        assert [row[0] for row in rows] == list(range(len(rows)))
        assert all(row[1] == 1 for row in rows)
        made = [units_made(httpx.get(f"{server.url}/metrics", timeout=30).text) for server in (one, two)]
        assert sum(counts.get("kept", 0) for counts in made) == len(rows), made  # none made twice
        assert all(counts.get("kept", 0) > 0 for counts in made), made  # both made some
        assert len(decoded(book)) == sum(row[2] for row in rows)  # every unit's audio, once
        for server in (one, two):
            server.check_alive()
