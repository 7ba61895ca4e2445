"""Subtitles from word timestamps: grouping rules, line balance, timing, exact SRT and WebVTT text."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from api.text.subtitles import Cue, CueLimits, TimedWord, group_cues, render, to_srt, to_vtt

# Slack for float sums in timing checks (a start plus min_duration, minus the start).
EPSILON = 1e-9
TIMING = re.compile(r"\d{2,}:\d{2}:\d{2}[,.]\d{3} --> \d{2,}:\d{2}:\d{2}[,.]\d{3}")


def spoken(text: str, start: float = 0.0, step: float = 0.3, length: float = 0.25) -> list[TimedWord]:
    """'a b. c' -> words one `step` apart, each heard for `length` seconds."""
    return [
        TimedWord(token, start + step * index, start + step * index + length)
        for index, token in enumerate(text.split())
    ]


def words_in(cue: Cue) -> list[str]:
    return " ".join(cue.lines).split(" ")


def texts(cues: list[Cue]) -> list[tuple[str, ...]]:
    return [cue.lines for cue in cues]


# Properties over random words: punctuation, over-long words, pauses, overlaps and negative times.

WORD_TEXT = st.one_of(
    st.text(alphabet="abcdefg.,;:!?—\"')", min_size=1, max_size=12),
    st.text(alphabet="xyz", min_size=43, max_size=60),
)
LIMITS = st.builds(
    CueLimits,
    max_line_chars=st.integers(10, 50),
    max_lines=st.integers(1, 3),
    max_duration=st.floats(1.0, 10.0),
    min_duration=st.floats(0.1, 1.0),
)


@st.composite
def timed_words(draw: st.DrawFn) -> list[TimedWord]:
    words = []
    time = draw(st.floats(-0.5, 1.0))
    for text in draw(st.lists(WORD_TEXT, max_size=60)):
        time += draw(st.floats(-0.2, 1.5))
        length = draw(st.floats(0.0, 3.0))
        words.append(TimedWord(text, time, time + length))
        time += length
    return words


PROPERTY = settings(max_examples=150, deadline=None)


@PROPERTY
@given(timed_words(), LIMITS)
def test_every_word_appears_once_in_order(words: list[TimedWord], limits: CueLimits) -> None:
    cues = group_cues(words, limits)
    assert [word for cue in cues for word in words_in(cue)] == [word.word for word in words]
    assert " ".join(line for cue in cues for line in cue.lines) == " ".join(word.word for word in words)


@PROPERTY
@given(timed_words(), LIMITS)
def test_lines_respect_length_and_count(words: list[TimedWord], limits: CueLimits) -> None:
    for cue in group_cues(words, limits):
        assert 1 <= len(cue.lines) <= limits.max_lines
        for line in cue.lines:
            assert line
            assert len(line) <= limits.max_line_chars or " " not in line


@PROPERTY
@given(timed_words(), LIMITS)
def test_cues_last_at_most_max_duration_unless_one_word(words: list[TimedWord], limits: CueLimits) -> None:
    for cue in group_cues(words, limits):
        if len(words_in(cue)) > 1:
            assert cue.end_time - cue.start_time <= limits.max_duration + EPSILON


@PROPERTY
@given(timed_words(), LIMITS)
def test_cues_are_ordered_never_overlap_and_last_min_duration(
    words: list[TimedWord], limits: CueLimits
) -> None:
    cues = group_cues(words, limits)
    next_starts = [cue.start_time for cue in cues[1:]] + [float("inf")]
    for cue, next_start in zip(cues, next_starts[: len(cues)], strict=True):
        assert 0 <= cue.start_time <= cue.end_time
        assert cue.end_time <= next_start
        assert cue.end_time >= min(cue.start_time + limits.min_duration, next_start) - EPSILON


@PROPERTY
@given(timed_words(), LIMITS)
def test_two_line_cues_take_the_most_balanced_break(words: list[TimedWord], limits: CueLimits) -> None:
    for cue in group_cues(words, limits):
        tokens = words_in(cue)
        if len(cue.lines) != 2 or any(len(token) > limits.max_line_chars for token in tokens):
            continue
        splits = [(" ".join(tokens[:cut]), " ".join(tokens[cut:])) for cut in range(1, len(tokens))]
        differences = [
            abs(len(a) - len(b)) for a, b in splits if max(len(a), len(b)) <= limits.max_line_chars
        ]
        assert abs(len(cue.lines[0]) - len(cue.lines[1])) == min(differences)


@PROPERTY
@given(timed_words(), LIMITS)
def test_rendered_files_hold_one_block_per_cue(words: list[TimedWord], limits: CueLimits) -> None:
    cues = group_cues(words, limits)
    srt, vtt = render(words, "srt", limits), render(words, "vtt", limits)
    assert len(srt.split("\n\n") if srt else []) == len(cues)
    assert len(vtt.split("\n\n")) == len(cues) + 1
    for text in (srt, vtt):
        arrows = [line for line in text.splitlines() if "-->" in line]
        assert len(arrows) == len(cues)
        assert all(TIMING.fullmatch(line) for line in arrows)


# Grouping rules, by example.


def test_a_sentence_end_closes_the_cue() -> None:
    words = spoken('Hello there. He said "stop." Then (he left!) and… waited')
    assert texts(group_cues(words)) == [
        ("Hello there.",),
        ('He said "stop."',),
        ("Then (he left!)",),
        ("and…",),
        ("waited",),
    ]


def test_a_long_pause_starts_a_new_cue_and_a_short_one_does_not() -> None:
    words = [
        TimedWord("one", 0.0, 0.3),
        TimedWord("two", 0.35, 0.6),
        TimedWord("three", 1.8, 2.1),  # 1.2 s of silence before it
        TimedWord("four", 3.0, 3.2),  # 0.9 s
    ]
    cues = group_cues(words)
    assert texts(cues) == [("one two",), ("three four",)]
    assert (cues[0].start_time, cues[0].end_time) == (0.0, 0.8)  # extended to min_duration, not to 1.8


def test_a_cue_closes_before_it_would_outlast_max_duration() -> None:
    words = [TimedWord("w", 0.5 * index, 0.5 * (index + 1)) for index in range(20)]
    cues = group_cues(words)
    assert [len(words_in(cue)) for cue in cues] == [14, 6]
    assert [(cue.start_time, cue.end_time) for cue in cues] == [(0.0, 7.0), (7.0, 10.0)]


def test_a_single_word_longer_than_max_duration_stays_on_its_own() -> None:
    cues = group_cues([TimedWord("Mmmmmm", 0.0, 9.0), TimedWord("ok", 9.1, 9.3)])
    assert texts(cues) == [("Mmmmmm",), ("ok",)]
    assert cues[0].end_time == 9.0


def test_a_full_cue_ends_after_clause_punctuation_in_its_second_half() -> None:
    one_line = CueLimits(max_line_chars=20, max_lines=1)
    assert texts(group_cues(spoken("alpha beta, gamma delta epsilon"), one_line)) == [
        ("alpha beta,",),
        ("gamma delta epsilon",),
    ]
    # A comma in the first half would leave too short a cue: the cue is cut where the text ran out.
    assert texts(group_cues(spoken("a, beta gamma delta epsilon"), one_line)) == [
        ("a, beta gamma delta",),
        ("epsilon",),
    ]


def test_max_lines_bounds_a_cue() -> None:
    words = spoken("one two three four five six seven eight nine ten eleven twelve", step=0.1)
    assert texts(group_cues(words, CueLimits(max_line_chars=14, max_lines=1))) == [
        ("one two three",),
        ("four five six",),
        ("seven eight",),
        ("nine ten",),
        ("eleven twelve",),
    ]
    assert texts(group_cues(words, CueLimits(max_line_chars=14, max_lines=2))) == [
        ("one two three", "four five six"),
        ("seven eight", "nine ten"),
        ("eleven twelve",),
    ]


def test_two_lines_break_near_the_middle() -> None:
    text = "This sentence is long enough to need a second line on screen."
    assert len(text) == 61
    [cue] = group_cues(spoken(text))
    # Filling greedily would give "This sentence is long enough to need a" (38) and "second line on
    # screen." (22).
    assert cue.lines == ("This sentence is long enough to", "need a second line on screen.")


def test_on_a_tie_the_bottom_line_is_the_longer() -> None:
    [cue] = group_cues(spoken("aaaa bbbb cccc dddd eeee"), CueLimits(max_line_chars=20))
    assert cue.lines == ("aaaa bbbb", "cccc dddd eeee")


def test_a_word_longer_than_a_line_gets_a_line_of_its_own() -> None:
    url = "https://example.com/a/very/long/path/that/never/ends"
    assert texts(group_cues(spoken(f"see {url} ok"))) == [("see", url), ("ok",)]


def test_min_duration_extends_a_cue_up_to_the_next_one_only() -> None:
    cues = group_cues([TimedWord("Hi.", 0.0, 0.2), TimedWord("Yes.", 0.5, 0.7)])
    assert [(cue.start_time, cue.end_time) for cue in cues] == [(0.0, 0.5), (0.5, pytest.approx(1.3))]


def test_words_overlapping_in_time_give_cues_that_do_not() -> None:
    cues = group_cues([TimedWord("A.", -0.3, 1.0), TimedWord("B.", 0.5, 0.7)])
    assert [(cue.start_time, cue.end_time) for cue in cues] == [(0.0, 0.5), (0.5, pytest.approx(1.3))]


# Rendering.

EXAMPLE = [
    TimedWord("Hello,", 0.0, 0.4),
    TimedWord("world.", 0.45, 0.9),
    TimedWord("How", 1.2, 1.4),
    TimedWord("are", 1.45, 1.6),
    TimedWord("you?", 1.65, 1.9),
    TimedWord("Bye.", 2.0, 2.3),
    *spoken("This sentence is long enough to need a second line on screen.", start=3.0),
]


def test_srt_text() -> None:
    assert render(EXAMPLE, "srt") == (
        "1\n"
        "00:00:00,000 --> 00:00:00,900\n"
        "Hello, world.\n"
        "\n"
        "2\n"
        "00:00:01,200 --> 00:00:02,000\n"
        "How are you?\n"
        "\n"
        "3\n"
        "00:00:02,000 --> 00:00:02,800\n"
        "Bye.\n"
        "\n"
        "4\n"
        "00:00:03,000 --> 00:00:06,550\n"
        "This sentence is long enough to\n"
        "need a second line on screen.\n"
    )


def test_vtt_text() -> None:
    assert render(EXAMPLE, "vtt") == (
        "WEBVTT\n"
        "\n"
        "00:00:00.000 --> 00:00:00.900\n"
        "Hello, world.\n"
        "\n"
        "00:00:01.200 --> 00:00:02.000\n"
        "How are you?\n"
        "\n"
        "00:00:02.000 --> 00:00:02.800\n"
        "Bye.\n"
        "\n"
        "00:00:03.000 --> 00:00:06.550\n"
        "This sentence is long enough to\n"
        "need a second line on screen.\n"
    )


def test_vtt_escapes_markup_and_neither_format_writes_an_arrow_in_text() -> None:
    words = spoken("Tom & Jerry <3 --> x>y")
    assert render(words, "vtt").splitlines()[-1] == "Tom &amp; Jerry &lt;3 → x&gt;y"
    assert render(words, "srt").splitlines()[-1] == "Tom & Jerry <3 → x>y"


def test_whitespace_inside_a_line_cannot_end_the_cue_early() -> None:
    assert to_srt([Cue(0.0, 1.0, ("two\n\nwords",))]) == "1\n00:00:00,000 --> 00:00:01,000\ntwo words\n"


def test_timestamps_past_an_hour_rounded_half_up_never_negative() -> None:
    assert to_srt([Cue(3725.5, 3726.0, ("x",))]) == "1\n01:02:05,500 --> 01:02:06,000\nx\n"
    assert to_vtt([Cue(3725.5, 3726.0, ("x",))]) == "WEBVTT\n\n01:02:05.500 --> 01:02:06.000\nx\n"
    # 62.5 ms is exact in binary: half up gives 63 where round() would give 62.
    assert to_vtt([Cue(-0.25, 0.0625, ("x",))]) == "WEBVTT\n\n00:00:00.000 --> 00:00:00.063\nx\n"


def test_no_words_make_no_cues() -> None:
    assert group_cues([]) == []
    assert to_srt([]) == render([], "srt") == ""
    assert to_vtt([]) == render([], "vtt") == "WEBVTT\n"


# Validation.


@pytest.mark.parametrize(
    "bad",
    [
        {"max_line_chars": 9},
        {"max_lines": 0},
        {"max_duration": 0.0},
        {"min_duration": 0.0},
        {"min_duration": -1.0},
        {"min_duration": 3.0, "max_duration": 2.0},
    ],
)
def test_cue_limits_reject_impossible_values(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="must|exceeds"):
        CueLimits(**bad)  # type: ignore[arg-type]


def test_a_timed_word_needs_text_and_must_not_end_before_it_starts() -> None:
    with pytest.raises(ValueError, match="visible text"):
        TimedWord(" ", 0.0, 1.0)
    with pytest.raises(ValueError, match="before it starts"):
        TimedWord("late", 1.0, 0.5)


def test_an_unknown_format_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown subtitle format"):
        render(spoken("hi"), "ass")  # type: ignore[arg-type]
