"""The SSML translator: inline markup it emits, voice/rate segments, and the documents it refuses."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from api.errors import InvalidRequestError, kind_of
from api.text.ssml import (
    BREAK_STRENGTHS,
    MAX_DEPTH,
    PROSODY_RATES,
    SsmlScript,
    SsmlSegment,
    looks_like_ssml,
    translate,
)

BILLION_LAUGHS = """<?xml version="1.0"?>
<!DOCTYPE speak [
  <!ENTITY lol "lol">
  <!ENTITY lol1 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">
  <!ENTITY lol2 "&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;">
  <!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">
  <!ENTITY lol4 "&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;">
  <!ENTITY lol5 "&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;">
  <!ENTITY lol6 "&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;">
  <!ENTITY lol7 "&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;">
  <!ENTITY lol8 "&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;">
  <!ENTITY lol9 "&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;">
]>
<speak>&lol9;</speak>"""
EXTERNAL_ENTITY = '<!DOCTYPE speak [<!ENTITY xxe SYSTEM "file:///etc/passwd">]><speak>&xxe;</speak>'


def speak(body: str) -> str:
    return f"<speak>{body}</speak>"


def text_of(body: str) -> str:
    return translate(speak(body)).text


def covered(script: SsmlScript) -> list[tuple[str, str | None, float]]:
    return [(script.text[seg.start : seg.end], seg.voice, seg.rate) for seg in script.segments]


def refused(document: str) -> InvalidRequestError:
    with pytest.raises(InvalidRequestError) as caught:
        translate(document)
    error = caught.value
    assert (error.param, error.code, kind_of(error).status) == ("input", "invalid_ssml", 400)
    return error


def rss_bytes() -> int | None:
    status = Path("/proc/self/status")
    if not status.exists():
        return None
    for line in status.read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return None


# --- detection -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "<speak>Hello</speak>",
        "<speak/>",
        '<speak version="1.1">Hi</speak>',
        "  \n\t<speak>Hi</speak>",
        '<?xml version="1.0" encoding="UTF-8"?><speak>Hi</speak>',
        '<?xml version="1.0"?>\n  <speak\n xmlns="http://www.w3.org/2001/10/synthesis">Hi</speak>',
        "\ufeff<speak>Hi</speak>",
    ],
)
def test_looks_like_ssml_accepts_speak_documents(text: str) -> None:
    assert looks_like_ssml(text)


@pytest.mark.parametrize(
    "text",
    [
        "Hello there.",
        "<speaker>Hi</speaker>",
        "<speaking>Hi</speaking>",
        "Say <speak>Hi</speak>",
        "<p>Hi</p>",
        '<?xml version="1.0"?><p>Hi</p>',
        "",
        "<spea",
    ],
)
def test_looks_like_ssml_refuses_other_text(text: str) -> None:
    assert not looks_like_ssml(text)


# --- break -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("time_value", "tag"),
    [
        ("1.5s", "[pause:1.5s]"),
        ("2s", "[pause:2s]"),
        ("0.25s", "[pause:0.25s]"),
        ("500ms", "[pause:0.5s]"),
        ("250ms", "[pause:0.25s]"),
        ("1234ms", "[pause:1.234s]"),
        (" 1s ", "[pause:1s]"),
        # The server caps one pause at 10 s; the translator says so rather than emitting more.
        ("30s", "[pause:10s]"),
    ],
)
def test_break_time_emits_a_pause_tag(time_value: str, tag: str) -> None:
    assert text_of(f'Wait<break time="{time_value}"/>now') == f"Wait {tag} now"


@pytest.mark.parametrize(("strength", "seconds"), [("x-weak", "0.1"), ("weak", "0.25"), ("medium", "0.4")])
def test_break_strength_emits_its_duration(strength: str, seconds: str) -> None:
    assert text_of(f'Wait <break strength="{strength}"/> now') == f"Wait [pause:{seconds}s] now"


def test_every_break_strength_has_its_duration() -> None:
    for strength, seconds in BREAK_STRENGTHS.items():
        expected = f"a [pause:{seconds:g}s] b" if seconds else "a b"
        assert text_of(f'a<break strength="{strength}"/>b') == expected


def test_break_defaults_to_medium_and_time_wins_over_strength() -> None:
    assert text_of("a<break/>b") == "a [pause:0.4s] b"
    assert text_of('a<break strength="x-strong" time="300ms"/>b') == "a [pause:0.3s] b"


def test_zero_break_still_separates_words() -> None:
    assert text_of('one<break strength="none"/>two') == "one two"
    assert text_of('one<break time="0s"/>two') == "one two"


@pytest.mark.parametrize("time_value", ["fast", "1.5", "-1s", "1.5 sec", "1,5s", "s", "1e3ms", ""])
def test_invalid_break_time_is_refused_naming_the_value(time_value: str) -> None:
    error = refused(speak(f'a<break time="{time_value}"/>'))
    assert repr(time_value) in error.message


def test_unknown_break_strength_is_refused() -> None:
    assert "'loud'" in refused(speak('<break strength="loud"/>')).message


# --- p and s ---------------------------------------------------------------------------------------


def test_sentences_and_paragraphs_end_with_punctuation_and_line_breaks() -> None:
    body = "<p><s>One</s><s>Two!</s></p><p>Three</p>After"
    assert text_of(body) == "One.\nTwo!\n\nThree.\n\nAfter"


def test_sentence_keeps_its_own_punctuation_before_closing_quotes() -> None:
    assert text_of('<s>He said "stop."</s><s>Why?)</s><s>Well…</s>') == 'He said "stop."\nWhy?)\nWell…'


def test_sentence_period_goes_before_trailing_pauses() -> None:
    assert text_of("<s>Hello <break/></s><s>World</s>") == "Hello. [pause:0.4s]\nWorld."


def test_empty_sentences_add_nothing() -> None:
    assert text_of("Hi<s> </s><p></p> there") == "Hi there"


def test_sentence_of_only_a_pause_gets_a_line_break_but_no_period() -> None:
    assert text_of("Hi<s><break/></s>there") == "Hi [pause:0.4s]\nthere"


# --- prosody ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rate", "expected"),
    [
        *PROSODY_RATES.items(),
        ("80%", 0.8),
        ("150%", 1.5),
        ("+20%", 1.2),
        ("-10%", 0.9),
        ("1.2", 1.2),
        ("0.75", 0.75),
        ("5", 2.0),
        ("10%", 0.5),
    ],
)
def test_prosody_rate_forms(rate: str, expected: float) -> None:
    script = translate(speak(f'<prosody rate="{rate}">go</prosody>'))
    assert [(text, voice) for text, voice, _ in covered(script)] == [("go", None)]
    assert script.segments[0].rate == pytest.approx(expected)


def test_nested_prosody_multiplies_and_clamps_each_level() -> None:
    body = (
        '<prosody rate="fast">a <prosody rate="slow">b <prosody rate="x-fast">c '
        '<prosody rate="x-fast">d <prosody rate="slow">e</prosody></prosody></prosody></prosody></prosody>'
        ' <prosody rate="x-slow"><prosody rate="x-slow">f</prosody></prosody>'
    )
    script = translate(speak(body))
    # b: 1.25 x 0.8 = 1.0; d: 1.6 x 1.6 = 2.56 clamps to 2.0; e: the clamped 2.0 x 0.8 = 1.6;
    # f: 0.6 x 0.6 = 0.36 clamps to 0.5.
    assert [text for text, _, _ in covered(script)] == ["a", "b", "c", "d", "e", "f"]
    assert [seg.rate for seg in script.segments] == pytest.approx([1.25, 1.0, 1.6, 2.0, 1.6, 0.5])


def test_prosody_without_rate_or_with_other_attributes_keeps_the_rate() -> None:
    script = translate(speak('a <prosody pitch="+10%" volume="loud">b</prosody> c'))
    assert script.text == "a b c"
    assert covered(script) == [("a b c", None, 1.0)]


@pytest.mark.parametrize("rate", ["quick", "+20", "-0.5", "20 %", "abc%", "1.2x", "", "nan", "inf"])
def test_invalid_prosody_rate_is_refused(rate: str) -> None:
    error = refused(speak(f'<prosody rate="{rate}">go</prosody>'))
    assert repr(rate) in error.message


# --- voice -----------------------------------------------------------------------------------------


def test_voice_segments_nest_and_the_outer_voice_resumes() -> None:
    body = (
        'Hi <voice name="am_adam">there <voice name="bf_emma">you</voice> again</voice> done. '
        '<voice name="af_bella"><prosody rate="fast">quick</prosody> normal</voice>'
    )
    script = translate(speak(body))
    assert script.text == "Hi there you again done. quick normal"
    assert covered(script) == [
        ("Hi", None, 1.0),
        ("there", "am_adam", 1.0),
        ("you", "bf_emma", 1.0),
        ("again", "am_adam", 1.0),
        ("done.", None, 1.0),
        ("quick", "af_bella", 1.25),
        ("normal", "af_bella", 1.0),
    ]


def test_adjacent_equal_voices_form_one_segment() -> None:
    body = '<voice name="a">one</voice> <voice name="a">two</voice><voice name="b"> </voice> three'
    script = translate(speak(body))
    assert covered(script) == [("one two", "a", 1.0), ("three", None, 1.0)]


def test_sentence_break_inside_a_voice_stays_with_that_voice() -> None:
    script = translate(speak('<s><voice name="a">Hello</voice></s>Bye'))
    assert script.text == "Hello.\nBye"
    assert covered(script) == [("Hello.", "a", 1.0), ("Bye", None, 1.0)]


def test_voice_without_a_name_is_refused() -> None:
    assert "name" in refused(speak("<voice>Hi</voice>")).message
    refused(speak('<voice name=" ">Hi</voice>'))


# --- phoneme and sub -------------------------------------------------------------------------------


@pytest.mark.parametrize("alphabet", ['alphabet="ipa" ', 'alphabet="x-kokoro" ', ""])
def test_phoneme_emits_misaki_markup(alphabet: str) -> None:
    body = f'Say <phoneme {alphabet}ph="təmˈeɪtoʊ"> to\n mato </phoneme>.'
    assert text_of(body) == "Say [to mato](/təmˈeɪtoʊ/)."


def test_phoneme_in_another_alphabet_is_refused() -> None:
    assert "'x-sampa'" in refused(speak('<phoneme alphabet="x-sampa" ph="t@">to</phoneme>')).message


@pytest.mark.parametrize("ph", ["tə/m", "tə)m", "tə]m", "tə[m", "tə&#10;m"])
def test_phoneme_with_a_forbidden_character_is_refused(ph: str) -> None:
    refused(speak(f'<phoneme ph="{ph}">tomato</phoneme>'))


def test_phoneme_needs_phonemes_and_a_word() -> None:
    refused(speak("<phoneme>tomato</phoneme>"))
    refused(speak('<phoneme ph="tə"> </phoneme>'))


def test_sub_speaks_its_alias() -> None:
    assert text_of('The <sub alias="World Wide Web">WWW</sub> grew.') == "The World Wide Web grew."
    assert "alias" in refused(speak("<sub>WWW</sub>")).message


# --- say-as ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "content", "spoken"),
    [
        ("cardinal", "1234", "one thousand, two hundred thirty-four"),
        ("cardinal", "1,234", "one thousand, two hundred thirty-four"),
        ("number", "-7", "minus seven"),
        ("cardinal", "12.5", "12.5"),
        ("ordinal", "101", "one hundred first"),
        ("ordinal", "3", "third"),
        ("ordinal", "third", "third"),
        ("characters", "A1", "A 1"),
        ("characters", "ab-c 9!", "A B C 9"),
        ("spell-out", "USA", "U S A"),
        ("digits", "4021", "four zero two one"),
        ("digits", "(40) 2-1", "four zero two one"),
        ("date", "2024-03-05", "2024-03-05"),
        ("time", "10:30", "10:30"),
        ("telephone", "+1 (555) 010-9999", "+1 (555) 010-9999"),
        ("unheard-of", "1234", "1234"),
    ],
)
def test_say_as(kind: str, content: str, spoken: str) -> None:
    assert text_of(f'Read <say-as interpret-as="{kind}">{content}</say-as> now') == f"Read {spoken} now"


def test_say_as_without_interpret_as_keeps_the_text() -> None:
    assert text_of("<say-as>1234</say-as>") == "1234"


# --- other elements and text -----------------------------------------------------------------------


def test_unknown_elements_keep_their_text_and_inner_markup() -> None:
    body = (
        '<emphasis level="strong">really <break time="1s"/> important</emphasis> '
        '<lang xml:lang="fr-FR">bonjour</lang> <w role="x">word</w> <made-up>thing</made-up>'
    )
    assert text_of(body) == "really [pause:1s] important bonjour word thing"


def test_mark_and_desc_say_nothing_but_audio_speaks_its_fallback() -> None:
    body = 'a<mark name="here"/>b <audio src="x.wav">fallback<desc>a bell</desc> text</audio> end'
    assert text_of(body) == "ab fallback text end"


def test_whitespace_collapses_and_text_is_stripped() -> None:
    assert text_of("  Hello \n\t  big <emphasis> wide </emphasis>  world  ") == "Hello big wide world"


def test_predefined_entities_and_character_references_work() -> None:
    assert text_of("a &amp; b &lt;c&gt; &quot;d&quot; &apos;e&apos; &#233;&#x41;") == "a & b <c> \"d\" 'e' éA"


def test_namespaced_speak_works() -> None:
    document = (
        '<?xml version="1.0" encoding="UTF-8"?>'
        '<speak version="1.1" xmlns="http://www.w3.org/2001/10/synthesis" xml:lang="en-US">'
        '<s>Hi <voice name="am_adam">there</voice></s><break time="1s"/></speak>'
    )
    script = translate(document)
    assert script.text == "Hi there.\n[pause:1s]"
    assert covered(script) == [("Hi", None, 1.0), ("there.", "am_adam", 1.0), ("[pause:1s]", None, 1.0)]


def test_nothing_to_speak_gives_empty_text_and_no_segments() -> None:
    for document in ("<speak/>", "<speak>  \n </speak>", speak('<mark name="m"/><s> </s>')):
        assert translate(document) == SsmlScript("", ())


def test_only_breaks_keep_their_pause_tags_in_one_segment() -> None:
    # Silence alone is still something to play, so the pauses stay and the caller synthesizes them.
    script = translate(speak('<break time="1s"/><break/>'))
    assert script == SsmlScript("[pause:1s] [pause:0.4s]", (SsmlSegment(0, 23, None, 1.0),))


# --- refusals --------------------------------------------------------------------------------------


def test_billion_laughs_is_refused_without_memory_growth() -> None:
    # Its time is checked against a real server (tests/integration/test_markup_server.py).
    before = rss_bytes()
    error = refused(BILLION_LAUGHS)
    after = rss_bytes()
    assert "DTD" in error.message
    if before is not None and after is not None:
        assert after - before < 10 * 1024 * 1024


def test_external_entity_is_refused() -> None:
    error = refused(EXTERNAL_ENTITY)
    assert "external references" in error.message
    assert "root:" not in error.message


def test_dtd_alone_is_refused() -> None:
    refused("<!DOCTYPE speak><speak>Hi</speak>")
    refused('<!DOCTYPE speak SYSTEM "http://example.com/speak.dtd"><speak>Hi</speak>')


def test_undeclared_entity_is_malformed() -> None:
    assert "undefined entity" in refused(speak("a&nbsp;b")).message


def test_malformed_xml_says_where() -> None:
    error = refused('<speak><break time="1s"></speak>')
    assert error.message.startswith("The SSML is malformed at line 1, column ")
    # expat's 0-based column 26 is the 27th character: the `</speak>` that does not match.
    assert "line 1, column 27: mismatched tag" in error.message


def test_root_must_be_speak() -> None:
    assert "<voice>" in refused('<voice name="a">Hi</voice>').message
    refused('<speaker xmlns="http://www.w3.org/2001/10/synthesis">Hi</speaker>')


def test_nesting_up_to_max_depth_works_and_deeper_is_refused() -> None:
    def nested(depth: int) -> str:
        inner = depth - 1  # the speak root is the first level
        return speak("<emphasis>" * inner + "deep" + "</emphasis>" * inner)

    assert translate(nested(MAX_DEPTH)).text == "deep"
    assert str(MAX_DEPTH) in refused(nested(MAX_DEPTH + 1)).message
    refused(speak("<emphasis>" * 5000 + "</emphasis>" * 5000))


# --- invariants ------------------------------------------------------------------------------------

WORDS = st.text(alphabet="abcdefgh", min_size=1, max_size=5)
Node = str | tuple[str, list["Node"]]  # a word, or a voice name and what it says
NODES = st.recursive(
    WORDS, lambda children: st.tuples(st.sampled_from(["a", "b", "c"]), st.lists(children, max_size=4))
)


def render(nodes: list[Node], voice: str | None, words: list[tuple[str, str | None]]) -> str:
    """The nodes as SSML; `words` collects each word with the voice it should be spoken in."""
    pieces = []
    for node in nodes:
        if isinstance(node, str):
            words.append((node, voice))
            pieces.append(node + " ")
        else:
            name, children = node
            pieces.append(f'<voice name="{name}">{render(children, name, words)}</voice>')
    return "".join(pieces)


@settings(max_examples=60, deadline=None)
@given(st.lists(NODES, max_size=6))
def test_segments_cover_every_word_in_order_with_its_voice(nodes: list[Node]) -> None:
    words: list[tuple[str, str | None]] = []
    script = translate(speak(render(nodes, None, words)))
    assert script.text == " ".join(word for word, _ in words)
    assert all(script.text[seg.start : seg.end].strip() for seg in script.segments)
    for before, after in pairwise(script.segments):
        assert before.end <= after.start
        assert (before.voice, before.rate) != (after.voice, after.rate)
    position = 0
    for word, voice in words:
        position = script.text.index(word, position)
        owners = [seg for seg in script.segments if seg.start <= position < position + len(word) <= seg.end]
        assert [seg.voice for seg in owners] == [voice]
        position += len(word)
