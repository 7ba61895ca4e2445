"""What loading misaki's English G2P brings into a process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_english_g2p_loads_without_hugging_face_transformers() -> None:
    """spaCy loads every installed package's factories as it builds its pipeline; spacy-curated-transformers'
    (installed by misaki[en], never used with trf=False) would import transformers in every worker. Left
    out, the pipeline still tags: the past tense of "read" comes from spaCy's tagger."""
    probe = (
        "import json, sys\n"
        "from api.text.phonemize import build_g2p\n"
        "phonemes, _ = build_g2p('a')('I read the book yesterday.')\n"
        "print(json.dumps([phonemes, 'transformers' in sys.modules]))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120, check=True
    )
    phonemes, transformers = json.loads(result.stdout.strip().splitlines()[-1])
    assert not transformers
    assert "ɹˈɛd" in phonemes, phonemes
