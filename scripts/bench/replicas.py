"""Threads per replica vs replicas: which split of C cores serves the most audio, how fast, in how much
memory, and what the server costs over the bare engine.

For C cores (default: the cores this process may run on) every split of T threads x R replicas with
T*R <= C is measured (`--maximal`: only those where neither T nor R can grow). For each split the real
server runs, pinned to the first C cores: R uvicorn workers (`python -m api --workers R`), or with
`--nginx` R single-worker servers behind the repo's nginx config (docker/render_nginx.py), each replica
with T threads (OMP_NUM_THREADS, KOKORO_TORCH_THREADS, KOKORO_ONNX_THREADS = T). Admission limits are
raised (KOKORO_MAX_WAITING = the highest concurrency, KOKORO_MAX_WAIT_S = --timeout) so that no request
gets a 503 at the intended concurrency; pass --server-env to change any setting. Once every replica is
ready, `load`'s closed-loop client runs at concurrency m*R for each multiplier m
(default 1 2 4), for --duration seconds or --requests requests per level, after R warm-up requests. Per level:
throughput (audio seconds per wall second), TTFB and latency p50/p95, 503s, and each replica's memory
(VmRSS after the level and VmHWM, its peak so far, from /proc/PID/status).

The bare engine is measured in the same run, for each T, in a fresh process pinned to the same cores
(scripts/bench/measure.py): the same texts, chunked as the server chunks them, chunks one at a time, one
warm-up then --bare-runs timed runs; its per-text median wall time is what the engine alone needs.

Server overhead of a split, at concurrency R (one request per replica): the completed requests' texts
would take the bare engine B seconds in total (sum of per-text medians), R replicas could do that in B/R;
the server took W seconds of wall time. overhead = 1 - (B / R) / W, as a percentage. For R = 1 this is
1 - server audio-s/s / bare audio-s/s on the same audio (the audio the server delivers: chunks trimmed and
joined with pauses, which the bare figures count the same way). It holds HTTP, G2P, encoding, scheduling
and the load-test client, which shares the machine; for R > 1 also the replicas' contention for memory
bandwidth and caches. Negative means faster than the sequential bare engine (e.g. through batching).

    python -m scripts.bench replicas --weights ~/.cache/kokoro-openai-server/test-registry-weights \\
        --engine torch onnx --duration 60 --out bench-results/<machine>/replicas.json
    python -m scripts.bench replicas --engine onnx --nginx --maximal --requests 12 --texts short
    python -m scripts.bench replicas --cores 1 --engine onnx --duration 5 --multipliers 1 \\
        --texts short --bare-runs 1 --out /tmp/replicas.json
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from scripts.bench import load
from scripts.bench.common import (
    ENGINES,
    Report,
    add_server_env,
    add_weights,
    non_negative_int,
    parse_env,
    positive_int,
    ratio,
    replica_memory,
    warn,
)
from scripts.bench.measure import BareSpec, run_bare
from scripts.harness import Deployment, ServerPlan, deployed, find_nginx

# --- pure parts ------------------------------------------------------------------------------------------


@dataclass(frozen=True, order=True)
class Split:
    """R replicas of T threads each."""

    replicas: int
    threads: int

    @property
    def cores(self) -> int:
        return self.replicas * self.threads

    def is_maximal(self, cores: int) -> bool:
        return (self.threads + 1) * self.replicas > cores and self.threads * (self.replicas + 1) > cores

    def __str__(self) -> str:
        return f"{self.threads}x{self.replicas}"


def enumerate_splits(cores: int, maximal: bool = False) -> list[Split]:
    """Every T x R with T*R <= cores, by replicas then threads; only the maximal ones when asked."""
    if cores < 1:
        raise ValueError(f"cores must be at least 1, not {cores}")
    splits = [Split(r, t) for r in range(1, cores + 1) for t in range(1, cores // r + 1)]
    return [split for split in splits if split.is_maximal(cores)] if maximal else splits


def concurrency_levels(replicas: int, multipliers: Sequence[int]) -> list[int]:
    return sorted({replicas * m for m in multipliers})


def text_medians(groups: Mapping[str, Sequence[Mapping[str, Any]]], label: str) -> list[float]:
    """The bare engine's median wall time per text of a group, in the order of its texts."""
    return [_median(timing["wall_s"]) for timing in groups[label]]


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def per_request_sum(request_indices: Sequence[int], per_text: Sequence[float]) -> float:
    """A per-text figure summed over requests (request i sends text i mod n, as load.py does)."""
    return sum(per_text[index % len(per_text)] for index in request_indices)


def overhead(bare_s: float, replicas: int, wall_s: float) -> float | None:
    """1 - (B / R) / W: the share of the server's wall time that R ideal bare engines would not need."""
    efficiency = ratio(bare_s / replicas, wall_s)
    return None if efficiency is None else 1 - efficiency


# --- one split -------------------------------------------------------------------------------------------


def level_record(level: load.LevelResult, replicas: int, bare: Mapping[str, Any]) -> dict[str, Any]:
    """The figures of one load level, with the bare engine's time (and audio) for the requests completed."""
    done = [sample.index for sample in level.samples if sample.ok]
    bare_s = per_request_sum(done, bare["per_text_median_s"])
    lost = overhead(bare_s, replicas, level.wall_s)
    return {
        **load.level_record(level),
        "status_503": level.status_counts.get("503", 0),
        "bare_engine_s": round(bare_s, 3),
        "bare_audio_s": round(per_request_sum(done, bare["per_text_audio_s"]), 3),
        "overhead_pct": None if lost is None else round(100 * lost, 2),
    }


@dataclass(frozen=True)
class LoadPlan:
    """What the load-test client sends at every level."""

    texts: tuple[str, ...]
    formats: tuple[str, ...]
    voice: str
    requests: int | None
    duration: float | None
    timeout: float
    warmup: int | None  # None: one request per replica

    def config(self, url: str, replicas: int) -> load.LoadConfig:
        return load.LoadConfig(
            url=url, texts=self.texts, formats=self.formats, voice=self.voice, requests=self.requests,
            duration=self.duration, timeout=self.timeout,
            warmup=replicas if self.warmup is None else self.warmup,
        )  # fmt: skip


def measure_split(
    deployment: Deployment, split: Split, sent: LoadPlan, levels: Sequence[int], bare: Mapping[str, Any]
) -> dict[str, Any]:
    record: dict[str, Any] = {"memory_idle": replica_memory(deployment.replica_pids()), "levels": []}
    config = sent.config(deployment.url, split.replicas)
    for concurrency in levels:
        row = level_record(load.run_level(config, concurrency), split.replicas, bare)
        row["memory"] = replica_memory(deployment.replica_pids())
        record["levels"].append(row)
        print(table_row(split, deployment.mode, row), flush=True)
    at_r = next((row for row in record["levels"] if row["concurrency"] == split.replicas), None)
    record["overhead_pct"] = None if at_r is None else at_r["overhead_pct"]
    return record


TABLE_HEADER = (
    f"{'mode':<7} {'TxR':>4} {'conc':>4} {'reqs':>5} {'ok':>4} {'503':>4} {'audio/s':>8} "
    f"{'ttfb p50/p95 s':>15} {'lat p50/p95 s':>15} {'RSS max MiB':>11} {'HWM max MiB':>11} {'overhead':>9}"
)


def table_row(split: Split, mode: str, row: Mapping[str, Any]) -> str:
    rss = max((m["rss_mib"] or 0.0 for m in row["memory"]), default=0.0)
    hwm = max((m["hwm_mib"] or 0.0 for m in row["memory"]), default=0.0)
    lost = "-" if row["overhead_pct"] is None else f"{row['overhead_pct']:.1f}%"
    return (
        f"{mode:<7} {split!s:>4} {row['concurrency']:>4} {row['requests']:>5} {row['ok']:>4} "
        f"{row['status_503']:>4} {row['audio_s_per_s']:>8.3f} {_pair(row, 'ttfb'):>15} "
        f"{_pair(row, 'latency'):>15} {rss:>11.0f} {hwm:>11.0f} {lost:>9}"
    )


def _pair(row: Mapping[str, Any], name: str) -> str:
    p50, p95 = row[f"{name}_p50_s"], row[f"{name}_p95_s"]
    return "-" if p50 is None else f"{p50:.2f}/{p95:.2f}"


# --- the whole run ---------------------------------------------------------------------------------------


def measure_bare(args: argparse.Namespace, engine: str, threads: int, plan: ServerPlan) -> dict[str, Any]:
    """The bare engine on the load test's texts, with the server's settings (its chunk sizes) and cores."""
    texts = {args.texts: list(load.builtin_texts(args.texts))}
    spec = BareSpec(engine, threads, str(args.weights), texts, args.bare_runs, "server", args.voice)
    measured = run_bare(spec, plan.cpus, plan.env)
    per_text = text_medians(measured["groups"], args.texts)
    audio = sum(timing["delivered_audio_s"] for timing in measured["groups"][args.texts])
    speed = ratio(audio, sum(per_text))
    return {
        "threads_effective": measured["threads_effective"],
        "peak_rss_mib": measured["peak_rss_mib"],
        "per_text_median_s": [round(value, 4) for value in per_text],
        "per_text_audio_s": [timing["delivered_audio_s"] for timing in measured["groups"][args.texts]],
        "audio_s_per_s": None if speed is None else round(speed, 4),
        "texts": measured["groups"][args.texts],
    }


def run_engine(
    args: argparse.Namespace, engine: str, splits: Sequence[Split], plan: ServerPlan
) -> dict[str, Any]:
    bare = {}
    for threads in sorted({split.threads for split in splits}):
        bare[threads] = measure_bare(args, engine, threads, plan)
        print(f"bare {engine}, {threads} thread(s): {bare[threads]['audio_s_per_s']} audio-s/s", flush=True)
    engine_plan = replace(plan, env={**plan.env, "KOKORO_ENGINE": engine}, log_dir=plan.log_dir / engine)
    engine_plan.log_dir.mkdir(parents=True, exist_ok=True)
    print(TABLE_HEADER, flush=True)
    results = [run_split(args, engine_plan, split, bare[split.threads]) for split in splits]
    return {"bare": {str(threads): value for threads, value in bare.items()}, "splits": results}


def run_split(
    args: argparse.Namespace, plan: ServerPlan, split: Split, bare: Mapping[str, Any]
) -> dict[str, Any]:
    levels = concurrency_levels(split.replicas, args.multipliers)
    try:
        with deployed(plan, split.replicas, split.threads) as deployment:
            record = measure_split(deployment, split, load_plan(args), levels, bare)
    except (RuntimeError, TimeoutError, OSError) as exc:  # one failed split does not lose the others
        print(f"split {split} failed: {exc}", file=sys.stderr)
        record = {"error": str(exc)[-2000:], "memory_idle": [], "levels": [], "overhead_pct": None}
    return {
        "engine": plan.env["KOKORO_ENGINE"],
        "mode": "workers" if plan.nginx is None else "nginx",
        "threads": split.threads,
        "replicas": split.replicas,
        "maximal": split.is_maximal(args.cores),
        "bare_audio_s_per_s": bare["audio_s_per_s"],
        **record,
    }


def load_plan(args: argparse.Namespace) -> LoadPlan:
    return LoadPlan(
        texts=load.builtin_texts(args.texts), formats=tuple(args.format), voice=args.voice,
        requests=args.requests, duration=None if args.requests else args.duration, timeout=args.timeout,
        warmup=args.warmup,
    )  # fmt: skip


def pinned_cpus(cores: int) -> list[int] | None:
    available = sorted(os.sched_getaffinity(0))
    if cores > len(available):
        warn(f"{cores} cores asked, {len(available)} available: not pinned")
        return None
    return available[:cores]


def base_env(args: argparse.Namespace, max_concurrency: int) -> dict[str, str]:
    env = {
        **os.environ,
        "KOKORO_WEIGHTS_DIR": str(args.weights),
        "KOKORO_MAX_WAITING": str(max_concurrency),
        "KOKORO_MAX_WAIT_S": str(args.timeout),
    }
    if args.max_inflight is not None:
        env["KOKORO_MAX_INFLIGHT"] = str(args.max_inflight)
    return {**env, **parse_env(args.server_env)}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_weights(parser)
    parser.add_argument("--engine", nargs="+", choices=ENGINES, default=["torch"])
    parser.add_argument("--cores", type=positive_int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--maximal", action="store_true", help="only splits where neither T nor R can grow")
    parser.add_argument("--nginx", action="store_true", help="R single-worker servers behind nginx")
    parser.add_argument("--multipliers", nargs="+", type=positive_int, default=[1, 2, 4], help="clients / R")
    amount = parser.add_mutually_exclusive_group()
    amount.add_argument("--duration", type=float, default=60.0, help="seconds per level (default 60)")
    amount.add_argument("--requests", type=positive_int, help="requests per level, instead of --duration")
    parser.add_argument("--warmup", type=non_negative_int, help="warm-up requests per level (default: R)")
    parser.add_argument("--texts", choices=[*load.TEXTS, "mixed"], default="medium", help="`load`'s")
    parser.add_argument("--format", nargs="+", choices=load.FORMATS, default=["pcm"])
    parser.add_argument("--voice", default="af_heart")
    parser.add_argument("--bare-runs", type=positive_int, default=3, help="timed bare-engine runs per text")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per request")
    inflight = "KOKORO_MAX_INFLIGHT (default: the server's)"
    parser.add_argument("--max-inflight", type=positive_int, help=inflight)
    parser.add_argument("--limit-concurrency", type=positive_int, help="uvicorn's --limit-concurrency")
    add_server_env(parser)
    parser.add_argument("--log-dir", type=Path, help="server and nginx logs (default: a temporary directory)")


def run(args: argparse.Namespace) -> int:
    nginx = find_nginx() if args.nginx else None
    if args.nginx and nginx is None:
        print("nginx is not installed (apt-get install nginx-light): nothing to measure with --nginx")
        return 0
    splits = enumerate_splits(args.cores, args.maximal)
    max_concurrency = max(max(concurrency_levels(split.replicas, args.multipliers)) for split in splits)
    report = Report(args)
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="kokoro-replicas-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    plan = ServerPlan(
        base_env(args, max_concurrency), pinned_cpus(args.cores), log_dir, args.limit_concurrency, nginx
    )
    print(f"splits (T threads x R replicas): {', '.join(map(str, splits))}; logs in {log_dir}")
    engines = {engine: run_engine(args, engine, splits, plan) for engine in args.engine}
    server_settings = {key: value for key, value in plan.env.items() if key.startswith("KOKORO_")}
    report.write({
        "pinned_cpus": plan.cpus,
        "server_settings": server_settings,
        "texts": list(load.builtin_texts(args.texts)),
        "overhead_definition": OVERHEAD_DEFINITION,
        "splits": [split for result in engines.values() for split in result["splits"]],
        "bare": {engine: result["bare"] for engine, result in engines.items()},
    })  # fmt: skip
    return 0


OVERHEAD_DEFINITION = (
    "At concurrency R: 1 - (B / R) / W, B = the bare engine's median time (T threads, fresh process, "
    "sequential chunks) summed over the texts of the completed requests, W = the level's wall time. For "
    "R = 1: 1 - server audio-s/s / bare audio-s/s on the same delivered audio."
)
