"""Soak test: many requests of mixed lengths, formats, voices and modes against one server, with clients
that hang up mid-stream and clients that read slowly; the server's RSS, threads and open files sampled as
it goes. Writes JSON; exits 1 when a check fails.

    python -m scripts.bench soak --start tone --requests 500 --out bench-results/<machine>/soak.json
    python -m scripts.bench soak --url http://127.0.0.1:8880 --pid 1234 --requests 500

--start tone runs `python -m tests.tone_server` (the real server over the fake tone engine: the HTTP, text,
G2P and encoder paths at full speed); --start api runs the real model (`python -m api`, KOKORO_* from the
environment). Checks: no 5xx and no lost request (every response is a 200 unless the client hung up on
purpose); in-flight and waiting back to 0; threads and open files back to where they were after the
warm-up; RSS over the second half within `--rss-growth` of its first sample there (a plateau).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from scripts.bench.common import Report, positive_int
from scripts.harness import Server, process_env, server_command, spawn, started, stop_server

FORMATS = ("mp3", "opus", "aac", "flac", "wav", "pcm")
VOICES = ("af_heart", "af_bella", "am_michael", "bf_emma", "af_heart(2)+am_adam(1)", "alloy")
TEXTS = (
    "Hello.",
    "The train leaves at 3:30 PM on Nov 22, 2026, from platform 4.",
    "It was a bright cold day in April, and the clocks were striking thirteen. Winston Smith, his chin "
    "nuzzled into his breast in an effort to escape the vile wind, slipped quickly through the glass doors.",
    " ".join(["Tickets cost $12.50 each, about 45% less than in 2019, and the queue moved slowly."] * 6),
)
MODES = ("read", "read", "read", "hang_up", "slow", "whole", "sse")


@dataclass
class Tally:
    statuses: dict[str, int] = field(default_factory=dict)
    modes: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    audio_bytes: int = 0

    def count(self, mode: str, status: str) -> None:
        self.statuses[status] = self.statuses.get(status, 0) + 1
        self.modes[mode] = self.modes.get(mode, 0) + 1


def process_sample(pid: int) -> dict[str, int]:
    status = Path(f"/proc/{pid}/status").read_text()
    rss_kib = int(re.search(r"VmRSS:\s+(\d+)", status).group(1))  # type: ignore[union-attr]
    threads = int(re.search(r"Threads:\s+(\d+)", status).group(1))  # type: ignore[union-attr]
    return {"rss_mib": rss_kib // 1024, "threads": threads, "open_files": len(os.listdir(f"/proc/{pid}/fd"))}


def gauges(metrics: str) -> dict[str, float]:
    names = ("kokoro_requests_in_flight", "kokoro_requests_waiting", "kokoro_engine_queue_depth")
    found = dict(re.findall(rf"^({'|'.join(names)}) (\S+)$", metrics, flags=re.MULTILINE))
    return {name: float(value) for name, value in found.items()}


async def one_request(client: httpx.AsyncClient, rng: random.Random, tally: Tally) -> None:
    mode = rng.choice(MODES)
    body: dict[str, Any] = {
        "model": "tts-1",
        "input": rng.choice(TEXTS),
        "voice": rng.choice(VOICES),
        "response_format": rng.choice(FORMATS),
        "speed": rng.choice((0.8, 1.0, 1.0, 1.3)),
        "stream": mode != "whole",
    }
    if mode == "sse":
        body["stream_format"] = "sse"
    try:
        async with client.stream("POST", "/v1/audio/speech", json=body) as response:
            status = str(response.status_code)
            async for data in response.aiter_bytes():
                tally.audio_bytes += len(data)
                if mode == "hang_up":
                    status = "hung_up"
                    break  # leaving the block closes the connection mid-stream
                if mode == "slow":
                    await asyncio.sleep(0.2)
    except httpx.HTTPError as exc:
        status = f"error:{type(exc).__name__}"
        tally.errors.append(f"{mode}: {exc!r}")
    tally.count(mode, status)


async def soak(args: argparse.Namespace, pid: int | None) -> dict[str, Any]:
    rng = random.Random(args.seed)
    tally = Tally()
    samples: list[dict[str, Any]] = []
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    limits = httpx.Limits(max_connections=args.clients)
    async with httpx.AsyncClient(base_url=args.url, timeout=600, headers=headers, limits=limits) as client:
        queue: asyncio.Queue[int] = asyncio.Queue()
        for index in range(args.requests):
            queue.put_nowait(index)
        done = 0

        async def worker() -> None:
            nonlocal done
            while not queue.empty():
                queue.get_nowait()
                await one_request(client, rng, tally)
                done += 1
                if pid is not None and done % args.sample_every == 0:
                    samples.append({"requests": done, **process_sample(pid)})

        started = time.monotonic()
        await asyncio.gather(*(worker() for _ in range(args.clients)))
        wall = time.monotonic() - started
        await asyncio.sleep(args.settle_s)
        after = gauges((await client.get("/metrics")).text)
    final = process_sample(pid) if pid is not None else {}
    return {
        "wall_s": round(wall, 1),
        "tally": vars(tally),
        "samples": samples,
        "final": final,
        "gauges": after,
    }


def checks(result: dict[str, Any], rss_growth: float) -> dict[str, bool]:
    statuses = result["tally"]["statuses"]
    bad = {status: count for status, count in statuses.items() if status not in ("200", "hung_up")}
    verdict = {
        "no_5xx_or_lost": not bad,
        "gauges_back_to_zero": all(v == 0 for v in result["gauges"].values()),
    }
    samples = result["samples"]
    if len(samples) >= 4:
        second = samples[len(samples) // 2 :]
        first = samples[1]  # after the first samples' warm-up (G2P lexicons, encoders)
        final = result["final"]
        verdict["rss_plateau"] = max(s["rss_mib"] for s in second) <= second[0]["rss_mib"] * (1 + rss_growth)
        verdict["threads_bounded"] = final["threads"] <= max(s["threads"] for s in samples[:2]) + 2
        verdict["open_files_bounded"] = final["open_files"] <= first["open_files"] + 4
    return verdict


def start_server(kind: str, port: int, log: Path, weights: Path | None) -> Server:
    """`--start`'s server on `port`, once ready."""
    module = "tests.tone_server" if kind == "tone" else "api"
    return started(spawn(server_command(port, module), log, port, process_env(weights)))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", default=None, help="a running server (else --start)")
    parser.add_argument(
        "--pid", type=int, default=None, help="the running server's process, for RSS/threads/fds"
    )
    parser.add_argument("--start", choices=("tone", "api"), default=None, help="start a server of this kind")
    parser.add_argument("--port", type=int, default=8899)
    parser.add_argument("--weights", type=Path, default=None, help="KOKORO_WEIGHTS_DIR for --start")
    parser.add_argument("--requests", type=positive_int, default=500)
    clients = "concurrent clients (keep within admission)"
    parser.add_argument("--clients", type=positive_int, default=8, help=clients)
    parser.add_argument("--sample-every", type=positive_int, default=50)
    parser.add_argument("--settle-s", type=float, default=2.0)
    parser.add_argument(
        "--rss-growth", type=float, default=0.10, help="allowed RSS growth over the second half"
    )
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--seed", type=int, default=0)


def prepare(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.url is None and args.start is None:
        parser.error("give --url (and --pid) or --start")


def run(args: argparse.Namespace) -> int:
    report = Report(args)
    server = None
    if args.start:
        log = Path(f"/tmp/soak-server-{args.port}.log")
        server = start_server(args.start, args.port, log, args.weights)
        args.url, args.pid = server.url, server.process.pid
    try:
        result = asyncio.run(soak(args, args.pid))
    finally:
        if server is not None:
            stop_server(server)
    result["checks"] = checks(result, args.rss_growth)
    report.write(result)
    return 0 if all(result["checks"].values()) else 1
