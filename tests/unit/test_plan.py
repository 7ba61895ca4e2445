"""The planner: pauses, chunk boundaries across G2P pieces, nothing lost."""

from __future__ import annotations

import asyncio

from api.text.chunk import ChunkLimits, Ending, Word
from api.text.pauses import MAX_PAUSE_S, Pause, split_pauses
from api.text.plan import Planned, PlannedChunk, PlannedPause, Planner

VOCAB = {ch: i + 1 for i, ch in enumerate("abcdefghijklmnopqrstuvwxyz.,!? ")}


def words_of_factory(calls: list[str]):  # type: ignore[no-untyped-def]
    async def words_of(text: str) -> list[Word]:
        calls.append(text)
        parts = text.lower().split()
        return [Word(part, part, i < len(parts) - 1) for i, part in enumerate(parts)]

    return words_of


def plan(text: str, limits: ChunkLimits | None = None, calls: list[str] | None = None) -> list[Planned]:
    planner = Planner(
        limits or ChunkLimits(first_budget=5, target_min=20, target_max=30, hard_max=40),
        piece_chars=60,
        first_piece_chars=20,
    )

    async def collect() -> list[Planned]:
        return [
            p async for p in planner.plan(text, VOCAB, words_of_factory(calls if calls is not None else []))
        ]

    return asyncio.run(collect())


def test_split_pauses() -> None:
    parts = split_pauses("Hello. [pause:1.5s] World [PAUSE: 250ms][pause:99s]end")
    assert parts == ["Hello. ", Pause(1.5), " World ", Pause(0.25), Pause(MAX_PAUSE_S), "end"]


def test_pause_tags_become_pauses_between_chunks() -> None:
    planned = plan("one two three. [pause:2s] four five.")
    kinds = [type(p).__name__ for p in planned]
    assert kinds == ["PlannedChunk", "PlannedPause", "PlannedChunk"]
    assert planned[1] == PlannedPause(2.0)


def test_all_text_arrives_in_order_across_pieces() -> None:
    sentences = [f"sentence number {n} is here." for n in "abcdefghij"]
    calls: list[str] = []
    planned = plan(" ".join(sentences), calls=calls)
    chunks = [p for p in planned if isinstance(p, PlannedChunk)]
    assert " ".join(chunk.text for chunk in chunks).split() == " ".join(sentences).lower().split()
    assert len(calls) > 2  # phonemized piece by piece
    assert len(calls[0]) <= 30  # the first piece is short
    assert chunks[-1].ending is Ending.SENTENCE


def test_first_chunk_is_short() -> None:
    planned = plan("alpha beta, gamma delta epsilon zeta eta theta iota kappa lambda mu.")
    first = planned[0]
    assert isinstance(first, PlannedChunk)
    assert first.text == "alpha beta,"
    assert first.ending is Ending.CLAUSE


def test_nothing_to_speak_plans_nothing() -> None:
    assert plan("🙂 ☃") == []


def test_a_short_tail_before_a_pause_joins_its_chunk_and_the_pause_stays_after_it() -> None:
    limits = ChunkLimits(first_budget=5, target_min=20, target_max=30, hard_max=40, tail_min=10)
    text = "hi there. one two three four five six. ok now. [pause:1s] seven eight nine ten eleven."
    planned = plan(text, limits)
    assert [p.text if isinstance(p, PlannedChunk) else p for p in planned] == [
        "hi there.",
        "one two three four five six. ok now.",  # "ok now." (7 tokens) is not a chunk of its own
        PlannedPause(1.0),
        "seven eight nine ten eleven.",
    ]
