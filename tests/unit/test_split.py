from __future__ import annotations

from api.text.split import group_sentences, split_long, split_sentences


def test_split_sentences_keeps_punctuation_and_quotes() -> None:
    text = 'He said "stop." Then he left! Did he? Yes…  Fine\nNext line'
    expected = ['He said "stop."', "Then he left!", "Did he?", "Yes…", "Fine", "Next line"]
    assert split_sentences(text) == expected


def test_split_sentences_does_not_split_decimals() -> None:
    assert split_sentences("It costs 3.50 today. Done.") == ["It costs 3.50 today.", "Done."]


def test_group_sentences_keeps_every_word_in_order() -> None:
    text = " ".join(f"Sentence number {i} has a few words in it." for i in range(60))
    pieces = list(group_sentences(text, target_chars=300, first_chars=60))
    assert " ".join(pieces).split() == text.split()
    assert len(pieces[0]) <= 60
    assert all(len(piece) <= 300 for piece in pieces)
    assert len(pieces) > 5


def test_group_sentences_first_piece_is_one_sentence_even_if_long() -> None:
    text = "A rather long first sentence that exceeds the first budget. Short. Another."
    pieces = list(group_sentences(text, target_chars=300, first_chars=10))
    assert pieces[0] == "A rather long first sentence that exceeds the first budget."
    assert pieces[1] == "Short. Another."


def test_unpunctuated_text_is_cut_at_spaces_without_loss() -> None:
    text = " ".join(["word"] * 5000)
    pieces = split_long(text, 600)
    assert all(len(piece) <= 600 for piece in pieces)
    assert " ".join(pieces).split() == text.split()


def test_japanese_and_chinese_sentences_end_without_spaces() -> None:
    assert split_sentences("こんにちは、世界。今日は良い天気ですね！明日は？") == [
        "こんにちは、世界。",
        "今日は良い天気ですね！",
        "明日は？",
    ]
    assert split_sentences("你好，世界。“好的。”他说。Hello there. Ok") == [
        "你好，世界。",
        "“好的。”",
        "他说。",
        "Hello there.",
        "Ok",
    ]


def test_a_long_chinese_sentence_is_cut_at_its_commas() -> None:
    sentence = "，".join(["今天天气很好"] * 12) + "。"
    pieces = split_long(sentence, 30)
    assert "".join(pieces) == sentence
    assert all(len(piece) <= 30 for piece in pieces)
    assert all(piece.endswith(("，", "。")) for piece in pieces)
