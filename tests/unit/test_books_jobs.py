"""Book jobs through the API, over the fake tone engine: the job's life, its file and captions, resuming
after a stop, what is refused, and the store's leases."""

from __future__ import annotations

import io
import os
import re
import time
from pathlib import Path
from typing import Any

import av
import numpy as np
import psycopg
import pytest
from fastapi.testclient import TestClient

from api.books.owners import orphaned, owner_id
from api.books.sqlite_store import SqliteJobStore
from api.errors import ServiceUnavailableError
from api.server.app import create_app
from scripts.bench.soak import units_made
from tests.fakes import FakeEngine, FakePhonemizer
from tests.unit.test_api import assert_error, make_settings, wait_ready

BOOKS = Path(__file__).resolve().parents[1] / "data" / "books"
MARKDOWN = (BOOKS / "alice.md").read_text()


def start(
    tmp_path: Path, engine: FakeEngine | None = None, owner: str | None = None, **overrides: Any
) -> TestClient:
    """An app over the fake engine; `owner`: its runner's name as a holder of work (two apps in this one
    process are two machines' replicas, not one process restarted)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    settings = make_settings(tmp_path, **overrides)
    app = create_app(settings, engine=engine or FakeEngine(), phonemizer=FakePhonemizer())  # type: ignore[arg-type]
    if owner is not None:
        app.state.books.runner.owner = owner
    client = TestClient(app)
    client.__enter__()
    wait_ready(client)
    return client


@pytest.fixture
def client(tmp_path: Path) -> Any:
    client = start(tmp_path)
    yield client
    client.__exit__(None, None, None)


def post_markdown(client: TestClient, **fields: Any) -> dict[str, Any]:
    body = {"input": MARKDOWN, "input_format": "markdown", **fields}
    response = client.post("/v1/audio/jobs", json=body)
    assert response.status_code == 202, response.text
    assert response.headers["location"] == f"/v1/audio/jobs/{response.json()['id']}"
    return response.json()  # type: ignore[no-any-return]


def wait_state(
    client: TestClient, job_id: str, states: tuple[str, ...] = ("done", "failed"), timeout: float = 30
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        job = client.get(f"/v1/audio/jobs/{job_id}").json()
        if job["state"] in states or time.monotonic() > deadline:
            assert job["state"] in states, job
            return job  # type: ignore[no-any-return]
        time.sleep(0.05)


def chapters_of(data: bytes) -> list[tuple[str, float]]:
    with av.open(io.BytesIO(data)) as container:
        return [
            (chapter["metadata"]["title"], float(chapter["start"] * chapter["time_base"]))
            for chapter in container.chapters()
        ]


def decoded(data: bytes) -> np.ndarray:
    with av.open(io.BytesIO(data)) as container:
        return np.concatenate([frame.to_ndarray().reshape(-1) for frame in container.decode(audio=0)])


def test_a_markdown_book_becomes_an_m4b_with_its_chapters(client: TestClient) -> None:
    job = post_markdown(client, captions=True)
    assert job["state"] in ("queued", "running")
    assert [chapter["title"] for chapter in job["chapters"]] == [
        "Chapter I. Down the Rabbit-Hole",
        "Chapter II. The Pool of Tears",
        "Chapter III. A Caucus-Race and a Long Tale",
    ]
    done = wait_state(client, job["id"])
    assert done["state"] == "done", done
    progress = done["progress"]
    assert progress["chunks_done"] == progress["chunks_total"] > 3
    assert progress["characters_done"] == progress["characters_total"]
    assert progress["fraction"] == 1
    starts = [chapter["start_time"] for chapter in done["chapters"]]
    listed = client.get("/v1/audio/jobs").json()["data"][0]
    assert [chapter["start_time"] for chapter in listed["chapters"]] == starts
    assert starts[0] == 0
    assert starts == sorted(starts)
    assert len(set(starts)) == 3
    audio = client.get(done["audio_url"])
    assert audio.status_code == 200
    assert audio.headers["content-type"] == "audio/mp4"
    assert "Alice" in audio.headers["content-disposition"]
    assert len(audio.content) == done["bytes"]
    marks = chapters_of(audio.content)
    assert [title for title, _ in marks] == [chapter["title"] for chapter in done["chapters"]]
    assert [start for _, start in marks] == pytest.approx(starts, abs=0.001)
    with av.open(io.BytesIO(audio.content)) as container:
        assert container.metadata["title"] == "Alice's Adventures in Wonderland"
        assert container.duration / 1e6 == pytest.approx(progress["audio_seconds"], abs=0.1)


def test_captions_are_the_books_words_timed_in_the_whole_book(client: TestClient) -> None:
    job = wait_state(client, post_markdown(client, captions=True, response_format="wav")["id"])
    srt = client.get(f"/v1/audio/jobs/{job['id']}/captions", params={"format": "srt"})
    assert srt.status_code == 200
    assert srt.headers["content-type"].startswith("application/x-subrip")
    text = srt.text
    assert "Chapter I.\n" in text
    assert "Down the Rabbit-Hole." in text
    assert '"Curiouser' in text
    vtt = client.get(f"/v1/audio/jobs/{job['id']}/captions").text
    assert vtt.startswith("WEBVTT")
    # The second chapter's heading is captioned at that chapter's start.
    second = job["chapters"][1]["start_time"]
    cue = next(block for block in text.split("\n\n") if "Chapter II" in block)
    start = cue.splitlines()[1].split(" --> ")[0]
    hours, minutes, seconds = start.replace(",", ".").split(":")
    assert float(hours) * 3600 + float(minutes) * 60 + float(seconds) == pytest.approx(second, abs=0.3)


def test_ranges_are_served_for_seeking(client: TestClient) -> None:
    job = wait_state(client, post_markdown(client, response_format="mp3")["id"])
    whole = client.get(job["audio_url"]).content
    part = client.get(job["audio_url"], headers={"Range": "bytes=1000-1999"})
    assert part.status_code == 206
    assert part.content == whole[1000:2000]
    assert part.headers["content-range"] == f"bytes 1000-1999/{len(whole)}"
    assert chapters_of(whole)[1][0] == "Chapter II. The Pool of Tears"  # ID3 CHAP frames
    beyond = client.get(job["audio_url"], headers={"Range": f"bytes={len(whole) + 10}-"})
    assert beyond.status_code == 416


@pytest.mark.parametrize("fmt", ["opus", "flac", "m4a"])
def test_other_formats_carry_the_chapters(client: TestClient, fmt: str) -> None:
    job = wait_state(client, post_markdown(client, response_format=fmt)["id"])
    assert [title for title, _ in chapters_of(client.get(job["audio_url"]).content)][2].startswith(
        "Chapter III"
    )


def test_an_epub_upload_is_a_job_of_its_chapters(client: TestClient) -> None:
    files = {"file": ("alice.epub", (BOOKS / "alice.epub").read_bytes(), "application/epub+zip")}
    response = client.post(
        "/v1/audio/jobs", files=files, data={"voice": "af_heart", "speed": "1.2", "response_format": "flac"}
    )
    assert response.status_code == 202, response.text
    job = response.json()
    assert job["title"] == "Alice's Adventures in Wonderland"
    assert job["speed"] == 1.2
    assert len(job["chapters"]) == 4
    assert wait_state(client, job["id"])["state"] == "done"


def test_the_list_is_newest_first_and_delete_forgets_a_job(client: TestClient) -> None:
    first = post_markdown(client)
    second = post_markdown(client, title="Another")
    ids = [job["id"] for job in client.get("/v1/audio/jobs").json()["data"]]
    assert ids[:2] == [second["id"], first["id"]]
    assert client.get("/v1/audio/jobs", params={"limit": 1}).json()["data"][0]["title"] == "Another"
    wait_state(client, first["id"])
    deleted = client.delete(f"/v1/audio/jobs/{first['id']}")
    assert deleted.json() == {"id": first["id"], "object": "audio.job", "deleted": True}
    assert_error(client.get(f"/v1/audio/jobs/{first['id']}"), 404, "job_id")
    assert_error(client.get(f"/v1/audio/jobs/{first['id']}/audio"), 404, "job_id")
    assert_error(client.delete(f"/v1/audio/jobs/{first['id']}"), 404, "job_id")


def test_a_job_id_is_never_a_path(client: TestClient, tmp_path: Path) -> None:
    job = wait_state(client, post_markdown(client)["id"])
    jobs = tmp_path / "data" / "jobs"
    # The client folds "." and ".." away (405 or 404 for what is left); "%2e%2e" reaches the route as "..".
    for name in ("..", ".", "%2e%2e", "job_x", "books.sqlite3"):
        assert client.delete(f"/v1/audio/jobs/{name}").status_code in (404, 405), name
        assert client.get(f"/v1/audio/jobs/{name}/audio").status_code in (404, 405), name
    assert_error(client.delete("/v1/audio/jobs/%2e%2e"), 404, "job_id")
    assert (jobs / job["id"]).is_dir()
    assert (jobs / "books.sqlite3").exists()
    assert SqliteJobStore(jobs).delete("..") is False
    assert client.get(f"/v1/audio/jobs/{job['id']}").json()["state"] == "done"


def test_a_running_job_answers_progress_and_409_for_its_audio(tmp_path: Path) -> None:
    client = start(tmp_path, FakeEngine(delay=0.15))
    try:
        job = post_markdown(client)
        running = wait_state(client, job["id"], ("running",))
        deadline = time.monotonic() + 10
        while running["progress"]["chunks_done"] < 2 and time.monotonic() < deadline:
            running = client.get(f"/v1/audio/jobs/{job['id']}").json()
        assert 0 < running["progress"]["fraction"] < 1
        assert running["progress"]["audio_seconds"] > 0
        assert running["eta_seconds"] is not None
        assert running["eta_seconds"] > 0
        assert_error(client.get(f"/v1/audio/jobs/{job['id']}/audio"), 409, None)
        # Deleting it stops it and removes its files.
        assert client.delete(f"/v1/audio/jobs/{job['id']}").status_code == 200
        assert not (tmp_path / "data" / "jobs" / job["id"]).exists()
    finally:
        client.__exit__(None, None, None)


def test_a_job_stopped_midway_resumes_to_the_same_audio(tmp_path: Path) -> None:
    whole_client = start(tmp_path / "whole")
    try:
        whole = wait_state(
            whole_client, post_markdown(whole_client, response_format="wav", captions=True)["id"]
        )
        expected = whole_client.get(whole["audio_url"]).content
        expected_captions = whole_client.get(f"/v1/audio/jobs/{whole['id']}/captions").text
    finally:
        whole_client.__exit__(None, None, None)

    first = start(tmp_path / "resumed", FakeEngine(delay=0.1))
    job = post_markdown(first, response_format="wav", captions=True)
    deadline = time.monotonic() + 20
    while first.get(f"/v1/audio/jobs/{job['id']}").json()["progress"]["chunks_done"] < 3:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    first.__exit__(None, None, None)  # the worker stops mid-job
    stopped = SqliteJobStore(tmp_path / "resumed" / "data" / "jobs").get(job["id"])
    assert stopped is not None
    assert 3 <= stopped.chunks_done < (stopped.chunks_total or 99)

    second = start(tmp_path / "resumed")
    try:
        resumed = wait_state(second, job["id"])
        assert resumed["state"] == "done"
        assert second.get(resumed["audio_url"]).content == expected
        assert second.get(f"/v1/audio/jobs/{job['id']}/captions").text == expected_captions
    finally:
        second.__exit__(None, None, None)
    units = SqliteJobStore(tmp_path / "resumed" / "data" / "jobs").units(job["id"])
    assert [unit.index for unit in units] == list(range(len(units)))


def test_replicas_on_postgresql_share_a_jobs_units_and_serve_its_file(
    tmp_path: Path, postgres_url: str
) -> None:
    shared = {"jobs_database": postgres_url, "job_lease_s": 3}  # renewed, and the queue counted, every 1 s
    one = start(tmp_path / "one", FakeEngine(delay=0.5), "machine-one:7:aaaa", **shared)
    two = start(tmp_path / "two", FakeEngine(delay=0.5), "machine-two:7:bbbb", **shared)
    try:
        job = post_markdown(one, response_format="wav", captions=True)
        queue = re.compile(r"^kokoro_book_units_waiting ([0-9.]+)$", re.MULTILINE)
        deadline = time.monotonic() + 10
        while not float(queue.findall(two.get("/metrics").text)[0]):  # the whole queue, from either replica
            assert time.monotonic() < deadline
            time.sleep(0.1)
        done = wait_state(two, job["id"])
        assert done["state"] == "done", done
        audio = two.get(done["audio_url"])  # two never made the file: it comes from the database
        assert audio.status_code == 200
        assert audio.content == one.get(done["audio_url"]).content
        assert "Alice" in two.get(done["captions_url"]).text
        with psycopg.connect(postgres_url) as db:
            makers = db.execute("SELECT DISTINCT owner FROM units WHERE job_id = %s", (job["id"],)).fetchall()
        assert len(makers) == 2  # both made some of its units
        assert [item["id"] for item in one.get("/v1/audio/jobs").json()["data"]] == [job["id"]]
    finally:
        one.__exit__(None, None, None)
        two.__exit__(None, None, None)
    # Nothing of the book is on either replica's disk but its finished file.
    assert sorted(path.name for path in (tmp_path / "two" / "data" / "jobs" / job["id"]).iterdir()) == [
        "book.wav"
    ]


class FailingPhonemizer(FakePhonemizer):
    """Fails on the third chapter's text, as a G2P error would."""

    def words(self, text: str, lang_code: str) -> list[Any]:
        if "Caucus" in text:
            raise RuntimeError("G2P broke on purpose")
        return super().words(text, lang_code)


def test_a_planning_failure_fails_the_job(tmp_path: Path) -> None:
    settings = make_settings(tmp_path)
    app = create_app(settings, engine=FakeEngine(), phonemizer=FailingPhonemizer())  # type: ignore[arg-type]
    with TestClient(app) as client:
        wait_ready(client)
        failed = wait_state(client, post_markdown(client)["id"])
    assert failed["state"] == "failed"
    assert "G2P broke on purpose" in failed["error"]["message"]


def test_a_unit_made_while_the_database_is_away_is_committed_once_it_is_back(tmp_path: Path) -> None:
    """The store refuses three commits (ServiceUnavailableError, as an unreachable PostgreSQL), the first
    of them after the database had committed it (its answer lost with the connection): the runner tries
    each again until it is kept, and every unit is counted kept once."""
    client = start(tmp_path)
    try:
        store = client.app.state.books.store  # type: ignore[attr-defined]
        commit, refused = store.commit, []

        def flaky(*args: Any) -> bool:
            if len(refused) < 3:
                if not refused:
                    commit(*args)  # committed, and the answer lost
                refused.append(args[:2])
                raise ServiceUnavailableError("The jobs database is unreachable.", retry_after=5)
            return bool(commit(*args))

        store.commit = flaky
        done = wait_state(client, post_markdown(client)["id"])
        assert done["state"] == "done", done
        assert len(refused) == 3
        units = store.get(done["id"]).units_total
        deadline = time.monotonic() + 10  # the job may be done before a lost answer's retry
        while True:
            made = units_made(client.get("/metrics").text)
            if made.get("kept") == units or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert made.get("kept") == units, made
        assert "not_kept" not in made, made
    finally:
        client.__exit__(None, None, None)


def test_a_full_disk_fails_the_job_and_leaves_no_file(tmp_path: Path) -> None:
    client = start(tmp_path, FakeEngine(load_delay=1.0))  # the runner waits for the model to load
    try:
        job = post_markdown(client)
        work = tmp_path / "data" / "jobs" / job["id"]  # where the units' audio is joined for the file
        work.mkdir()
        os.symlink("/dev/full", work / "audio.pcm")
        failed = wait_state(client, job["id"])
        assert failed["state"] == "failed", failed
        assert failed["error"]["code"] == "disk_full"
        assert failed["audio_url"] is None
        assert not list((tmp_path / "data" / "jobs" / job["id"]).glob("book.m4b*"))
    finally:
        client.__exit__(None, None, None)


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"input": "Hello.", "voice": "zz_nobody"}, 400, None),
        ({"input": "Hello.", "response_format": "pcm"}, 400, "response_format"),
        ({"input": "Hello.", "speed": 9}, 400, "speed"),
        ({"input": "", "input_format": "markdown"}, 400, "input"),
        ({"input": "# Only a title"}, 400, None),
        ({"input": "Hello.", "lang_code": "xx"}, 400, "lang_code"),
    ],
)
def test_bad_requests_are_refused_and_write_nothing(
    client: TestClient, tmp_path: Path, body: dict[str, Any], status: int, param: str | None
) -> None:
    if body.get("input") == "# Only a title":
        body["input_format"] = "markdown"
    response = client.post("/v1/audio/jobs", json=body)
    assert response.status_code in (status, 404), response.text
    assert "error" in response.json()
    assert client.get("/v1/audio/jobs").json()["data"] == []
    assert [path.name for path in (tmp_path / "data" / "jobs").iterdir() if path.is_dir()] == []


def test_limits_on_bytes_and_characters(tmp_path: Path) -> None:
    client = start(tmp_path, max_book_bytes=4096, max_book_chars=500)
    try:
        big = {"file": ("big.txt", b"word " * 2000, "text/plain")}
        assert client.post("/v1/audio/jobs", files=big).status_code in (400, 413)
        long_text = client.post("/v1/audio/jobs", json={"input": "word " * 200})
        assert_error(long_text, 400, "input")
        assert long_text.json()["error"]["code"] == "book_too_long"
        unknown = client.post("/v1/audio/jobs", files={"file": ("a.txt", b"Hi.")}, data={"colour": "red"})
        assert_error(unknown, 400, "colour")
    finally:
        client.__exit__(None, None, None)


def test_jobs_are_off_without_a_data_directory(tmp_path: Path) -> None:
    client = start(tmp_path, data_dir=None)
    try:
        response = client.post("/v1/audio/jobs", json={"input": "Hello."})
        assert_error(response, 400, None)
        assert response.json()["error"]["code"] == "jobs_disabled"
    finally:
        client.__exit__(None, None, None)


def test_the_job_api_is_in_the_openapi_document(client: TestClient) -> None:
    document = client.get("/openapi.json").json()
    assert set(document["paths"]["/v1/audio/jobs"]) == {"get", "post"}
    body = document["paths"]["/v1/audio/jobs"]["post"]["requestBody"]["content"]
    assert set(body) == {"application/json", "multipart/form-data"}
    assert "BookJobRequest" in document["components"]["schemas"]
    assert "409" in document["paths"]["/v1/audio/jobs/{job_id}/audio"]["get"]["responses"]


def test_a_holder_that_is_gone_is_an_orphan() -> None:
    me = owner_id()
    host, pid, nonce = me.split(":")
    assert not orphaned(me, me)
    assert orphaned(f"{host}:{pid}:00000000", me)  # this process id before a restart
    assert orphaned(f"{host}:{2**22 + 12345}:{nonce}", me)  # no such process
    assert not orphaned(f"{host}:1:{nonce}", me)  # alive
    assert not orphaned(f"elsewhere:{2**22 + 12345}:{nonce}", me)  # another host's: its lease decides
    assert orphaned(None, me)
