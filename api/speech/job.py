"""A validated speech request and what its synthesis has made so far: the job every stage reads."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from api.protocol import SpeechRequest, Usage
from api.speech.captions import Captions, WordTime
from api.text.markup import Script
from api.text.plan import Planner


@dataclass
class SpeechJob:
    """A validated request: everything needed to synthesize it, resolved before the first byte."""

    request: SpeechRequest
    request_id: str
    voice_pack: np.ndarray[Any, Any]
    lang_code: str
    script: Script
    # Per voice of the script (None: the request's own): its pack and its G2P language.
    packs: dict[str | None, np.ndarray[Any, Any]] = field(default_factory=dict)
    langs: dict[str | None, str] = field(default_factory=dict)
    phonemes: str | None = None  # given phonemes instead of text (/dev/generate_from_phonemes)
    usage: Usage = field(default_factory=Usage)
    chunks_total: int = 0
    chunks_sent: int = 0
    samples_out: int = 0
    captions: Captions | None = None  # word timings, when the request asks for them
    planner: Planner | None = None  # None: the service's (a live utterance starts with a shorter chunk)
    background: bool = False  # a book job's chunk: runs only where no request's chunk waits


@dataclass(frozen=True)
class Piece:
    """Audio ready to send, and the input's words whose timings it completes."""

    data: bytes
    words: list[WordTime]
