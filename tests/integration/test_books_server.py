"""A book as a new user would make one, on a real server over the registry weights: the sample EPUB posted
with curl, the server killed with SIGKILL midway, a new server on the same data directory finishing it;
the m4b's chapters read back by PyAV, its audio equal to an uninterrupted run's, and heard by whisper."""

from __future__ import annotations

import io
import json
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import av
import httpx
import jiwer
import numpy as np
import pytest

from api.audio.encoder import to_int16, wav_header
from api.books.read import read_book
from api.books.sqlite_store import SqliteJobStore
from scripts.harness import Server, running_server, start_server, stop_server
from scripts.hearing import normalize, transcribe

EPUB = Path(__file__).resolve().parents[1] / "data" / "books" / "alice.epub"
# Whisper's word error rate over each chapter heard (the chapters are 30-60 s of speech).
MAX_CHAPTER_WER = 0.2
RATE = 24_000


def post_with_curl(server: Server, *fields: str) -> dict[str, Any]:
    form = [argument for field in fields for argument in ("-F", field)]
    out = subprocess.run(
        ["curl", "-sS", "-F", f"file=@{EPUB}", *form, f"{server.url}/v1/audio/jobs"],
        capture_output=True,
        check=True,
        timeout=60,
    )
    job: dict[str, Any] = json.loads(out.stdout)
    assert job.get("state") == "queued", job
    return job


def poll(server: Server, job_id: str, until: Any, timeout: float = 600) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        server.check_alive()
        job: dict[str, Any] = httpx.get(f"{server.url}/v1/audio/jobs/{job_id}", timeout=10).json()
        assert job["state"] != "failed", job
        if until(job):
            return job
        assert time.monotonic() < deadline, job
        time.sleep(0.25)


def decoded(data: bytes) -> np.ndarray:
    with av.open(io.BytesIO(data)) as container:
        return np.concatenate([frame.to_ndarray().reshape(-1) for frame in container.decode(audio=0)])


def chapters_of(data: bytes) -> list[tuple[str, float]]:
    with av.open(io.BytesIO(data)) as container:
        return [
            (mark["metadata"]["title"], float(mark["start"] * mark["time_base"]))
            for mark in container.chapters()
        ]


def test_a_book_survives_sigkill_and_is_heard(registry_weights: Path, tmp_path: Path, whisper: Any) -> None:
    env = {"KOKORO_DATA_DIR": str(tmp_path / "data"), "KOKORO_ENGINE": "torch"}
    first = start_server(registry_weights, tmp_path / "first.log", **env)
    try:
        job = post_with_curl(first, "captions=true", "response_format=m4b")
        poll(first, job["id"], lambda job: job["progress"]["chunks_done"] >= 2)
        first.process.kill()  # SIGKILL: no shutdown, no lease given back
        first.process.wait()
    finally:
        stop_server(first)
    held = SqliteJobStore(tmp_path / "data" / "jobs").get(job["id"])
    assert held is not None
    assert 2 <= held.chunks_done < (held.chunks_total or held.chunks_done + 1)

    with running_server(registry_weights, tmp_path / "second.log", **env) as second:
        done = poll(second, job["id"], lambda job: job["state"] == "done")
        resumed_from = re.search(rf"book job {job['id']} .*: making units from unit (\d+)", second.log())
        assert resumed_from is not None, second.log_tail()
        assert int(resumed_from.group(1)) >= 2
        book = httpx.get(f"{second.url}{done['audio_url']}", timeout=60).content
        captions = httpx.get(f"{second.url}{done['captions_url']}", params={"format": "srt"}, timeout=60).text
        # The same book again, never interrupted: the same audio.
        again = poll(
            second, post_with_curl(second, "response_format=m4b")["id"], lambda job: job["state"] == "done"
        )
        uninterrupted = httpx.get(f"{second.url}{again['audio_url']}", timeout=60).content

    audio, expected = decoded(book), decoded(uninterrupted)
    differ = np.flatnonzero(audio != expected) if len(audio) == len(expected) else [0]
    assert len(differ) == 0, f"{len(differ)} samples differ, from {differ[0] / RATE:.2f} s"
    marks = chapters_of(book)
    assert [title for title, _ in marks] == [chapter["title"] for chapter in done["chapters"]]
    assert [start for _, start in marks] == pytest.approx(
        [c["start_time"] for c in done["chapters"]], abs=0.01
    )
    assert "Curiouser" in captions

    chapters = read_book(EPUB.read_bytes(), EPUB.name).chapters
    ends = [start for _, start in marks[1:]] + [len(audio) / RATE]
    for index in (1, 2):  # the first chapter and the second
        start, end = marks[index][1], ends[index]
        samples = audio[int(start * RATE) : int(end * RATE)]
        heard = transcribe(whisper, wav_header(RATE, 2 * len(samples)) + to_int16(samples).tobytes())
        error = jiwer.wer(normalize(chapters[index].text), normalize(heard))
        assert error <= MAX_CHAPTER_WER, (chapters[index].text, heard, error)
