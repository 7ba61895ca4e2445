"""Threads per replica vs replicas: which split of C cores serves the most audio, how fast, in how much
memory, and what the server costs over the bare engine.

For C cores (default: the cores this process may run on) every split of T threads x R replicas with
T*R <= C is measured (`--maximal`: only those where neither T nor R can grow). For each split the real
server runs, pinned to the first C cores: R uvicorn workers (`python -m api --workers R`), or with
`--nginx` R single-worker servers behind the repo's nginx config (docker/render_nginx.py), each replica
with T threads (OMP_NUM_THREADS, KOKORO_TORCH_THREADS, KOKORO_ONNX_THREADS = T). Admission limits are
raised (KOKORO_MAX_WAITING = the highest concurrency, KOKORO_MAX_WAIT_S = --timeout) so that no request
gets a 503 at the intended concurrency; pass --server-env to change any setting. Once every replica is
ready, scripts/bench/loadtest.py's closed-loop client runs at concurrency m*R for each multiplier m
(default 1 2 4), for --duration seconds or --requests requests per level, after R warm-up requests. Per level:
throughput (audio seconds per wall second), TTFB and latency p50/p95, 503s, and each replica's memory
(VmRSS after the level and VmHWM, its peak so far, from /proc/PID/status).

The bare engine is measured in the same run, for each T, in a fresh process pinned to the same cores
(scripts/benchlib.py): the same texts, chunked as the server chunks them, chunks one at a time, one
warm-up then --bare-runs timed runs; its per-text median wall time is what the engine alone needs.

Server overhead of a split, at concurrency R (one request per replica): the completed requests' texts
would take the bare engine B seconds in total (sum of per-text medians), R replicas could do that in B/R;
the server took W seconds of wall time. overhead = 1 - (B / R) / W, as a percentage. For R = 1 this is
1 - server audio-s/s / bare audio-s/s on the same audio (the audio the server delivers: chunks trimmed and
joined with pauses, which the bare figures count the same way). It holds HTTP, G2P, encoding, scheduling
and the load-test client, which shares the machine; for R > 1 also the replicas' contention for memory
bandwidth and caches. Negative means faster than the sequential bare engine (e.g. through batching).

    python scripts/bench/replica_benchmark.py \\
        --weights-dir ~/.cache/kokoro-openai-server/test-registry-weights \\
        --engines torch onnx --duration 60 --out bench-results/<machine>/replicas.json
    python scripts/bench/replica_benchmark.py --engines onnx --nginx --maximal --requests 12 --texts short
    python scripts/bench/replica_benchmark.py --cores 1 --engines onnx --duration 5 --multipliers 1 \\
        --texts short --bare-runs 1 --out /tmp/replicas.json
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from types import ModuleType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a file: the repository's packages
from api.settings import DEFAULT_WEIGHTS_DIR
from scripts.bench import loadtest
from scripts.bench.loadtest import positive_int
from scripts.benchlib import (
    ROOT,
    BareSpec,
    machine_info,
    parse_kb,
    pinned_to,
    ratio,
    read_text,
    recorded_args,
    run_bare,
    thread_env,
    write_report,
)
from tests.harness import (
    Server,
    engines_logged_ready,
    free_port,
    server_command,
    spawn,
    stop_server,
    wait_ready,
)

READY_TIMEOUT_S = 600
# Measured from the first request on, so beside /ready each worker's own "engine ... ready" line is awaited
# too (tests/harness.py). Should that message change, a server whose /ready has answered 200 this long
# counts as ready anyway.
READY_LOG_GRACE_S = 120
NGINX_FALLBACK = Path("/usr/sbin/nginx")


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
    """A per-text figure summed over requests (request i sends text i mod n, as loadtest.py does)."""
    return sum(per_text[index % len(per_text)] for index in request_indices)


def overhead(bare_s: float, replicas: int, wall_s: float) -> float | None:
    """1 - (B / R) / W: the share of the server's wall time that R ideal bare engines would not need."""
    efficiency = ratio(bare_s / replicas, wall_s)
    return None if efficiency is None else 1 - efficiency


def memory_mib(status_text: str) -> dict[str, float | None]:
    """VmRSS and VmHWM (peak) of a /proc/PID/status text, in MiB."""
    values = {key: parse_kb(status_text, field_name) for key, field_name in MEMORY_FIELDS.items()}
    return {key: None if kb is None else round(kb / 1024, 1) for key, kb in values.items()}


MEMORY_FIELDS = {"rss_mib": "VmRSS", "hwm_mib": "VmHWM"}


def parse_env(items: Sequence[str]) -> dict[str, str]:
    env = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"not KEY=VALUE: {item!r}")
        env[key] = value
    return env


# --- processes -------------------------------------------------------------------------------------------


def child_pids(pid: int) -> list[int]:
    text = read_text(f"/proc/{pid}/task/{pid}/children")
    return [int(child) for child in text.split()]


def worker_pids(server_pid: int) -> list[int]:
    """uvicorn's worker processes (multiprocessing also starts a resource tracker, which is not one)."""
    return [pid for pid in child_pids(server_pid) if "spawn_main" in read_text(f"/proc/{pid}/cmdline")]


def replica_memory(pids: Sequence[int]) -> list[dict[str, Any]]:
    return [{"pid": pid, **memory_mib(read_text(f"/proc/{pid}/status"))} for pid in pids]


def wait_workers_ready(server: Server, watched: Sequence[Server] = (), workers_logged: int = 0) -> None:
    """Until /ready answers 200 and, with several workers in one server, each has logged its readiness."""
    logged = [server, *watched]
    settled = engines_logged_ready(logged, workers_logged, READY_LOG_GRACE_S) if workers_logged else None
    wait_ready(server, READY_TIMEOUT_S, watched, settled)


def api_command(port: int, workers: int, limit_concurrency: int | None) -> list[str]:
    options = [] if limit_concurrency is None else ["--limit-concurrency", str(limit_concurrency)]
    return server_command(port, workers=workers, options=options)


def load_render_nginx() -> ModuleType:
    spec = importlib.util.spec_from_file_location("render_nginx", ROOT / "docker" / "render_nginx.py")
    if spec is None or spec.loader is None:
        raise ImportError("docker/render_nginx.py not found")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def find_nginx() -> str | None:
    found = shutil.which("nginx")
    if found is None and NGINX_FALLBACK.exists():
        found = str(NGINX_FALLBACK)
    return found


@dataclass
class Deployment:
    """The server of one split, up and ready: its URL, its processes, and the pids of its replicas."""

    url: str
    processes: list[Server] = field(default_factory=list)
    mode: str = "workers"

    def replica_pids(self) -> list[int]:
        if self.mode == "nginx":
            return [process.process.pid for process in self.processes[:-1]]  # the last one is nginx
        pid = self.processes[0].process.pid
        return worker_pids(pid) or [pid]  # one worker: uvicorn serves in the main process


@dataclass(frozen=True)
class ServerPlan:
    """How to start the servers of every split: everything but the split itself."""

    env: dict[str, str]
    cpus: list[int] | None
    log_dir: Path
    limit_concurrency: int | None
    nginx: str | None  # the nginx binary, or None for uvicorn workers


@contextmanager
def deployed(plan: ServerPlan, split: Split) -> Iterator[Deployment]:
    deployment = Deployment(url="", mode="workers" if plan.nginx is None else "nginx")
    try:
        if plan.nginx is None:
            start_workers(plan, split, deployment)
        else:
            start_behind_nginx(plan, split, deployment, plan.nginx)
        yield deployment
    finally:
        for process in reversed(deployment.processes):
            stop_server(process)


def server_env(plan: ServerPlan, threads: int) -> dict[str, str]:
    return thread_env(threads, plan.env)


def start_workers(plan: ServerPlan, split: Split, deployment: Deployment) -> None:
    port = free_port()
    log_path = plan.log_dir / f"server-{split}.log"
    command = api_command(port, split.replicas, plan.limit_concurrency)
    server = spawn(command, log_path, port, server_env(plan, split.threads), pinned_to(plan.cpus))
    deployment.processes.append(server)
    deployment.url = server.url
    wait_workers_ready(server, workers_logged=split.replicas)


def start_behind_nginx(plan: ServerPlan, split: Split, deployment: Deployment, nginx: str) -> None:
    upstreams = []
    for replica in range(split.replicas):
        port = free_port()
        log_path = plan.log_dir / f"server-{split}-replica{replica}.log"
        command = api_command(port, 1, plan.limit_concurrency)
        server = spawn(command, log_path, port, server_env(plan, split.threads), pinned_to(plan.cpus))
        deployment.processes.append(server)
        upstreams.append(f"127.0.0.1:{port}")
    replicas = list(deployment.processes)
    for replica_server in replicas:
        wait_workers_ready(replica_server)
    port = free_port()
    render = load_render_nginx()
    conf = render.write_config(plan.log_dir / f"nginx-{split}", upstreams, f"127.0.0.1:{port}")
    command = [nginx, *render.nginx_command(conf)[1:]]
    log_path = plan.log_dir / f"nginx-{split}.log"
    balancer = spawn(command, log_path, port, os.environ, pinned_to(plan.cpus))
    deployment.processes.append(balancer)
    deployment.url = balancer.url
    wait_workers_ready(balancer, watched=replicas)


# --- one split -------------------------------------------------------------------------------------------


def level_record(level: Any, replicas: int, bare: Mapping[str, Any]) -> dict[str, Any]:
    """The figures of one load level, with the bare engine's time (and audio) for the requests completed."""
    done = [sample.index for sample in level.samples if sample.ok]
    bare_s = per_request_sum(done, bare["per_text_median_s"])
    lost = overhead(bare_s, replicas, level.wall_s)
    return {
        "concurrency": level.concurrency,
        "requests": level.requests,
        "ok": level.ok,
        "failed": level.failed,
        "status_503": level.status_counts.get("503", 0),
        "status_counts": level.status_counts,
        "error_kinds": level.error_kinds,
        "wall_s": round(level.wall_s, 3),
        "audio_s": round(level.audio_s, 3),
        "audio_s_per_s": round(level.audio_s_per_s, 4),
        "requests_per_s": round(level.requests_per_s, 4),
        "ttfb_p50_s": rounded(level.ttfb_s, "p50"),
        "ttfb_p95_s": rounded(level.ttfb_s, "p95"),
        "latency_p50_s": rounded(level.latency_s, "p50"),
        "latency_p95_s": rounded(level.latency_s, "p95"),
        "bare_engine_s": round(bare_s, 3),
        "bare_audio_s": round(per_request_sum(done, bare["per_text_audio_s"]), 3),
        "overhead_pct": None if lost is None else round(100 * lost, 2),
    }


def rounded(spread: Any, key: str) -> float | None:
    return None if spread is None else round(getattr(spread, key), 4)


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

    def config(self, url: str, replicas: int) -> Any:
        return loadtest.LoadConfig(
            url=url, texts=self.texts, formats=self.formats, voice=self.voice, requests=self.requests,
            duration=self.duration, timeout=self.timeout,
            warmup=replicas if self.warmup is None else self.warmup,
        )  # fmt: skip


def measure_split(
    deployment: Deployment, split: Split, load: LoadPlan, levels: Sequence[int], bare: Mapping[str, Any]
) -> dict[str, Any]:
    record: dict[str, Any] = {"memory_idle": replica_memory(deployment.replica_pids()), "levels": []}
    config = load.config(deployment.url, split.replicas)
    for concurrency in levels:
        row = level_record(loadtest.run_level(config, concurrency), split.replicas, bare)
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
    texts = {args.texts: list(loadtest.builtin_texts(args.texts))}
    spec = BareSpec(engine, threads, str(args.weights_dir), texts, args.bare_runs, "server", args.voice)
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
        with deployed(plan, split) as deployment:
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
        texts=loadtest.builtin_texts(args.texts), formats=tuple(args.format), voice=args.voice,
        requests=args.requests, duration=None if args.requests else args.duration, timeout=args.timeout,
        warmup=args.warmup,
    )  # fmt: skip


def pinned_cpus(cores: int) -> list[int] | None:
    available = sorted(os.sched_getaffinity(0))
    if cores > len(available):
        print(f"warning: {cores} cores asked, {len(available)} available: not pinned", file=sys.stderr)
        return None
    return available[:cores]


def base_env(args: argparse.Namespace, max_concurrency: int) -> dict[str, str]:
    env = {
        **os.environ,
        "KOKORO_WEIGHTS_DIR": str(args.weights_dir),
        "KOKORO_MAX_WAITING": str(max_concurrency),
        "KOKORO_MAX_WAIT_S": str(args.timeout),
    }
    if args.max_inflight is not None:
        env["KOKORO_MAX_INFLIGHT"] = str(args.max_inflight)
    return {**env, **parse_env(args.server_env)}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    weights = Path(os.environ.get("KOKORO_WEIGHTS_DIR", DEFAULT_WEIGHTS_DIR))
    parser.add_argument("--weights-dir", type=Path, default=weights, help=f"(default {weights})")
    parser.add_argument("--engines", nargs="+", choices=["torch", "onnx"], default=["torch"])
    parser.add_argument("--cores", type=positive_int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--maximal", action="store_true", help="only splits where neither T nor R can grow")
    parser.add_argument("--nginx", action="store_true", help="R single-worker servers behind nginx")
    parser.add_argument(
        "--multipliers", nargs="+", type=positive_int, default=[1, 2, 4], help="concurrency / R"
    )
    amount = parser.add_mutually_exclusive_group()
    amount.add_argument("--duration", type=float, default=60.0, help="seconds per level (default 60)")
    amount.add_argument("--requests", type=positive_int, help="requests per level, instead of --duration")
    parser.add_argument(
        "--warmup", type=loadtest.non_negative_int, help="warm-up requests per level (default: R)"
    )
    parser.add_argument("--texts", choices=[*loadtest.TEXTS, "mixed"], default="medium", help="loadtest.py's")
    parser.add_argument("--format", nargs="+", choices=loadtest.FORMATS, default=["pcm"])
    parser.add_argument("--voice", default="af_heart")
    parser.add_argument("--bare-runs", type=positive_int, default=3, help="timed bare-engine runs per text")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per request")
    parser.add_argument(
        "--max-inflight", type=positive_int, help="KOKORO_MAX_INFLIGHT (default: the server's)"
    )
    parser.add_argument("--limit-concurrency", type=positive_int, help="uvicorn's --limit-concurrency")
    parser.add_argument(
        "--server-env", nargs="*", default=[], metavar="KEY=VALUE", help="more server settings"
    )
    parser.add_argument("--log-dir", type=Path, help="server and nginx logs (default: a temporary directory)")
    parser.add_argument("--out", type=Path, default=Path("bench-results/replicas.json"))
    parser.add_argument("--label", help="free text stored in the JSON")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    nginx = find_nginx() if args.nginx else None
    if args.nginx and nginx is None:
        print("nginx is not installed (apt-get install nginx-light): nothing to measure with --nginx")
        return 0
    splits = enumerate_splits(args.cores, args.maximal)
    max_concurrency = max(max(concurrency_levels(split.replicas, args.multipliers)) for split in splits)
    machine = machine_info()
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="kokoro-replicas-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    plan = ServerPlan(
        base_env(args, max_concurrency), pinned_cpus(args.cores), log_dir, args.limit_concurrency, nginx
    )
    print(f"splits (T threads x R replicas): {', '.join(map(str, splits))}; logs in {log_dir}")
    engines = {engine: run_engine(args, engine, splits, plan) for engine in args.engines}
    report = build_report(args, machine, plan, engines)
    write_report(report, args.out)
    return 0


def build_report(
    args: argparse.Namespace, machine: dict[str, Any], plan: ServerPlan, engines: dict[str, Any]
) -> dict[str, Any]:
    server_settings = {key: value for key, value in plan.env.items() if key.startswith("KOKORO_")}
    return {
        "label": args.label,
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "args": recorded_args(args),
        "machine": {**machine, "load_average_end": list(os.getloadavg())},
        "pinned_cpus": plan.cpus,
        "server_settings": server_settings,
        "texts": list(loadtest.builtin_texts(args.texts)),
        "overhead_definition": OVERHEAD_DEFINITION,
        "splits": [split for result in engines.values() for split in result["splits"]],
        "bare": {engine: result["bare"] for engine, result in engines.items()},
    }


OVERHEAD_DEFINITION = (
    "At concurrency R: 1 - (B / R) / W, B = the bare engine's median time (T threads, fresh process, "
    "sequential chunks) summed over the texts of the completed requests, W = the level's wall time. For "
    "R = 1: 1 - server audio-s/s / bare audio-s/s on the same delivered audio."
)


if __name__ == "__main__":
    sys.exit(main())
