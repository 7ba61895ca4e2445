"""The token-count chunker: limits, boundaries, first-chunk budget; properties with hypothesis."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from api.text.chunk import (
    Chunker,
    ChunkLimits,
    Word,
    chunk_words,
    is_boundary,
    is_sentence_end,
    phonemes_of,
    text_of,
)
from api.weights.layout import MAX_PHONEMES

LIMITS = ChunkLimits(first_budget=40, target_min=175, target_max=250, hard_max=450)


def words_of(spec: str) -> list[Word]:
    """'aaaa bb. ccc,' -> words with those phonemes (punctuation attached, as sizes only matter)."""
    return [Word(text=token, phonemes=token) for token in spec.split()]


def sentence(n_words: int, length: int = 6, end: str = ".") -> list[Word]:
    words = [Word(f"w{i}", "x" * length) for i in range(n_words)]
    return [*words[:-1], Word("end", "x" * (length - 1) + end)]


def test_first_chunk_ends_at_the_first_boundary_after_the_budget() -> None:
    words = words_of("aaaa bbbb, cccc dddd eeee ffff gggg hhhh. iiii jjjj")
    chunks = list(chunk_words(words, ChunkLimits(first_budget=12, target_min=20, target_max=30, hard_max=40)))
    assert phonemes_of(chunks[0]) == "aaaa bbbb,"
    assert [w for chunk in chunks for w in chunk] == words


def spoken(text: str) -> list[Word]:
    """Words whose phonemes are their text: sizes follow the text's length."""
    return [Word(text=token, phonemes=token) for token in text.split()]


FIRST = ChunkLimits(first_budget=20, target_min=175, target_max=250, hard_max=450, first_max=50)


def test_a_long_first_sentence_is_cut_before_a_clause_opener() -> None:
    words = spoken("The train for everyone leaves the platform which was built long ago by the river.")
    chunks = list(chunk_words(words, FIRST))
    assert text_of(chunks[0]) == "The train for everyone leaves the platform"
    assert [w for chunk in chunks for w in chunk] == words


def test_a_comma_before_the_limit_beats_an_opener() -> None:
    words = spoken("Slowly and carefully, she opened the letter that had come by the early post today.")
    assert text_of(next(chunk_words(words, FIRST))) == "Slowly and carefully,"


def test_a_preposition_when_no_clause_opener_fits() -> None:
    words = spoken("Our support team is available from nine in the morning every single day of the week.")
    assert text_of(next(chunk_words(words, FIRST))) == "Our support team is available from nine"


def test_the_last_word_that_fits_when_no_phrase_break_does() -> None:
    words = spoken("Seven hundred thirty three apples rolled quickly downhill yesterday evening.")
    first = next(chunk_words(words, FIRST))
    assert text_of(first) == "Seven hundred thirty three apples rolled quickly"
    assert len(phonemes_of(first)) <= FIRST.first_cap


def test_a_short_first_piece_is_not_taken_for_a_phrase_break() -> None:
    # "and" after 3 tokens would make a tiny first chunk: a cut leaves at least half the first budget.
    words = spoken("Yes and the committee approved everything everybody proposed yesterday afternoon.")
    first = next(chunk_words(words, FIRST))
    assert len(phonemes_of(first)) >= FIRST.first_budget // 2


def test_a_sentence_within_first_max_is_not_cut() -> None:
    words = spoken("The train leaves at nine from platform two.")
    assert list(chunk_words(words, FIRST)) == [words]


def test_normal_chunks_close_at_sentence_ends_past_target_min() -> None:
    words = sentence(10) * 20  # 70-token sentences
    chunks = list(chunk_words(words, LIMITS))
    sizes = [len(phonemes_of(chunk)) for chunk in chunks]
    assert all(is_sentence_end(chunk[-1]) for chunk in chunks)
    assert all(175 <= size <= 250 for size in sizes[1:-1]), sizes


def test_long_unpunctuated_text_is_cut_within_hard_max() -> None:
    words = [Word(f"w{i}", "x" * (3 + i % 7)) for i in range(2000)]
    chunks = list(chunk_words(words, LIMITS))
    assert all(len(phonemes_of(chunk)) <= 450 for chunk in chunks)
    assert [w for chunk in chunks for w in chunk] == words


def test_a_giant_word_is_cut_hard_and_kept_whole() -> None:
    giant = Word("giant", "y" * 1200)
    chunks = list(chunk_words([Word("a", "aa"), giant, Word("b", "bb.")], LIMITS))
    assert all(len(phonemes_of(chunk)) <= 450 for chunk in chunks)
    assert "".join(w.phonemes for chunk in chunks for w in chunk) == "aa" + "y" * 1200 + "bb."


def test_clause_boundaries_are_used_when_sentences_run_long() -> None:
    clause = [*[Word(f"w{i}", "xxxxx") for i in range(7)], Word("c", "xxxx,")]  # 48 tokens
    chunks = list(chunk_words(clause * 20, LIMITS))
    assert all(is_boundary(chunk[-1]) for chunk in chunks)
    assert all(len(phonemes_of(chunk)) <= 450 for chunk in chunks)


TAILS = ChunkLimits(first_budget=20, target_min=100, target_max=150, hard_max=250, tail_min=50)


def test_a_short_last_sentence_joins_the_chunk_before_it() -> None:
    words = [*sentence(4), *sentence(15), *sentence(4)]  # 27, 104 and 27 tokens
    sizes = [len(phonemes_of(chunk)) for chunk in chunk_words(words, TAILS)]
    assert sizes == [27, 132]
    untailed = ChunkLimits(first_budget=20, target_min=100, target_max=150, hard_max=250)
    assert [len(phonemes_of(chunk)) for chunk in chunk_words(words, untailed)] == [27, 104, 27]


def test_a_tail_of_tail_min_tokens_is_a_chunk_of_its_own() -> None:
    words = [*sentence(4), *sentence(15), *sentence(8)]  # 27, 104 and 55 tokens
    assert [len(phonemes_of(chunk)) for chunk in chunk_words(words, TAILS)] == [27, 104, 55]


def test_a_tail_that_would_pass_hard_max_stays_apart() -> None:
    words = [*sentence(4), *sentence(33), *sentence(6)]  # 27, 230 and 41 tokens
    assert [len(phonemes_of(chunk)) for chunk in chunk_words(words, TAILS)] == [27, 230, 41]


def test_the_first_chunk_takes_no_tail() -> None:
    words = [*sentence(4), *sentence(2)]  # 27 and 13 tokens: time to first audio comes first
    assert [len(phonemes_of(chunk)) for chunk in chunk_words(words, TAILS)] == [27, 13]


def test_a_held_chunk_is_released_once_tail_min_tokens_follow_it() -> None:
    chunker = Chunker(TAILS)
    assert [len(chunk) for word in sentence(4) for chunk in chunker.push(word)] == [4]
    assert [chunk for word in sentence(15) for chunk in chunker.push(word)] == []  # held
    released = [chunk for word in sentence(8) for chunk in chunker.push(word)]
    assert [len(phonemes_of(chunk)) for chunk in released] == [104]  # before the text ends
    assert [len(phonemes_of(chunk)) for chunk in chunker.flush()] == [55]


def test_limits_are_validated() -> None:
    with pytest.raises(ValueError, match="target_min"):
        ChunkLimits(target_min=300, target_max=200)
    with pytest.raises(ValueError, match="510"):
        ChunkLimits(hard_max=600)
    with pytest.raises(ValueError, match="first_max"):
        ChunkLimits(first_budget=50, first_max=40)
    with pytest.raises(ValueError, match="tail_min"):
        ChunkLimits(target_min=100, target_max=150, hard_max=250, tail_min=101)


phoneme_words = st.builds(
    Word,
    text=st.text(alphabet="abc", min_size=1, max_size=5),
    phonemes=st.text(alphabet="abcdəɹˈ", min_size=1, max_size=30).flatmap(
        lambda core: st.sampled_from(["", ".", ",", "!", "?", ";", ":", "—", ".”"]).map(
            lambda end: core + end
        )
    ),
    space=st.booleans(),
)
giant_words = st.builds(
    Word, text=st.just("giant"), phonemes=st.text(alphabet="xy", min_size=460, max_size=1500)
)


@settings(max_examples=300, deadline=None)
@given(
    words=st.lists(st.one_of(phoneme_words, phoneme_words, phoneme_words, giant_words), max_size=400),
    first_budget=st.integers(1, 100),
    first_extra=st.integers(0, 400),
    tail_min=st.sampled_from([0, 1, 50, 175]),
)
def test_properties(words: list[Word], first_budget: int, first_extra: int, tail_min: int) -> None:
    limits = ChunkLimits(
        first_budget=first_budget, first_max=min(first_budget + first_extra, 450), tail_min=tail_min
    )
    chunks = list(chunk_words(words, limits))
    # The first chunk stays within first_max unless its first word alone is longer.
    if chunks and len(chunks[0]) > 1:
        assert len(phonemes_of(chunks[0])) <= limits.first_cap
    # Within limits, never above the model's.
    assert all(0 < len(phonemes_of(chunk)) <= limits.hard_max <= MAX_PHONEMES for chunk in chunks)
    assert all(chunk for chunk in chunks)
    # Exactly the input, in order: giants may be cut into pieces, nothing else changes.
    assert "".join(w.phonemes for c in chunks for w in c) == "".join(w.phonemes for w in words)
    assert [w.text for c in chunks for w in c if w.text] == [w.text for w in words if w.text]


@settings(max_examples=50, deadline=None)
@given(n=st.integers(1, 3000))
def test_punctuation_free_streams(n: int) -> None:
    words = [Word("w", "x" * (1 + i % 11)) for i in range(n)]
    chunks = list(chunk_words(words))
    assert [w for chunk in chunks for w in chunk] == words
    assert all(len(phonemes_of(chunk)) <= 450 for chunk in chunks)
