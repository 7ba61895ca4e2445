"""Run the normalization table (tests/data/normalization/*.tsv) through the normalizer, and optionally
through a real server and whisper, and write per-category figures as JSON.

Text level (always): each row's written form goes through `normalize_text`; a row passes when the
result says the same words as the row's reading (compared by `spoken_words`: case, punctuation and
hyphens ignored).

Speech level (`--speech`): a server speaks each written form (normalization on) and the row's reading
(normalization off, so the server says exactly the hand-spelled words); whisper tiny.en transcribes
both, and the word error rate of the first transcription against the second is the row's figure.
Both transcriptions go through the same clean-up (`heard_words`), so whisper's own habits (digits,
"$5", "p.m.") cancel out.

    python -m scripts.tools.check_normalization --out bench-results/<machine>/normalization.json
    HF_HUB_OFFLINE=1 python -m scripts.tools.check_normalization --speech --per-category 5 \\
        --start ~/.cache/kokoro-openai-server/test-registry-weights \\
        --out bench-results/<machine>/normalization.json
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import re
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from api.text.normalize import normalize_text

ROOT = Path(__file__).resolve().parents[2]

TABLE_DIR = ROOT / "tests" / "data" / "normalization"
_NOT_SPOKEN = re.compile(r"[^\w' ]+")
_INNER_PERIOD = re.compile(r"(?<=\w)\.(?=\w)")  # 'Ph.D.' and 'PhD' are said alike
_EDGE_APOSTROPHES = re.compile(r"(?<!\w)'|'(?!\w)")


@dataclass(frozen=True)
class Case:
    """One row of the table: a written form in context, what a careful reader says, and its source."""

    category: str
    written: str
    reading: str
    source: str
    line: int


def load_table(directory: Path = TABLE_DIR) -> list[Case]:
    """Every row of every `<category>.tsv` (columns written, reading, source), in file order."""
    cases = []
    for path in sorted(directory.glob("*.tsv")):
        with path.open(newline="", encoding="utf-8") as table:
            rows = csv.DictReader(table, delimiter="\t", quoting=csv.QUOTE_NONE)
            for line, row in enumerate(rows, start=2):
                cases.append(Case(path.stem, row["written"], row["reading"], row["source"], line))
    return cases


def spoken_words(text: str) -> list[str]:
    """The words of `text` as heard: lower case, hyphens and dashes as spaces, punctuation dropped."""
    text = (
        _INNER_PERIOD.sub("", text)
        .casefold()
        .replace("’", "'")
        .replace("-", " ")
        .replace("–", " ")
        .replace("—", " ")
    )
    return _EDGE_APOSTROPHES.sub(" ", _NOT_SPOKEN.sub(" ", text)).split()


def reads_right(case: Case, lang_code: str = "a") -> tuple[bool, str]:
    said = normalize_text(case.written, lang_code=lang_code)
    return spoken_words(said) == spoken_words(case.reading), said


def check_text(cases: Iterable[Case]) -> dict[str, Any]:
    """Per category: rows, rows read right, and each failure with what the normalizer said."""
    categories: dict[str, dict[str, Any]] = {}
    for case in cases:
        figures = categories.setdefault(case.category, {"rows": 0, "passed": 0, "failures": []})
        ok, said = reads_right(case)
        figures["rows"] += 1
        figures["passed"] += ok
        if not ok:
            figures["failures"].append({"written": case.written, "expected": case.reading, "said": said})
    rows = sum(figures["rows"] for figures in categories.values())
    passed = sum(figures["passed"] for figures in categories.values())
    return {
        "rows": rows,
        "passed": passed,
        "pass_rate": passed / rows if rows else 0.0,
        "categories": categories,
    }


# --- speech round trip ------------------------------------------------------------------------------------


def heard_words(transcript: str) -> list[str]:
    """Whisper's transcript in the table's words: its digits and symbols read by the normalizer."""
    transcript = re.sub(r"\b([ap])\.m\.", r"\1m", transcript, flags=re.IGNORECASE)
    return spoken_words(normalize_text(transcript).replace(" PM", " pm").replace(" AM", " am"))


def word_error_rate(reference: list[str], hypothesis: list[str]) -> float:
    import jiwer

    if not reference:
        return float(bool(hypothesis))
    return float(jiwer.wer(" ".join(reference), " ".join(hypothesis)))


def speak(url: str, text: str, normalize: bool, voice: str = "af_heart") -> bytes:
    import httpx

    body = {
        "model": "tts-1", "voice": voice, "input": text, "response_format": "wav",
        "normalization_options": {"normalize": normalize},
    }  # fmt: skip
    response = httpx.post(f"{url}/v1/audio/speech", json=body, timeout=300)
    response.raise_for_status()
    return response.content


def round_trip(case: Case, url: str, whisper: Any) -> dict[str, Any]:
    """Whisper on the server's reading of the written form against whisper on the hand-spelled one."""
    return heard(case, spoken(case, url), whisper)


def spoken(case: Case, url: str) -> tuple[bytes, bytes]:
    """The server's WAVs of the written form (normalized) and of the hand-spelled reading (not)."""
    return speak(url, case.written, normalize=True), speak(url, case.reading, normalize=False)


def heard(case: Case, wavs: tuple[bytes, bytes], whisper: Any) -> dict[str, Any]:
    """`round_trip`'s figures from `spoken`'s WAVs. Where the server said both with the same phonemes, the
    audio is the same to the byte (its noise is seeded), and whisper hears it once."""
    from scripts.hearing import transcribe  # whisper, jiwer and httpx only for the speech check

    said_written, said_reading = wavs
    heard_written = transcribe(whisper, said_written)
    same_audio = said_written == said_reading
    heard_reading = heard_written if same_audio else transcribe(whisper, said_reading)
    wer = word_error_rate(heard_words(heard_reading), heard_words(heard_written))
    return {
        "category": case.category, "written": case.written, "reading": case.reading,
        "heard_written": heard_written.strip(), "heard_reading": heard_reading.strip(), "wer": wer,
        "same_audio": same_audio,
    }  # fmt: skip


def sample(cases: list[Case], per_category: int | None, seed: int = 0) -> list[Case]:
    """Up to `per_category` rows of each category, drawn with a fixed seed (all rows when None)."""
    if per_category is None:
        return cases
    by_category: dict[str, list[Case]] = {}
    for case in cases:
        by_category.setdefault(case.category, []).append(case)
    rng = random.Random(seed)
    return [case for rows in by_category.values() for case in rng.sample(rows, min(per_category, len(rows)))]


def summarize_speech(results: list[dict[str, Any]]) -> dict[str, Any]:
    categories: dict[str, list[float]] = {}
    for result in results:
        categories.setdefault(result["category"], []).append(result["wer"])
    summary = {
        name: {
            "rows": len(wers),
            "mean_wer": sum(wers) / len(wers),
            "rows_with_errors": sum(w > 0 for w in wers),
        }
        for name, wers in categories.items()
    }
    wers = [result["wer"] for result in results]
    return {
        "rows": len(results), "mean_wer": sum(wers) / len(wers) if wers else 0.0,
        "categories": summary, "results": results,
    }  # fmt: skip


def check_speech(cases: list[Case], url: str, progress: Callable[[str], None]) -> dict[str, Any]:
    from scripts.hearing import load_whisper

    whisper = load_whisper()
    results = []
    for index, case in enumerate(cases, start=1):
        results.append(round_trip(case, url, whisper))
        progress(f"[{index}/{len(cases)}] {case.category}: WER {results[-1]['wer']:.2f} {case.written}")
    return summarize_speech(results)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--table", type=Path, default=TABLE_DIR, help="directory of <category>.tsv files")
    parser.add_argument("--out", type=Path, help="write the JSON report here (default: stdout)")
    parser.add_argument("--speech", action="store_true", help="also the whisper round trip against a server")
    server = parser.add_mutually_exclusive_group()
    server.add_argument("--url", help="a running server (default with --speech: start one, see --start)")
    server.add_argument("--start", type=Path, help="weights directory: start an ONNX server on it")
    parser.add_argument("--per-category", type=int, help="speech: at most this many rows per category")
    parser.add_argument("--seed", type=int, default=0, help="speech: seed of the per-category sample")
    return parser.parse_args(argv)


def run_speech(args: argparse.Namespace, cases: list[Case]) -> dict[str, Any]:
    chosen = sample(cases, args.per_category, args.seed)
    if args.url:
        return check_speech(chosen, args.url, lambda line: print(line, file=sys.stderr))
    if args.start is None:
        raise SystemExit("--speech needs --url or --start")
    from scripts.harness import running_server

    log = Path("/tmp/check_normalization_server.log")
    with running_server(args.start, log, KOKORO_ENGINE="onnx") as server:
        return check_speech(chosen, server.url, lambda line: print(line, file=sys.stderr))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cases = load_table(args.table)
    started = time.monotonic()
    report: dict[str, Any] = {"table": str(args.table), "text": check_text(cases)}
    if args.speech:
        report["speech"] = run_speech(args, cases)
    report["seconds"] = round(time.monotonic() - started, 1)
    text = json.dumps(report, indent=2, ensure_ascii=False)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    else:
        print(text)
    for name, figures in report["text"]["categories"].items():
        print(f"{name:20s} {figures['passed']:4d}/{figures['rows']:<4d}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
