"""`python -m scripts.bench frontend` end to end, small: every part runs and its JSON holds measured figures
(the server part starts the real app over the simulated GPU engine and loads it with `load`'s client)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_part_measures_something(random_weights: Path, tmp_path: Path) -> None:
    out = tmp_path / "frontend.json"
    command = [
        sys.executable, "-m", "scripts.bench", "frontend", "--weights", str(random_weights),
        "--g2p-repeats", "1", "--encode-seconds", "6", "--encode-format", "pcm", "mp3",
        "--format", "pcm", "--clients", "2", "--requests", "4", "--out", str(out),
    ]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    document = json.loads(out.read_text())
    report = document["results"]

    assert report["g2p"]["tokens"] > 1000
    assert report["g2p"]["audio_s_per_cpu_s"] > 0
    assert set(report["encode"]) == {"pcm", "mp3"}
    assert report["encode"]["mp3"]["bytes"] > 0
    assert report["encode"]["mp3"]["cpu_s"] > 0
    (level,) = report["server"]
    assert level["ok"] == 4
    assert level["failed"] == 0
    assert level["audio_s"] > 0
    assert level["server_cpu_s"] > 0
    assert level["cores_for_target"] > 0
    assert report["cores_for_target"]["server"] == {"pcm": level["cores_for_target"]}
    assert document["machine"]["cpu_model"] is not None
