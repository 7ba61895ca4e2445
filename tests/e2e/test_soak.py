"""The soak script's short run in CI: a real server process with two workers over the tone engine (real
HTTP, text, G2P, encoders, live protocols, book jobs and voice library), every protocol at once with
hang-ups, slow readers, barge-ins and bursts over the admission limit, one worker killed and a voice file
corrupted in the middle; then the script's own checks (no bad answer outside the faults, no short audio,
gauges back to 0, each worker's memory, threads and open files bounded)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DURATION_S = 90


def test_short_soak_passes_its_checks(tmp_path: Path, random_weights: Path) -> None:
    out = tmp_path / "soak.json"
    command = [
        *(sys.executable, "-m", "scripts.bench", "soak", "--start", "tone", "--workers", "2"),
        *("--weights", str(random_weights), "--duration-s", str(DURATION_S)),
        *("--clients", "4", "--live-clients", "2", "--book-every-s", "20", "--voice-every-s", "15"),
        *("--burst-every-s", "25", "--burst-size", "60", "--fault", "kill@30", "--fault", "voice@60"),
        *("--sample-s", "5", "--warmup-s", "20", "--window-s", "30", "--p95-drift", "1.0"),
        # After the kill one worker takes the whole load, and its pools start threads up to their bounds:
        # anyio's (Starlette's threadpool calls; up to 40, idle ones pruned only when a later call comes)
        # went from 23 to 32 on a slow VM whose killed worker took 39 s to come back. A leak of one
        # thread per operation would pass a thousand.
        *("--rss-growth", "0.15", "--thread-slack", "16", "--out", str(out)),
    ]
    run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert out.exists(), run.stdout[-3000:] + run.stderr[-3000:]
    result = json.loads(out.read_text())["results"]
    shown = result["shown"]
    print(json.dumps({key: result[key] for key in ("wall_s", "checks", "faults", "gauges")}, indent=1))
    print(
        json.dumps(shown["tally"]), json.dumps(shown["memory"]), json.dumps(shown["bad_outside_faults"][:5])
    )
    kinds = {name.split(":")[0] for name in shown["tally"]}
    assert {
        "http",
        "live",
        "deepgram",
        "elevenlabs",
        "cartesia",
        "wyoming",
        "book",
        "voice",
        "burst",
    } <= kinds
    assert shown["tally"].get("http:hung_up", 0) > 0
    assert shown["tally"].get("burst:refused", 0) > 0  # the bursts went over the admission limit
    kill = next(fault for fault in result["faults"] if fault["kind"] == "kill")
    assert kill["ready_again_s"] is not None, kill
    voice = next(fault for fault in result["faults"] if fault["kind"] == "voice")
    answers = [voice["corrupted"][0], voice["removed"][0], voice["health"], voice["after"]]
    assert answers == [400, 400, 200, 200], voice  # clear errors, and the server still serving
    assert all(result["checks"].values()), result["checks"]
    assert run.returncode == 0
