"""The jobs' store, over SQLite and over a real PostgreSQL alike: a job's task held by one worker at a
time, its units claimed by many without one taken twice, leases that run out, commits that keep the audio
whole from the start (chapters' starts) whatever order units come in, and what a cancelled job refuses."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from api.books.postgres_store import PostgresJobStore
from api.books.queries import JobStore
from api.books.read import Book, Chapter, read_text
from api.books.records import JobOptions, JobState, PlannedUnit, Task
from api.books.store import open_store

A, B = "host-a:1:aaaa", "host-b:1:bbbb"  # two replicas on two machines: their leases decide
BOOK = Book("Two", (Chapter("One", "Hello there."), Chapter("Two", "Goodbye now.")))


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[JobStore]:
    url = request.getfixturevalue("postgres_url") if request.param == "postgres" else None
    opened = open_store(url, tmp_path / "local")
    yield opened
    opened.close()


def units(count: int, chapters: int = 2) -> list[PlannedUnit]:
    per = count // chapters
    return [
        PlannedUnit(i, min(i // per, chapters - 1), i % per != per - 1, 3, f'{{"n": {i}}}')
        for i in range(count)
    ]


def pcm(samples: int) -> bytes:
    return bytes(2 * samples)


def test_a_jobs_task_is_held_by_one_worker_until_its_lease_runs_out(store: JobStore) -> None:
    first = store.create(read_text("Hello there."), JobOptions("af_heart"))
    second = store.create(read_text("Hello there."), JobOptions("af_heart"))
    claimed = store.claim_task(A, 30)
    assert claimed is not None
    assert (claimed[0].id, claimed[1], claimed[0].state) == (first.id, Task.PLAN, JobState.RUNNING)
    assert store.claim_task(B, 30)[0].id == second.id  # type: ignore[index]
    assert store.claim_task(A, 30) is None
    assert store.renew(A, 30, [first.id], []) == {first.id}
    # A lease that ran out is free to anyone; the one who had it holds nothing any more.
    assert store.claim_task(B, 30, now=time.time() + 60)[0].id == first.id  # type: ignore[index]
    assert store.renew(A, 30, [first.id], []) == set()
    assert not store.add_units(first.id, A, units(4))


def test_units_are_claimed_in_order_by_many_and_committed_into_a_whole(store: JobStore) -> None:
    job = store.create(BOOK, JobOptions("af_heart"))
    store.claim_task(A, 30)
    assert store.add_units(job.id, A, units(6))
    assert store.add_units(job.id, A, units(6)[:3])  # planned again after a crash: nothing changes
    assert store.planned(job.id, A, 6, 4)
    mine, theirs = store.claim_units(A, 2, 30), store.claim_units(B, 2, 30)
    assert [unit.index for unit in mine] == [0, 1]
    assert [unit.index for unit in theirs] == [2, 3]
    assert theirs[0].plan == '{"n": 2}'
    assert not store.commit(job.id, 0, B, pcm(10), None)  # not B's
    # Out of order: the chapters' starts wait for the audio before them.
    assert store.commit(job.id, 3, B, pcm(40), [[0, 5, 0.0, 0.1]])
    assert store.commit(job.id, 2, B, pcm(30), None)
    record = store.get(job.id)
    assert record is not None
    assert (record.units_done, record.samples_done, record.chapter_starts) == (2, 70, [None, None])
    assert store.commit(job.id, 0, A, pcm(10), None)
    assert store.get(job.id).chapter_starts == [0, None]  # type: ignore[union-attr]
    assert store.commit(job.id, 1, A, pcm(20), None)
    assert store.get(job.id).chapter_starts == [0, 60]  # type: ignore[union-attr]
    assert store.claim_task(A, 30) is None  # not every unit is made: nothing to assemble
    # B dies with units 4 and 5 claimed: A takes them once B's leases run out.
    assert [unit.index for unit in store.claim_units(B, 5, 30)] == [4, 5]
    assert store.claim_units(A, 5, 30) == []
    later = time.time() + 60
    assert [unit.index for unit in store.claim_units(A, 5, 30, now=later)] == [4, 5]
    assert not store.commit(job.id, 4, B, pcm(50), None)
    for index in (4, 5):
        assert store.commit(job.id, index, A, pcm(50 + index), None)
    record = store.get(job.id)
    assert record is not None
    assert (record.units_done, record.chunks_done, record.characters_done) == (6, 4, 18)
    claimed = store.claim_task(B, 30, now=later)
    assert claimed is not None
    assert claimed[1] is Task.ASSEMBLE
    audio = b"".join(store.audio(job.id))
    assert len(audio) == 2 * (10 + 20 + 30 + 40 + 54 + 55)
    made = store.units(job.id)
    assert [unit.index for unit in made] == list(range(6))
    assert made[3].timed == [[0, 5, 0.0, 0.1]]
    output = store.work_dir(job.id) / "book.m4b"
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_bytes(b"a finished file" * 1000)
    assert not store.finish(job.id, A, output)
    assert store.finish(job.id, B, output)
    done = store.get(job.id)
    assert done is not None
    assert (done.state, done.file_bytes) == (JobState.DONE, 15000)
    deleted_elsewhere = store.work_dir("job_" + "0" * 20)
    if isinstance(store, PostgresJobStore):
        output.unlink()  # as on another machine: the file comes from the database
        deleted_elsewhere.mkdir()  # a copy of a job that another replica deleted
    assert store.output(done).read_bytes() == b"a finished file" * 1000
    assert not deleted_elsewhere.exists()


def test_only_the_work_in_hand_is_renewed(store: JobStore) -> None:
    """A claim whose answer was lost (the connection cut after the database committed it) leaves units
    that `A` holds in the database but is not making: they are not renewed, and another takes them once
    their lease runs out."""
    job = store.create(BOOK, JobOptions("af_heart"))
    store.claim_task(A, 30)
    store.add_units(job.id, A, units(4))
    store.planned(job.id, A, 4, 2)
    assert [unit.index for unit in store.claim_units(A, 3, 30)] == [0, 1, 2]
    assert store.renew(A, 120, [], [(job.id, 0), (job.id, 2)]) == {job.id}  # unit 1's answer was lost
    later = time.time() + 60
    assert [unit.index for unit in store.claim_units(B, 4, 30, now=later)] == [1, 3]
    assert store.renew(A, 120, [], [(job.id, 1)]) == set()  # B's now
    assert store.commit(job.id, 0, A, pcm(10), None)
    assert store.renew(A, 120, [], [(job.id, 0)]) == {job.id}  # made, its task not yet over: still A's


def test_a_commit_tried_again_is_kept_once(store: JobStore) -> None:
    """A commit whose answer was lost is tried again: it is kept, and counted once."""
    job = store.create(BOOK, JobOptions("af_heart"))
    store.claim_task(A, 30)
    store.add_units(job.id, A, units(2))
    store.planned(job.id, A, 2, 1)
    store.claim_units(A, 2, 30)
    assert store.commit(job.id, 0, A, pcm(10), None)
    assert store.commit(job.id, 0, A, pcm(10), None)
    assert not store.commit(job.id, 0, B, pcm(10), None)
    record = store.get(job.id)
    assert record is not None
    assert (record.units_done, record.samples_done) == (1, 10)


def test_claimers_at_once_never_take_a_unit_twice(store: JobStore) -> None:
    job = store.create(BOOK, JobOptions("af_heart"))
    store.claim_task(A, 30)
    store.add_units(job.id, A, units(200))
    taken: Counter[int] = Counter()
    lock = threading.Lock()

    def claim(owner: str) -> None:
        while batch := store.claim_units(owner, 3, 30):
            with lock:
                taken.update(unit.index for unit in batch)

    workers = [threading.Thread(target=claim, args=(f"host-{n}:1:{n:04d}",)) for n in range(6)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert taken == Counter(range(200))


def test_a_deleted_job_refuses_its_units_and_a_failed_one_its_claims(store: JobStore) -> None:
    job = store.create(BOOK, JobOptions("af_heart"))
    store.claim_task(A, 30)
    store.add_units(job.id, A, units(4))
    store.claim_units(A, 4, 30)
    store.fail(job.id, "broke", "job_failed")
    assert not store.commit(job.id, 0, A, pcm(10), None)
    assert store.claim_units(B, 4, 30, now=time.time() + 60) == []
    assert store.get(job.id).state is JobState.FAILED  # type: ignore[union-attr]
    assert store.delete(job.id)
    assert store.get(job.id) is None
    assert not store.delete(job.id)
    assert store.units_waiting() == 0
