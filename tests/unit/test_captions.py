"""Word timings: origins through normalization, words in chunks, times from durations, caption items."""

from __future__ import annotations

import asyncio
import re

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

from api.speech.captions import Captions, Timed, WordTime, chunk_timings, input_words, sound_lead
from api.text.chunk import ChunkLimits, Word
from api.text.normalize import normalize_tracked
from api.text.plan import PlannedChunk, PlannedWord, Planner
from api.text.tracked import Tracked

VOCAB = {ch: i + 1 for i, ch in enumerate("abcdefghijklmnopqrstuvwxyz.,!?$ ")}


def origins(text: str) -> list[tuple[str, str]]:
    """Each normalized word with the input text it came from."""
    tracked = normalize_tracked(text)
    pairs = []
    for match in re.finditer(r"\S+", tracked.text):
        span = tracked.span(match.start(), match.end())
        assert span is not None
        pairs.append((match.group(), text[span[0] : span[1]]))
    return pairs


def test_tracked_sub_keeps_untouched_characters_and_maps_replacements_to_what_they_replace() -> None:
    tracked = Tracked.of("pay 5 now").sub(re.compile(r"\d"), "five")
    assert tracked.text == "pay five now"
    assert tracked.span(0, 3) == (0, 3)
    assert tracked.span(4, 8) == (4, 5)
    assert tracked.span(9, 12) == (6, 9)


def test_tracked_keeps_the_words_a_rule_kept() -> None:
    tracked = Tracked.of("Henry VIII ruled").sub(re.compile(r"Henry VIII"), "Henry the eighth")
    assert tracked.span(0, 5) == (0, 5)
    assert tracked.span(6, 16) == (6, 10)
    assert tracked.span(17, 22) == (11, 16)


def test_tracked_strip_and_keep() -> None:
    tracked = Tracked.of("  a😀b  ").strip().keep(lambda char: char != "😀")
    assert tracked.text == "ab"
    assert tracked.span(1, 2) == (4, 5)


def test_normalized_words_come_from_the_written_forms() -> None:
    pairs = origins("Tickets cost $3,497.50 each, Henry VIII said, at 3:30 PM. Visit example.com today.")
    assert ("cost", "cost") in pairs
    assert [source for word, source in pairs if source.startswith("$")] == ["$3,497.50"] * 9
    assert ("the", "VIII") in pairs
    assert ("eighth", "VIII") in pairs
    assert ("thirty", "3:30") in pairs
    assert ("dot", "example.com") in pairs
    assert pairs[-1] == ("today.", "today.")


def test_normalize_false_maps_every_character_to_itself() -> None:
    from api.text.normalize import NormalizationOptions

    tracked = normalize_tracked("$5 now", NormalizationOptions(normalize=False))
    assert tracked.text == "$5 now"
    assert tracked.span(0, 2) == (0, 2)


def planned_chunks(text: str) -> list[PlannedChunk]:
    async def words_of(piece: str) -> list[Word]:
        tokens = re.findall(r"\w+|[^\w\s]", piece)
        return [Word(token, token.lower(), True) for token in tokens]

    planner = Planner(ChunkLimits(first_budget=8, target_min=10, target_max=20, hard_max=30), 60, 20)

    async def collect() -> list[PlannedChunk]:
        return [p async for p in planner.plan(text, VOCAB, words_of) if isinstance(p, PlannedChunk)]

    return asyncio.run(collect())


def test_planned_words_know_their_tokens_and_their_input() -> None:
    text = "Hello, world. Pay me now!"
    chunks = planned_chunks(text)
    words = [(chunk, word) for chunk in chunks for word in chunk.words]
    spoken = [(chunk, word) for chunk, word in words if word.tokens is not None]
    assert [text[w.origin[0] : w.origin[1]] for _, w in spoken if w.origin] == [
        "Hello",
        "world",
        "Pay",
        "me",
        "now",
    ]
    for chunk, word in spoken:
        assert word.tokens is not None
        sounds = "".join(
            next(k for k, v in VOCAB.items() if v == t) for t in chunk.tokens[slice(*word.tokens)]
        )
        assert word.origin is not None
        assert sounds == text[word.origin[0] : word.origin[1]].lower()
    assert all(word.tokens is None for _, word in words if word.origin and text[slice(*word.origin)] in ",.!")


def test_chunk_timings_follow_durations_lead_trim_and_offset() -> None:
    words = (PlannedWord((0, 5), (0, 2)), PlannedWord((5, 6), None), PlannedWord((7, 12), (3, 5)))
    durations = np.array([12, 2, 2, 1, 3, 3, 2])  # boundary, five tokens, boundary
    timed = chunk_timings(words, durations, trimmed=1200, kept=12000, offset=2400, sample_rate=24000)
    # "hello" spans frames 12..16 (samples 7200..9600) and "world" 17..23 (10200..13800), heard
    # sound_lead(1.0) before them, shifted by the 1200 trimmed, then 2400 in.
    lead = round(sound_lead(1.0) * 24000)
    assert 0.08 < lead / 24000 < 0.11
    shifted = [(7200, 9600), (10200, 13800)]
    expected = [(sample - lead - 1200 + 2400) / 24000 for span in shifted for sample in span]
    assert timed == [Timed((0, 5), *expected[:2]), Timed((7, 12), *expected[2:])]
    clipped = chunk_timings(words, durations, trimmed=1200, kept=3000, offset=0, sample_rate=24000)
    assert clipped[1].end == 3000 / 24000


def test_the_lead_stretches_with_slower_speech() -> None:
    assert sound_lead(0.8) > sound_lead(1.0) > sound_lead(1.3) > 0.06
    words = (PlannedWord((0, 5), (0, 2)),)
    durations = np.array([12, 2, 2, 1])

    def start(speed: float) -> float:
        timed = chunk_timings(
            words, durations, trimmed=0, kept=9000, offset=0, sample_rate=24000, speed=speed
        )
        return timed[0].start

    assert start(0.8) == (7200 - round(sound_lead(0.8) * 24000)) / 24000
    assert start(0.8) < start(1.0) < start(1.3)


def voiced_at(*spans: tuple[int, int], length: int = 12600) -> np.ndarray:
    voiced = np.zeros(length, dtype=bool)
    for begin, end in spans:
        voiced[begin:end] = True
    return voiced


def test_chunk_timings_start_a_word_after_a_pause_where_its_sound_begins() -> None:
    words = (PlannedWord((0, 5), (0, 2)), PlannedWord((7, 12), (3, 5)))
    durations = np.array([8, 2, 2, 1, 3, 3, 2])  # frames: "hello" samples 4800..7200, "world" 7800..11400
    lead = round(sound_lead(1.0) * 24000)

    def starts(voiced: np.ndarray | None) -> list[int]:
        timed = chunk_timings(
            words, durations, trimmed=0, kept=12600, offset=0, sample_rate=24000, voiced=voiced
        )
        return [round(item.start * 24000) for item in timed]

    assert starts(None) == [4800 - lead, 7800 - lead]
    # Sound from 3000 after the leading silence; 400 silent samples (under 100 ms) are no pause, and
    # "world" is heard the lead before its frames.
    assert starts(voiced_at((3000, 7300), (7700, 11400))) == [3000, 7800 - lead]
    # A pause that began inside "hello"'s frames (5000..7400, 100 ms): "world" sounds from 7400.
    assert starts(voiced_at((3000, 5000), (7400, 11400))) == [3000, 7400]
    # A click splits a silence into two shorter ones; sound that begins after the frames' start changes
    # nothing (a closure's silence belongs to the word); nor does speech without a pause.
    assert starts(voiced_at((3000, 5000), (6000, 6010), (7400, 11400))) == [3000, 7800 - lead]
    assert starts(voiced_at((3000, 5000), (8000, 11400))) == [3000, 7800 - lead]
    assert starts(voiced_at((0, 7200), (7300, 11400))) == [4800 - lead, 7800 - lead]


@settings(max_examples=200, deadline=None)
@given(
    durations=st.lists(st.integers(0, 30), min_size=3, max_size=40),
    silences=st.lists(st.tuples(st.integers(0, 30000), st.integers(0, 6000)), max_size=6),
    speed=st.floats(0.5, 2.0),
    trimmed=st.integers(0, 3000),
)
# A pause's onset moved a word later than its frames, and the next word (no frames of its own) started
# before it ended (hypothesis found it).
@example(durations=[0, 2, 9, 0, 0, 0, 0], silences=[(3717, 2400)], speed=1.0, trimmed=0)
def test_word_times_are_in_order_and_never_overlap(
    durations: list[int], silences: list[tuple[int, int]], speed: float, trimmed: int
) -> None:
    """Whatever the durations, the silences in the audio and the speed: each word ends no earlier than it
    starts and starts no earlier than the word before it ends."""
    tokens = len(durations) - 2  # a boundary token at each end
    words = tuple(PlannedWord((k, k + 1), (k, k + 1)) for k in range(0, tokens, 2))
    length = sum(durations) * 600
    voiced = np.ones(length, dtype=bool)
    for begin, size in silences:
        voiced[begin : begin + size] = False
    timed = chunk_timings(
        words,
        np.array(durations),
        trimmed=trimmed,
        kept=max(length - trimmed, 0),
        offset=0,
        sample_rate=24000,
        speed=speed,
        voiced=voiced,
    )
    assert len(timed) == len(words)
    for before, after in zip(timed, timed[1:], strict=False):
        assert after.start >= before.end
    assert all(item.end >= item.start >= 0 for item in timed)


def test_input_words_skip_pause_tags_and_keep_misaki_syntax_whole() -> None:
    text = "Say [Kokoro](/kˈOkəɹO/) now [pause:1s] please."
    assert [text[a:b] for a, b in input_words(text)] == ["Say", "[Kokoro](/kˈOkəɹO/)", "now", "please."]


def build(text: str, timed: list[Timed]) -> list[WordTime]:
    captions = Captions(text)
    return captions.add(timed) + captions.finish()


def test_every_input_word_once_in_order_with_punctuation_attached() -> None:
    text = "“Well — the $5 fee,” she said… 🙂 ok"
    spans = {
        word: (text.index(word), text.index(word) + len(word)) for word in ("Well", "the", "$5", "she", "ok")
    }
    timed = [
        Timed(spans["Well"], 0.0, 0.3),
        Timed(spans["the"], 0.4, 0.5),
        Timed(spans["$5"], 0.5, 0.8),  # "five" ...
        Timed(spans["$5"], 0.8, 1.1),  # ... "dollars": one item
        Timed((text.index("fee"), text.index("fee") + 3), 1.1, 1.4),
        Timed(spans["she"], 1.6, 1.8),
        Timed((text.index("said"), text.index("said") + 4), 1.8, 2.0),
        Timed(None, 2.0, 2.1),  # a G2P word not found in the text: joins the item it falls in
        Timed(spans["ok"], 2.5, 2.8),
    ]
    items = build(text, timed)
    assert [item.word for item in items] == ["“Well —", "the", "$5", "fee,”", "she", "said… 🙂", "ok"]
    assert " ".join(item.word for item in items).split() == text.split()
    assert items[2] == WordTime("$5", 0.5, 1.1)
    assert items[5].end_time == 2.1
    assert all(a.start_time <= b.start_time for a, b in zip(items, items[1:], strict=False))


def test_words_read_as_one_make_one_item() -> None:
    text = "Due Nov 22, 2026 ok"
    date = (text.index("Nov"), text.index("2026") + 4)
    items = build(
        text, [Timed((0, 3), 0, 0.2), Timed(date, 0.3, 0.6), Timed(date, 0.6, 1.5), Timed((17, 19), 1.6, 1.8)]
    )
    assert [item.word for item in items] == ["Due", "Nov 22, 2026", "ok"]


def test_an_item_closes_when_the_next_chunk_starts_a_new_word() -> None:
    text = "one two three"
    captions = Captions(text)
    assert captions.add([Timed((0, 3), 0.0, 0.2), Timed((4, 7), 0.3, 0.5)]) == [WordTime("one", 0.0, 0.2)]
    assert captions.close_before((4, 7)) == []  # the next chunk goes on with "two"
    assert captions.close_before(None) == []
    assert captions.close_before((8, 13)) == [WordTime("two", 0.3, 0.5)]
    assert captions.add([Timed((8, 13), 0.6, 0.9)]) == []
    assert captions.finish() == [WordTime("three", 0.6, 0.9)]
    assert captions.finish() == []
