"""How close a running server's word starts are to where the words are heard, by two rulers that do not
come from the model: the onset of frication of each s-initial word in running speech (read from the
audio's spectrum), and pocketsphinx's forced alignment of the spoken words. Several voices and speeds;
writes JSON and prints a table (docs/api.md#word-timestamps).

    python scripts/tools/check_word_starts.py --url http://127.0.0.1:8880 --out word-starts.json
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import re
import wave
from pathlib import Path
from typing import Any

import httpx
import numpy as np

# Many words begin with /s/ after a vowel or a voiced sound, where the frication's onset is sharp.
TEXT = (
    "Maria said she saw seven small ships sail past the sunny coast. The old man sold us some soup, and "
    "then he sang a song so softly that we sat still. Later the teacher spoke, saying the students should "
    "sleep, since the test starts at six."
)
VOICES = ("af_heart", "am_michael", "bf_emma")
SPEEDS = (1.0, 0.8, 1.3)
# Frication: 5 ms steps where the energy above 3.5 kHz exceeds that below 1.5 kHz by this much, within 35 dB
# of the loudest step above 3.5 kHz, for at least 30 ms.
FRICATION_DB = 8.0
FRICATION_RANGE_DB = 35.0
FRICATION_MIN_S = 0.03
STEP_S = 0.005
# Where to look for a word's frication around the server's start; a word after 100 ms or more of silence
# or after a word that ends in a hiss ("ships sail") is left out.
SEARCH_BEFORE_S, SEARCH_AFTER_S = 0.25, 0.08
PAUSE_S = 0.1


def read_wav(data: bytes) -> tuple[np.ndarray, int]:
    """Mono 16-bit WAV as float32 in [-1, 1] and its sample rate."""
    with wave.open(io.BytesIO(data)) as file:
        frames = file.readframes(file.getnframes())
        return np.frombuffer(frames, np.int16).astype(np.float32) / 32768, file.getframerate()


def frication(samples: np.ndarray, sample_rate: int) -> np.ndarray:
    """For each 5 ms step (10 ms windows), whether it sounds like a hiss (see FRICATION_DB)."""
    hop, window = int(STEP_S * sample_rate), int(2 * STEP_S * sample_rate)
    frames = np.lib.stride_tricks.sliding_window_view(samples, window)[::hop] * np.hanning(window)
    power = np.abs(np.fft.rfft(frames, axis=1)) ** 2
    frequencies = np.fft.rfftfreq(window, 1 / sample_rate)
    high = 10 * np.log10(power[:, frequencies > 3500].sum(axis=1) + 1e-12)
    low = 10 * np.log10(power[:, frequencies < 1500].sum(axis=1) + 1e-12)
    return (high - low > FRICATION_DB) & (high > high.max() - FRICATION_RANGE_DB)


def frication_onset(hissing: np.ndarray, near: float) -> float | None:
    """The start, in seconds, of the hiss of 30 ms or more that starts nearest `near` within the search
    window, if any."""
    first, last = int((near - SEARCH_BEFORE_S) / STEP_S), int((near + SEARCH_AFTER_S) / STEP_S)
    starts = []
    step = max(first, 0)
    while step < min(last, len(hissing)):
        if not hissing[step]:
            step += 1
            continue
        begin = step
        while step < len(hissing) and hissing[step]:
            step += 1
        if step - begin >= FRICATION_MIN_S / STEP_S:
            starts.append(begin * STEP_S)
    return min(starts, key=lambda start: abs(start - near)) if starts else None


def letters(word: str) -> str:
    return re.sub(r"[^a-z']", "", word.lower())


def fricative_differences(items: list[dict[str, Any]], hissing: np.ndarray) -> list[float]:
    """Server start minus frication onset, seconds, for each s-initial word in running speech."""
    differences = []
    for before, item in zip(items, items[1:], strict=False):
        after_pause = item["start_time"] - before["end_time"] >= PAUSE_S or before["word"][-1] in ",.;:!?"
        if not letters(item["word"]).startswith("s") or after_pause or letters(before["word"])[-1] in "sz":
            continue
        onset = frication_onset(hissing, item["start_time"])
        if onset is not None:
            differences.append(item["start_time"] - onset)
    return differences


def at_16_khz(samples: np.ndarray, sample_rate: int) -> bytes:
    """The audio as 16 kHz 16-bit mono PCM (PyAV's resampler), what pocketsphinx's model takes."""
    import av

    frame = av.AudioFrame.from_ndarray(
        (np.clip(samples, -1, 1) * 32767).astype(np.int16)[None, :], "s16", "mono"
    )
    frame.sample_rate = sample_rate
    resampler = av.AudioResampler(format="s16", layout="mono", rate=16000)
    return b"".join(
        bytes(out.to_ndarray().tobytes()) for out in [*resampler.resample(frame), *resampler.resample(None)]
    )


def aligned_starts(spoken: list[str], samples: np.ndarray, sample_rate: int) -> np.ndarray:
    """Where pocketsphinx's forced alignment puts the first word of each item, in seconds; `spoken` says
    each item's words as its dictionary spells them ("doctor" for "Dr.")."""
    from pocketsphinx import Decoder

    words: list[str] = []
    first = []
    for item in spoken:
        first.append(len(words))
        words += item.split()
    decoder = Decoder(samprate=16000, loglevel="FATAL")
    decoder.set_align_text(" ".join(words))
    decoder.start_utt()
    decoder.process_raw(at_16_khz(samples, sample_rate), full_utt=True)
    decoder.end_utt()
    segments = [segment for segment in decoder.seg() if segment.word not in ("<s>", "</s>", "<sil>")]
    placed = [re.sub(r"\(\d+\)$", "", segment.word) for segment in segments]  # "the(2)": a variant
    if placed != words:
        raise RuntimeError(f"the aligner placed {len(placed)} of {len(words)} words, or others")
    frames_per_second = 100
    return np.array([segments[k].start_frame / frames_per_second for k in first])


def aligned_differences(items: list[dict[str, Any]], samples: np.ndarray, sample_rate: int) -> list[float]:
    """Server start minus pocketsphinx's forced-alignment start, seconds, for every item."""
    starts = np.array([item["start_time"] for item in items])
    aligned = aligned_starts([letters(item["word"]) for item in items], samples, sample_rate)
    return [float(difference) for difference in starts - aligned]


def summary(differences: list[float]) -> dict[str, float | int]:
    values = np.array(differences)
    return {
        "words": len(values),
        "median_ms": round(float(np.median(values)) * 1000, 1),
        "signed_mean_ms": round(float(values.mean()) * 1000, 1),
        "mean_abs_ms": round(float(np.abs(values).mean()) * 1000, 1),
        "p95_abs_ms": round(float(np.percentile(np.abs(values), 95)) * 1000, 1),
    }


def measure(url: str, voice: str, speed: float) -> dict[str, Any]:
    body = {"input": TEXT, "voice": voice, "speed": speed, "response_format": "wav", "stream": False}
    response = httpx.post(f"{url}/dev/captioned_speech", json=body, timeout=600)
    response.raise_for_status()
    answer = response.json()
    samples, sample_rate = read_wav(base64.b64decode(answer["audio"]))
    items = answer["timestamps"]
    return {
        "voice": voice,
        "speed": speed,
        "fricative_onsets": summary(fricative_differences(items, frication(samples, sample_rate))),
        "forced_alignment": summary(aligned_differences(items, samples, sample_rate)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", default="http://127.0.0.1:8880")
    parser.add_argument("--out", type=Path, default=Path("word-starts.json"))
    args = parser.parse_args()
    rows = [measure(args.url, voice, speed) for voice in VOICES for speed in SPEEDS]
    args.out.write_text(json.dumps({"text": TEXT, "rows": rows}, indent=2) + "\n")
    print(
        "| voice | speed | fricative onsets: n, median, mean abs | forced alignment: mean abs, p95, signed |"
    )
    print("|---|---|---|---|")
    for row in rows:
        fricative, aligned = row["fricative_onsets"], row["forced_alignment"]
        print(
            f"| {row['voice']} | {row['speed']} | {fricative['words']}, {fricative['median_ms']:+.0f}, "
            f"{fricative['mean_abs_ms']:.0f} ms | {aligned['mean_abs_ms']:.0f}, {aligned['p95_abs_ms']:.0f}, "
            f"{aligned['signed_mean_ms']:+.0f} ms |"
        )


if __name__ == "__main__":
    main()
