"""The live text splitter: where text that arrives in pieces is cut into phrases, and that nothing is lost,
doubled or cut inside a word, a number or an abbreviation, however the text is split into appends."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from api.text.live_split import Cut, PhraseSplitter, SplitRules, boundaries, ends_sentence


def feed(pieces: list[str], rules: SplitRules | None = None) -> tuple[list[str], str]:
    """The phrases cut while `pieces` arrive, and what still waits."""
    splitter = PhraseSplitter(rules)
    phrases = [phrase for piece in pieces for phrase in splitter.append(piece)]
    return phrases, splitter.pending


def tokens(text: str) -> list[str]:
    """The text as an LLM streams it: each word with the space before it."""
    words = text.split(" ")
    return [words[0], *(" " + word for word in words[1:])]


def test_a_sentence_is_spoken_once_the_next_word_starts() -> None:
    phrases, pending = feed(tokens("Hello world. How are you? Fine"))
    assert phrases == ["Hello world.", " How are you?"]
    assert pending == " Fine"


def test_a_sentence_end_waits_for_the_next_words_first_character() -> None:
    splitter = PhraseSplitter()
    assert splitter.append("Hello world.") == []
    assert splitter.append(" ") == []  # 'Dr. ' looks the same until the next word starts
    assert splitter.append("H") == ["Hello world."]


def test_a_title_stays_with_the_name_after_it() -> None:
    phrases, pending = feed(["Ask", " Dr", ".", " ", "Smith", " today", ".", " Then"])
    assert phrases == ["Ask Dr. Smith today."]
    assert pending == " Then"


@pytest.mark.parametrize(
    "text",
    [
        "It costs $3,497.50 today, I think, give or take.",
        "Pi is about 3.14159 and e is 2.71828 in most books.",
        "See Sec. 5 and Nov. 22 for e.g. the dates.",
        "J. R. R. Tolkien wrote it.",
        "We meet at 5 p.m. today and at 9 a.m. tomorrow.",
    ],
)
def test_numbers_and_abbreviations_are_never_cut_inside(text: str) -> None:
    """Character by character, the only cut is at the sentence's end (the text after it has been seen)."""
    splitter = PhraseSplitter(SplitRules(clause_words=40, max_words=40))
    phrases = [phrase for char in text + " Next" for phrase in splitter.append(char)]
    assert phrases == [text]


def test_a_word_across_two_appends_is_one_word() -> None:
    splitter = PhraseSplitter(SplitRules(clause_words=1, max_words=2))
    assert splitter.append("Hel") == []
    assert splitter.append("lo wor") == []
    assert splitter.idle() == ["Hello"]
    assert splitter.append("ld again ") == [" world again"]


def test_a_clause_boundary_is_used_once_enough_words_wait() -> None:
    rules = SplitRules(clause_words=4, max_words=40)
    phrases, pending = feed(tokens("Well, I think that the answer, to be honest, is"), rules)
    assert phrases == ["Well, I think that the answer,"]
    assert pending == " to be honest, is"


def test_a_long_run_without_punctuation_is_cut_at_a_whole_word() -> None:
    text = " ".join(f"word{i}" for i in range(12))
    phrases, pending = feed(tokens(text), SplitRules(clause_words=2, max_words=5))
    assert phrases[0] == "word0 word1 word2 word3 word4"
    assert "".join(phrases) + pending == text


def test_idle_speaks_whole_words_and_keeps_the_word_being_written() -> None:
    splitter = PhraseSplitter()
    splitter.append("The answer is forty")
    assert splitter.idle() == ["The answer is"]
    assert splitter.pending == " forty"
    assert splitter.idle() == []


def test_idle_does_not_leave_a_title_without_its_name() -> None:
    splitter = PhraseSplitter()
    splitter.append("Please call Dr. ")
    assert splitter.idle() == ["Please call"]
    assert splitter.append("Who now.") == []
    assert splitter.flush() == [" Dr. Who now."]


def test_flush_speaks_everything_and_clear_drops_it() -> None:
    splitter = PhraseSplitter()
    splitter.append("half a wo")
    assert splitter.flush() == ["half a wo"]
    splitter.append("something else")
    splitter.clear()
    assert splitter.pending == ""
    assert splitter.flush() == []


def test_a_line_break_ends_a_phrase_at_once() -> None:
    phrases, pending = feed(["- apples\n", "- pears"])
    assert phrases == ["- apples"]
    assert pending == "\n- pears"


def test_a_lower_case_word_after_a_period_goes_on_the_sentence() -> None:
    kinds = {b.at: b.cut for b in boundaries("at 5 p.m. today. Then")}
    assert kinds[len("at 5 p.m.")] is Cut.WORD
    assert kinds[len("at 5 p.m. today.")] is Cut.SENTENCE


def test_chinese_and_japanese_marks_cut_without_spaces() -> None:
    phrases, pending = feed(["你好。我", "很好！谢"])
    assert phrases == ["你好。", "我很好！"]
    assert pending == "谢"


def test_a_tag_is_never_cut() -> None:
    phrases, pending = feed(tokens("Wait [pause: 1 s] for it. Then"), SplitRules(clause_words=1, max_words=2))
    assert "".join(phrases) + pending == "Wait [pause: 1 s] for it. Then"
    assert all(phrase.count("[") == phrase.count("]") for phrase in phrases)


def test_rules_are_checked() -> None:
    with pytest.raises(ValueError, match="clause_words"):
        SplitRules(clause_words=10, max_words=5)


TEXTS = st.lists(
    st.sampled_from(
        [
            "Hello", "world", "Dr.", "Smith", "$3,497.50", "3.14", "e.g.", "the", "end.", "Why?", "Yes!",
            "well,", "and;", "so:", "—", "U.S.", "p.m.", "\n", "“Quoted.”", "(aside)", "[pause:1s]", "你好。",
            "Nov.", "22,", "it's", "x",
        ]
    ),
    min_size=1,
    max_size=40,
).map(" ".join)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(text=TEXTS, cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=30), data=st.data())
def test_any_split_into_appends_gives_the_text_back_in_whole_words(
    text: str, cuts: list[int], data: st.DataObject
) -> None:
    """However the text is cut into appends, with idle moments anywhere: the phrases joined give the text
    back exactly, and every phrase ends where a word of the whole text ends (no word split or doubled)."""
    points = sorted({min(cut, len(text)) for cut in cuts} | {0, len(text)})
    pieces = [text[a:b] for a, b in zip(points, points[1:], strict=False)]
    rules = SplitRules(clause_words=data.draw(st.integers(1, 6)), max_words=data.draw(st.integers(6, 12)))
    splitter = PhraseSplitter(rules)
    phrases = []
    for piece in pieces:
        phrases += splitter.append(piece)
        if data.draw(st.booleans()):
            phrases += splitter.idle()
    phrases += splitter.flush()
    assert "".join(phrases) == text
    ends = {len(text)}
    position = 0
    for phrase in phrases[:-1]:
        position += len(phrase)
        ends.add(position)
        assert not text[position - 1].isspace() or phrase.isspace()
        assert position == len(text) or not _inside_word(text, position), (phrases, position)
    assert len("".join(phrases).split()) == len(text.split())


def _inside_word(text: str, at: int) -> bool:
    """Whether `at` cuts a whitespace-separated word (Chinese and Japanese marks aside)."""
    marks = "。！？，、；：」』”’）)]"
    return not text[at - 1].isspace() and not text[at].isspace() and text[at - 1] not in marks


@pytest.mark.parametrize(
    ("text", "ends"),
    [
        ("The breeze is light. ", True),
        ('He said "no." ', True),
        ("Really? ", True),
        ("A line\n", True),
        ("In 2024. ", True),
        ("The breeze is light.", False),  # no space yet: the word may go on
        ("Hello there ", False),
        ("Dr. ", False),  # read with the next word
        ("J. ", False),  # an initial
        ("at 5 p.m. ", False),  # a period inside: 'p.m. today' goes on
        ("the U.S. ", False),
        ("e.g. ", False),
        ("", False),
    ],
)
def test_a_sentence_end_that_needs_no_next_word(text: str, ends: bool) -> None:
    assert ends_sentence(text) is ends
