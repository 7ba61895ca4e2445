"""The normalization table heard: a real server (registry weights, the torch engine, as served by default)
speaks a fixed sample of the table's written forms, and each is compared with the same server speaking the
row's hand-spelled reading with normalization off: where the two are the same audio to the byte they are
the same speech; where not, whisper tiny.en transcribes both, and what it hears is cleaned the same way on
both sides (scripts/tools/check_normalization.py `heard_words`). The whole table runs with
`python -m scripts.tools.check_normalization --speech`; figures in docs/text.md."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from scripts.tools import check_normalization as check
from tests.integration.conftest import RegistryServers, Server

# Mean WER of the written forms' transcriptions against the readings' over the sample. Measured 0.000
# here (20 of 20 rows heard alike; where the normalizer writes the reading's words the server renders the
# same phonemes, so whisper's noise cancels; on 2026-11-26 all 20 were the same audio to the byte, so
# whisper ran once per row: 39 s, where two transcriptions per row on the ONNX server took 78-82 s). A row
# read wrong differs by 1-3 words of 6-12, 0.1-0.5 of that row, 0.005-0.025 of the mean; 0.01 (the issue's
# goal) fails on most such rows and on any two.
MAX_MEAN_WER = 0.01
# One row each from 20 categories (fixed, so a failure is reproducible).
SAMPLE = (
    "The shop is open Mon.–Fri. from 9 to 5.",
    "Taxes are due Apr. 15.",
    "Gen. Patton led the Third Army.",
    "The Simpsons live at 742 Evergreen Terrace.",
    "The house is on Mulholland Dr.",
    "I'm on flight BA 2490 to Boston.",
    "She finished the marathon in 2:03:45.",
    "They lost 1-0.",
    "This is covered by § 5.",
    "It pays 5% p.a.",
    "Louis XIV built Versailles.",
    "It takes 1 1/2 hours.",
    "Light travels at 3 x 10^8 m/s.",
    "It will cost €2–3bn.",
    "She is from the class of '05.",
    "The ticket is EUR 3.50.",
    "They raised $3.2m.",
    "It was 72°F today.",
    "Blood alcohol was 0.5‰.",
    "The launch is 3rd March 2025.",
)


@pytest.fixture
def server(registry_servers: RegistryServers) -> Server:
    return registry_servers("torch")


def heard_unless_the_same(case: Any, wavs: tuple[bytes, bytes], whisper: Any) -> dict[str, Any]:
    """`check.heard`'s figures, where the two renderings differ. Where they are the same audio to the byte,
    whisper would hear the same words twice: WER 0 without hearing them (twenty transcriptions and the
    model's load took about half of this test's 65-300 s)."""
    if wavs[0] != wavs[1]:
        return check.heard(case, wavs, whisper)
    return {"category": case.category, "wer": 0.0, "same_audio": True}


def test_sample_rows_sound_like_their_readings(server: Server, whisper: Any) -> None:
    by_written = {case.written: case for case in check.load_table()}
    cases = [by_written[written] for written in SAMPLE]
    assert len({case.category for case in cases}) == len(cases)
    # The server speaks the next rows while whisper hears the last (they share 2 cores). One row at a time:
    # a request alone gets every engine thread, so two renderings with the same phonemes are the same audio
    # to the byte; two requests at once share the threads (the torch engine's lanes), and a chunk computed
    # on one thread differs from one computed on two in its last bits, enough for whisper to hear "'05" as
    # "0.5" once and as "O5" the other time (Xeon with AMX, bf16).
    with ThreadPoolExecutor(max_workers=1) as pool:
        wavs = pool.map(lambda case: check.spoken(case, server.url), cases)
        results = [heard_unless_the_same(case, said, whisper) for case, said in zip(cases, wavs, strict=True)]
    for result in results:
        if result["same_audio"]:
            print(f"{result['category']}: the same audio as its reading")
            continue
        print(f"{result['category']}: WER {result['wer']:.2f}\n  said:  {result['heard_written']}")
        print(f"  spelt: {result['heard_reading']}")
    mean = sum(result["wer"] for result in results) / len(results)
    print(f"mean WER {mean:.3f} over {len(results)} rows")
    assert mean <= MAX_MEAN_WER
