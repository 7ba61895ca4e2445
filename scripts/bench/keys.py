"""Two API keys on one server: does one key flooding it starve the other?

Bob sends short streamed requests one after another and records his first audio; alice floods with 4x
her share of concurrent clients (each retries a refusal at once, as a careless loop would). Phases:
bob alone (unloaded), bob beside alice's share of clients (what sharing the CPU costs him, with no
flood), bob beside alice's flood with the per-key limits at their defaults, and, on a second
server, bob beside alice with the per-key limits off (`KOKORO_KEY_MAX_INFLIGHT=0`: the global admission
alone). JSON out; exits 1 when bob's first audio p50 under the flood is over `--within` of his unloaded
one with the limits on.

    python -m scripts.bench keys --out bench-results/<machine>/keys.json
"""

from __future__ import annotations

import argparse
import asyncio
import re
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from api.server.key_limits import default_share
from api.settings import Settings
from scripts.bench.common import (
    Report,
    add_engine,
    add_server_env,
    add_weights,
    checked_server_env,
    positive_float,
    positive_int,
)
from scripts.harness import launch, process_env, serving, wait_engines_ready

KEYS = {"alice": "sk-alice-bench", "bob": "sk-bob-bench"}
BOB_TEXT = "The next train to Edinburgh leaves from platform four in ten minutes."
ALICE_TEXT = (
    "When the storm finally arrived, it came faster than anyone in the village had expected. The "
    "fishermen pulled their boats high onto the shingle, the baker closed his shutters, and the children "
    "were called in from the fields."
)


def body(text: str) -> dict[str, Any]:
    return {"model": "tts-1", "input": text, "voice": "af_heart", "response_format": "pcm", "stream": True}


async def timed(client: httpx.AsyncClient, key: str, text: str) -> dict[str, Any]:
    """One streamed request: its status, first audio and end (seconds), and its audio seconds."""
    headers = {"Authorization": f"Bearer {KEYS[key]}"}
    started = time.perf_counter()
    first = None
    size = 0
    async with client.stream("POST", "/v1/audio/speech", json=body(text), headers=headers) as response:
        async for data in response.aiter_bytes():
            if first is None and data and response.status_code == 200:
                first = time.perf_counter() - started
            size += len(data)
        status = response.status_code
    total = time.perf_counter() - started
    audio_s = size / 48000 if status == 200 else 0.0
    return {"status": status, "first_audio_s": first, "total_s": round(total, 3), "audio_s": audio_s}


async def bob(client: httpx.AsyncClient, requests: int, gap_s: float) -> list[dict[str, Any]]:
    samples = []
    for _ in range(requests):
        samples.append(await timed(client, "bob", BOB_TEXT))
        await asyncio.sleep(gap_s)
    return samples


async def alice(
    client: httpx.AsyncClient, stop: asyncio.Event, tally: Counter[str], audio: list[float]
) -> None:
    """One of alice's flooding clients: requests back to back until `stop`, a refusal retried at once."""
    while not stop.is_set():
        try:
            result = await timed(client, "alice", ALICE_TEXT)
        except httpx.HTTPError as exc:
            tally[f"error:{type(exc).__name__}"] += 1
            continue
        tally[str(result["status"])] += 1
        audio.append(result["audio_s"])


def summary(samples: list[dict[str, Any]]) -> dict[str, Any]:
    firsts = sorted(s["first_audio_s"] for s in samples if s["first_audio_s"] is not None)
    statuses = Counter(str(s["status"]) for s in samples)
    p95 = firsts[min(len(firsts) - 1, round(0.95 * (len(firsts) - 1)))] if firsts else None
    return {
        "statuses": dict(statuses),
        "first_audio_p50_s": round(statistics.median(firsts), 3) if firsts else None,
        "first_audio_p95_s": round(p95, 3) if p95 is not None else None,
        "first_audio_s": [round(value, 3) for value in firsts],
    }


async def phase(url: str, args: argparse.Namespace, flooders: int) -> dict[str, Any]:
    """Bob's requests with `flooders` of alice's clients running beside (0: bob alone)."""
    limits = httpx.Limits(max_connections=flooders + 4)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        stop = asyncio.Event()
        tally: Counter[str] = Counter()
        audio: list[float] = []
        floods = [asyncio.create_task(alice(client, stop, tally, audio)) for _ in range(flooders)]
        await asyncio.sleep(args.flood_lead_s if flooders else 0)
        started = time.perf_counter()
        samples = await bob(client, args.requests, args.gap_s)
        wall = time.perf_counter() - started
        stop.set()
        await asyncio.gather(*floods)
    return {
        "alice_clients": flooders,
        "bob": summary(samples),
        "alice": {"statuses": dict(tally), "audio_s_per_s": round(sum(audio) / wall, 3) if flooders else 0},
        "wall_s": round(wall, 1),
    }


def server_run(
    args: argparse.Namespace, extra: dict[str, str], flooders: int, log: Path, share: int | None = None
) -> dict[str, Any]:
    """A server with both keys (and `extra`), warmed; bob alone, beside `share` of alice's clients (her
    share, used and not exceeded: what sharing the CPU alone costs him), then beside alice's flood."""
    keys = ",".join(f"{name}:{key}" for name, key in KEYS.items())
    settings = {"KOKORO_API_KEYS": keys, **args.env, **extra}
    if args.engine:
        settings["KOKORO_ENGINE"] = args.engine
    server = launch(process_env(args.weights, **settings), log)
    with serving(server):
        wait_engines_ready(server)
        asyncio.run(phase(server.url, argparse.Namespace(**{**vars(args), "requests": 3}), 0))  # warm-up
        unloaded = asyncio.run(phase(server.url, args, 0))
        polite = asyncio.run(phase(server.url, args, share)) if share else None
        flooded = asyncio.run(phase(server.url, args, flooders))
        limited = {
            found.group(1): float(found.group(2))
            for line in httpx.get(f"{server.url}/metrics").text.splitlines()
            if (found := re.match(r'kokoro_requests_key_limited_total\{.*reason="(\w+)"\} (\S+)', line))
        }
    return {
        "settings": extra,
        "unloaded": unloaded,
        "beside_share": polite,
        "flooded": flooded,
        "limited_reasons": limited,
    }


def ratio(run: dict[str, Any], phase: str = "flooded") -> float | None:
    if run.get(phase) is None:
        return None
    loaded, alone = run[phase]["bob"]["first_audio_p50_s"], run["unloaded"]["bob"]["first_audio_p50_s"]
    return round(loaded / alone, 3) if loaded and alone else None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_weights(parser)
    add_engine(parser)
    add_server_env(parser)
    parser.add_argument("--requests", type=positive_int, default=12, help="bob's requests per phase")
    parser.add_argument("--gap-s", type=float, default=0.5, help="bob's pause between requests")
    parser.add_argument("--factor", type=positive_int, default=4, help="alice's clients, in shares")
    parser.add_argument("--flood-lead-s", type=float, default=5.0, help="the flood's head start on bob")
    parser.add_argument("--within", type=positive_float, default=0.2, help="allowed rise of bob's p50")
    parser.add_argument("--skip-off", action="store_true", help="leave out the run with the limits off")


def prepare(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    args.env = checked_server_env(parser, args)


def run(args: argparse.Namespace) -> int:
    report = Report(args)
    log_dir = Path(tempfile.mkdtemp(prefix="kokoro-bench-keys-"))
    max_inflight = int(args.env.get("KOKORO_MAX_INFLIGHT", Settings.model_fields["max_inflight"].default))
    share = default_share(max_inflight, len(KEYS)) or max_inflight
    flooders = args.factor * share
    results: dict[str, Any] = {"share": share, "alice_clients": flooders}
    results["limits_on"] = server_run(args, {}, flooders, log_dir / "on.log", share)
    results["limits_on"]["bob_p50_ratio"] = ratio(results["limits_on"])
    results["limits_on"]["bob_p50_ratio_beside_share"] = ratio(results["limits_on"], "beside_share")
    report.write(results)
    if not args.skip_off:
        off = {"KOKORO_KEY_MAX_INFLIGHT": "0"}
        results["limits_off"] = server_run(args, off, flooders, log_dir / "off.log")
        results["limits_off"]["bob_p50_ratio"] = ratio(results["limits_off"])
    bob_ok = all(s == "200" for s in results["limits_on"]["flooded"]["bob"]["statuses"]) and bool(
        results["limits_on"]["flooded"]["bob"]["statuses"]
    )
    within = (results["limits_on"]["bob_p50_ratio"] or float("inf")) <= 1 + args.within
    results["checks"] = {"bob_all_200": bob_ok, "bob_first_audio_within": within}
    report.write(results)
    for name in ("limits_on", "limits_off"):
        if name in results:
            run_ = results[name]
            print(
                f"{name}: bob first audio p50 {run_['unloaded']['bob']['first_audio_p50_s']} s alone, "
                f"{run_['flooded']['bob']['first_audio_p50_s']} s beside alice (x{run_['bob_p50_ratio']}); "
                f"bob {run_['flooded']['bob']['statuses']}, alice {run_['flooded']['alice']['statuses']}"
            )
            if run_.get("beside_share"):
                print(f"  beside alice at her share only: x{run_['bob_p50_ratio_beside_share']}")
    return 0 if all(results["checks"].values()) else 1
