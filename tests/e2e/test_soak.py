"""The soak script's short run in CI: a real server process over the tone engine (real HTTP, text, G2P and
encoders), mixed requests with hang-ups and slow readers, then the script's own checks (no 5xx and nothing
lost, gauges back to 0, threads and open files bounded, RSS plateau)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from scripts.harness import free_port

ROOT = Path(__file__).resolve().parents[2]


def test_short_soak_passes_its_checks(tmp_path: Path, random_weights: Path) -> None:
    out = tmp_path / "soak.json"
    command = [
        sys.executable,
        "-m",
        "scripts.bench",
        "soak",
        "--start",
        "tone",
        "--port",
        str(free_port()),
        "--weights",
        str(random_weights),
        "--requests",
        "120",
        "--clients",
        "6",
        "--sample-every",
        "15",
        "--rss-growth",
        "0.15",
        "--out",
        str(out),
    ]
    run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert out.exists(), run.stderr[-3000:]
    result = json.loads(out.read_text())["results"]
    print(json.dumps({key: result[key] for key in ("wall_s", "checks", "final", "gauges")}, indent=1))
    print(json.dumps(result["tally"]["statuses"]), json.dumps(result["samples"]))
    modes = result["tally"]["modes"]
    assert modes.get("hang_up", 0) > 0
    assert modes.get("slow", 0) > 0
    assert sum(result["tally"]["statuses"].values()) == 120
    assert all(result["checks"].values()), result["checks"]
    assert run.returncode == 0
