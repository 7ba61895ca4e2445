"""The pure parts of the benchmarks (scripts/bench: common.py, measure.py, threads.py, replicas.py,
plot_performance.py, ...): split enumeration, statistics, machine-info parsing, the overhead figure, the
report's schema. No model."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from scripts import harness
from scripts.bench import __main__ as bench
from scripts.bench import batching as bench_batching
from scripts.bench import books as bench_books
from scripts.bench import common, measure
from scripts.bench import gpu_server as bench_gpu_server
from scripts.bench import load as loadtest
from scripts.bench import ready as bench_ready
from scripts.bench import replicas as replica_benchmark
from scripts.bench import threads as thread_benchmark
from scripts.tools import check_precision, check_word_starts

Split = replica_benchmark.Split


# --- splits ----------------------------------------------------------------------------------------------


def test_every_split_of_two_cores() -> None:
    splits = replica_benchmark.enumerate_splits(2)
    assert [(s.threads, s.replicas) for s in splits] == [(1, 1), (2, 1), (1, 2)]
    assert [(s.threads, s.replicas) for s in replica_benchmark.enumerate_splits(2, maximal=True)] == [
        (2, 1),
        (1, 2),
    ]


@pytest.mark.parametrize("cores", [1, 3, 4, 6, 8, 12])
def test_splits_fit_and_maximal_ones_cannot_grow(cores: int) -> None:
    splits = replica_benchmark.enumerate_splits(cores)
    pairs = {(s.threads, s.replicas) for s in splits}
    expected = {(t, r) for t in range(1, cores + 1) for r in range(1, cores + 1) if t * r <= cores}
    assert pairs == expected
    assert len(splits) == len(pairs)
    for split in replica_benchmark.enumerate_splits(cores, maximal=True):
        assert (split.threads + 1, split.replicas) not in pairs
        assert (split.threads, split.replicas + 1) not in pairs


def test_maximal_splits_of_four_cores() -> None:
    maximal = replica_benchmark.enumerate_splits(4, maximal=True)
    assert [(s.threads, s.replicas) for s in maximal] == [(4, 1), (2, 2), (1, 4)]
    assert str(Split(replicas=2, threads=3)) == "3x2"
    assert Split(replicas=2, threads=3).cores == 6


def test_no_splits_without_cores() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        replica_benchmark.enumerate_splits(0)


def test_concurrency_levels_are_multiples_of_the_replicas() -> None:
    assert replica_benchmark.concurrency_levels(2, [1, 2, 4]) == [2, 4, 8]
    assert replica_benchmark.concurrency_levels(3, [4, 1, 1]) == [3, 12]


# --- overhead --------------------------------------------------------------------------------------------


def test_per_request_sum_follows_the_text_rotation() -> None:
    assert replica_benchmark.per_request_sum([0, 1, 2, 3, 4], [1.0, 2.0]) == 7.0
    assert replica_benchmark.per_request_sum([], [1.0]) == 0.0


def test_overhead_compares_with_r_ideal_bare_engines() -> None:
    assert replica_benchmark.overhead(9.0, 1, 10.0) == pytest.approx(0.1)
    assert replica_benchmark.overhead(16.0, 2, 10.0) == pytest.approx(0.2)
    assert replica_benchmark.overhead(12.0, 1, 10.0) == pytest.approx(-0.2)  # faster than the bare engine
    assert replica_benchmark.overhead(5.0, 1, 0.0) is None


def test_text_medians_per_text() -> None:
    groups = {"medium": [{"wall_s": [3.0, 1.0, 2.0]}, {"wall_s": [4.0, 1.0]}]}
    assert replica_benchmark.text_medians(groups, "medium") == [2.0, 2.5]


def sample(index: int, status: int = 200, audio_s: float = 2.0, latency_s: float = 1.0) -> Any:
    ok = status == 200
    return loadtest.Sample(
        index=index, format="pcm", start_s=0.0, status=status, error=None if ok else f"http_{status}",
        size_bytes=100, headers_s=0.1, ttfb_s=0.2, latency_s=latency_s, audio_s=audio_s if ok else None,
    )  # fmt: skip


def test_level_record_counts_the_bare_time_of_the_completed_requests() -> None:
    samples = [sample(0), sample(1), sample(2, status=503), sample(3)]
    level = loadtest.summarize(1, samples, wall_s=10.0)
    bare = {"per_text_median_s": [2.0, 3.0, 5.0], "per_text_audio_s": [2.0, 2.0, 2.0]}
    row = replica_benchmark.level_record(level, 1, bare)
    assert row["bare_engine_s"] == pytest.approx(2.0 + 3.0 + 2.0)  # requests 0, 1 and 3 (text 0 again)
    assert row["bare_audio_s"] == pytest.approx(6.0)
    assert row["audio_s"] == pytest.approx(6.0)
    assert row["overhead_pct"] == pytest.approx(30.0)
    assert row["status_503"] == 1
    assert (row["ok"], row["failed"]) == (3, 1)
    assert row["latency_p50_s"] == pytest.approx(1.0)
    assert row["ttfb_p95_s"] == pytest.approx(0.2)
    row["memory"] = [{"pid": 1, "rss_mib": 800.0, "hwm_mib": 900.0}]
    line = replica_benchmark.table_row(Split(replicas=1, threads=2), "workers", row)
    assert "2x1" in line
    assert "30.0%" in line


def test_level_record_of_a_level_without_successes() -> None:
    level = loadtest.summarize(2, [sample(0, status=503)], wall_s=1.0)
    row = replica_benchmark.level_record(level, 2, {"per_text_median_s": [1.0], "per_text_audio_s": [1.0]})
    assert row["latency_p50_s"] is None
    assert row["overhead_pct"] == pytest.approx(100.0)
    row["memory"] = []
    assert " - " in replica_benchmark.table_row(Split(replicas=2, threads=1), "nginx", row)


# --- /proc parsing ---------------------------------------------------------------------------------------

CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 9R14 96-Core Processor
flags\t\t: fpu sse2 avx avx2 avx512f avx512_vnni sha_ni

processor\t: 1
model name\t: AMD EPYC 9R14 96-Core Processor
flags\t\t: fpu sse2 avx avx2 avx512f avx512_vnni sha_ni
"""

STATUS = """Name:\tpython
VmPeak:\t 3000000 kB
VmHWM:\t  921600 kB
VmRSS:\t  819200 kB
Threads:\t4
"""


def test_cpuinfo_model_and_flags() -> None:
    info = common.parse_cpuinfo(CPUINFO)
    assert info["cpu_model"] == "AMD EPYC 9R14 96-Core Processor"
    assert info["flags"]["avx2"] is True
    assert info["flags"]["avx512f"] is True
    assert info["flags"]["avx512_vnni"] is True
    assert info["flags"]["amx_tile"] is False
    assert info["amx"] is False


def test_cpuinfo_amx_and_missing_fields() -> None:
    info = common.parse_cpuinfo("model name : Intel Xeon\nflags : avx2 amx_bf16 amx_tile amx_int8\n")
    assert info["amx"] is True
    assert info["flags"]["amx_int8"] is True
    assert info["flags"]["avx512f"] is False
    empty = common.parse_cpuinfo("")
    assert empty["cpu_model"] is None
    assert not any(empty["flags"].values())


def test_kb_fields_and_memory_in_mib() -> None:
    assert common.parse_kb(STATUS, "VmRSS") == 819200
    assert common.parse_kb(STATUS, "VmSwap") is None
    assert common.parse_kb("MemTotal:       24576000 kB\n", "MemTotal") == 24576000
    assert common.memory_mib(STATUS) == {"rss_mib": 800.0, "hwm_mib": 900.0}
    assert common.memory_mib("") == {"rss_mib": None, "hwm_mib": None}


def test_machine_info_names_what_the_figures_depend_on() -> None:
    info = common.machine_info()
    assert info["logical_cores"] >= 1
    assert 1 <= info["affinity_cores"] <= info["logical_cores"]
    assert set(common.INTERESTING_FLAGS) == set(info["flags"])
    assert {"cpu_model", "python", "torch", "onnxruntime", "amx", "load_average"} <= set(info)


def test_worker_pids_of_a_process_without_children() -> None:
    assert harness.worker_pids(2**22 + 12345) == []  # no such process: no workers, no error


# --- statistics and the thread benchmark's rows ----------------------------------------------------------


def test_latency_stats() -> None:
    stats = common.latency_stats([1.0, 4.0, 2.0, 3.0])
    assert stats == {"mean_s": 2.5, "median_s": 2.5, "min_s": 1.0, "max_s": 4.0}
    with pytest.raises(ValueError, match="no timings"):
        common.latency_stats([])


def test_ratio_guards_division_by_zero() -> None:
    assert common.ratio(3.0, 2.0) == 1.5
    assert common.ratio(3.0, 0.0) is None


def test_run_walls_add_up_the_texts_of_a_group() -> None:
    timings = [{"wall_s": [1.0, 2.0]}, {"wall_s": [0.5, 0.25]}]
    assert thread_benchmark.run_walls(timings) == [1.5, 2.25]


def timing(walls: list[float], audio_s: float = 4.0) -> dict[str, Any]:
    return {"tokens": 100, "chunks": 2, "audio_s": audio_s, "delivered_audio_s": audio_s, "wall_s": walls}


def test_result_row_rtf_and_speed() -> None:
    row = thread_benchmark.result_row("onnx", 2, "medium", [timing([1.0, 3.0, 2.0])])
    assert (row["mean_s"], row["median_s"]) == (2.0, 2.0)
    assert row["rtf"] == 0.5
    assert row["audio_s_per_s"] == 2.0
    assert (row["tokens"], row["chunks"]) == (100, 2)


def test_speedups_are_against_the_fewest_threads_of_the_same_engine_and_text() -> None:
    rows = [
        thread_benchmark.result_row("torch", 4, "short", [timing([1.0])]),
        thread_benchmark.result_row("torch", 1, "short", [timing([3.0])]),
        thread_benchmark.result_row("torch", 2, "short", [timing([1.5])]),
        thread_benchmark.result_row("onnx", 2, "short", [timing([2.0])]),
        thread_benchmark.result_row("torch", 2, "long", [timing([5.0])]),
    ]
    thread_benchmark.add_speedups(rows)
    assert [row["speedup"] for row in rows] == [3.0, 1.0, 2.0, 1.0, 1.0]
    assert [row["speedup_baseline_threads"] for row in rows] == [1, 1, 1, 2, 2]
    assert "3.00x" in thread_benchmark.table_row(rows[0])


def test_thread_benchmark_defaults() -> None:
    args = bench.parse_args(["threads"])
    assert args.threads == [1, 2, 4, 8]
    assert args.runs == 10
    assert args.engine == ["torch", "onnx"]
    assert args.texts == ["short", "medium", "long"]


# --- the measuring process's inputs ----------------------------------------------------------------------


def test_thread_env_sets_every_thread_knob() -> None:
    env = harness.process_env(threads=3, base={"PATH": "/bin", "OMP_NUM_THREADS": "16"})
    assert env["PATH"] == "/bin"
    for key in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "KOKORO_TORCH_THREADS", "KOKORO_ONNX_THREADS"):
        assert env[key] == "3"
    assert env["HF_HUB_OFFLINE"] == "1"


def test_bare_spec_is_checked() -> None:
    measure.BareSpec("onnx", 1, "/w", {"short": ["Hi."]}, 1)
    with pytest.raises(ValueError, match="unknown"):
        measure.BareSpec("tensorrt", 1, "/w", {}, 1)
    with pytest.raises(ValueError, match="unknown"):
        measure.BareSpec("onnx", 1, "/w", {}, 1, chunking="sentences")
    with pytest.raises(ValueError, match="at least 1"):
        measure.BareSpec("onnx", 0, "/w", {}, 1)


def test_parse_env() -> None:
    assert common.parse_env(["A=1", "B=x=y", "C="]) == {"A": "1", "B": "x=y", "C": ""}
    with pytest.raises(ValueError, match="KEY=VALUE"):
        common.parse_env(["novalue"])


# --- figures ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def plot_performance() -> ModuleType:
    pytest.importorskip("matplotlib")  # the `bench` extra
    from scripts.bench import plot_performance

    return plot_performance


THREADS_REPORT = {
    "machine": {"cpu_model": "Test CPU", "affinity_cores": 2},
    "results": [
        {"engine": "onnx", "threads": 2, "text": "short", "rtf": 0.3},
        {"engine": "onnx", "threads": 1, "text": "short", "rtf": 0.5},
        {"engine": "torch", "threads": 1, "text": "long", "rtf": 0.9},
        {"engine": "torch", "threads": 1, "text": "short", "rtf": None},
    ],
}
REPLICAS_REPORT = {
    "machine": {"cpu_model": "Test CPU", "affinity_cores": 2},
    "splits": [
        {
            "engine": "onnx", "mode": "workers", "threads": 1, "replicas": 2,
            "levels": [
                {"concurrency": 4, "latency_p50_s": 6.0, "audio_s_per_s": 3.0},
                {"concurrency": 2, "latency_p50_s": 3.0, "audio_s_per_s": 2.8},
                {"concurrency": 8, "latency_p50_s": None, "audio_s_per_s": 0.0},
            ],
        },
        {"engine": "onnx", "mode": "nginx", "threads": 2, "replicas": 1, "levels": []},
    ],
}  # fmt: skip


def test_rtf_series_by_engine_and_text(plot_performance: ModuleType) -> None:
    series = plot_performance.rtf_series(THREADS_REPORT["results"])
    assert series == {"onnx": {"short": [(1, 0.5), (2, 0.3)]}, "torch": {"long": [(1, 0.9)]}}


def test_split_series_by_panel_and_split(plot_performance: ModuleType) -> None:
    series = plot_performance.split_series(REPLICAS_REPORT["splits"])
    assert series == {
        "onnx (workers)": {"1 thr x 2 rep": [(3.0, 2.8, 2), (6.0, 3.0, 4)]},
        "onnx (nginx)": {"2 thr x 1 rep": []},
    }


def test_figures_are_written(plot_performance: ModuleType, tmp_path: Path) -> None:
    threads_json, replicas_json = tmp_path / "threads.json", tmp_path / "replicas.json"
    threads_json.write_text(json.dumps(THREADS_REPORT))
    replicas_json.write_text(json.dumps(REPLICAS_REPORT))
    out = tmp_path / "img"
    argv = ["--threads-json", str(threads_json), "--replicas-json", str(replicas_json), "--out-dir", str(out)]
    assert plot_performance.main(argv) == 0
    for name in (plot_performance.THREADS_PNG, plot_performance.REPLICAS_PNG):
        assert (out / name).read_bytes().startswith(b"\x89PNG")
    none = str(tmp_path / "none")
    assert plot_performance.main(["--results", none, "--threads-json", none, "--replicas-json", "x"]) == 1


# --- bench_batching.py -------------------------------------------------------------------------------------


def test_batch_items_follow_the_mix_and_differ_between_items() -> None:
    pool = list(range(1, 101))
    items = bench_batching.batch_items(pool, "mixed", 6)
    assert [len(tokens) for tokens in items] == [30, 120, 250, 60, 30, 120]
    assert items[0] != items[4]  # same length, other offset in the paragraph


def test_ratios_compare_with_batch_one_and_the_library_of_the_same_mix() -> None:
    def point(path: str, size: int, throughput: float, latency: float, mix: str = "short") -> dict[str, Any]:
        return {
            "path": path, "dtype": "fp32", "mix": mix, "batch_size": size,
            "audio_s_per_s": throughput, "chunk_latency_s": latency,
        }  # fmt: skip

    points = [
        point("library", 1, 2.0, 1.0),
        point("batched", 1, 1.9, 1.05),
        point("library", 4, 2.0, 1.9),
        point("batched", 4, 3.8, 2.0),
        point("batched", 4, 9.0, 9.0, mix="long"),
        {"path": "batched", "dtype": "fp32", "mix": "short", "batch_size": 64, "error": "out of memory"},
    ]
    bench_batching.add_ratios(points)
    assert points[3]["throughput_vs_batch1"] == 2.0
    assert points[3]["throughput_vs_library"] == 1.9  # the library on the same four items
    assert points[1]["latency_vs_library"] == 1.05
    assert "throughput_vs_batch1" not in points[4]  # no batch-1 point for "long"
    assert "throughput_vs_library" not in points[4]
    assert "throughput_vs_batch1" not in points[5]


def test_server_ratios_are_on_over_off_per_level() -> None:
    def row(concurrency: int, throughput: float, ttfb: float) -> dict[str, Any]:
        return {
            "concurrency": concurrency, "audio_s_per_s": throughput, "ttfb_p50_s": ttfb, "ttfb_p95_s": ttfb,
            "latency_p50_s": ttfb, "latency_p95_s": None,
        }  # fmt: skip

    runs = {
        "max_batch_1": [row(1, 2.0, 1.0), row(4, 2.0, 4.0)],
        "max_batch_4": [row(1, 2.0, 1.1), row(4, 3.0, 2.0)],
    }
    args = bench.parse_args(["batching", "server", "--max-batch-size", "4"])
    ratios = bench_batching.server_ratios(runs, args)
    assert ratios[0]["audio_s_per_s_on_over_off"] == 1.0
    assert ratios[0]["ttfb_p50_s_on_over_off"] == 1.1
    assert ratios[1]["audio_s_per_s_on_over_off"] == 1.5
    assert "latency_p95_s_on_over_off" not in ratios[1]


# --- the GPU server benchmark ------------------------------------------------------------------------------


def test_gpu_server_knee_is_the_last_level_that_still_added_throughput() -> None:
    levels = [
        {"concurrency": c, "audio_s_per_s": a}
        for c, a in ((1, 60.0), (8, 188.0), (32, 274.0), (64, 333.0), (128, 359.0), (256, 378.0))
    ]
    assert bench_gpu_server.knee(levels) == 64  # 359 is under 1.1 x 333; 378 under 1.1 x 359
    assert bench_gpu_server.knee(levels[:1]) is None
    flat = [{"concurrency": c, "audio_s_per_s": 100.0} for c in (1, 2, 4)]
    assert bench_gpu_server.knee(flat) is None


def test_gpu_server_variants_and_gpu_samples() -> None:
    assert bench_gpu_server.parse_variant(["bf16", "KOKORO_TORCH_PRECISION=bf16", "A=b=c"]) == (
        "bf16",
        {"KOKORO_TORCH_PRECISION": "bf16", "A": "b=c"},
    )
    with pytest.raises(SystemExit, match="KEY=VALUE"):
        bench_gpu_server.parse_variant(["x", "oops"])
    sampler = bench_gpu_server.GpuSampler(rows=[(1.0, 50.0, 100.0), (2.0, 90.0, 300.0), (5.0, 10.0, 50.0)])
    assert sampler.summary(0.5, 2.5) == {
        "gpu_util_mean_pct": 70.0,
        "gpu_memory_max_mib": 300.0,
        "gpu_samples": 2,
    }
    assert sampler.summary(10.0, 11.0)["gpu_samples"] == 0


# --- check_word_starts ------------------------------------------------------------------------------------


def test_frication_onset_finds_where_a_hiss_begins() -> None:
    rate = 24000
    rng = np.random.default_rng(0)
    time = np.arange(rate) / rate
    vowel = 0.3 * np.sin(2 * np.pi * 220 * time)  # one second of a low tone
    hiss = 0.1 * np.diff(rng.standard_normal(rate + 1))  # white noise, differenced: most energy up high
    samples = np.where((time >= 0.5) & (time < 0.65), hiss, vowel).astype(np.float32)
    hissing = check_word_starts.frication(samples, rate)
    onset = check_word_starts.frication_onset(hissing, near=0.6)
    assert onset is not None
    assert abs(onset - 0.5) <= 0.01
    assert check_word_starts.frication_onset(hissing, near=0.9) is None  # nothing within 250 ms before


def test_fricative_differences_skip_words_after_pauses_and_hisses() -> None:
    hissing = np.zeros(400, dtype=bool)
    hissing[100:120] = True  # 0.50-0.60 s
    hissing[190:205] = True  # 0.95-1.025 s: "some" after "us"
    hissing[310:325] = True  # 1.55-1.625 s: "so" after a pause
    items = [
        {"word": "we", "start_time": 0.2, "end_time": 0.5},
        {"word": "sat", "start_time": 0.58, "end_time": 0.8},  # heard from 0.50: 80 ms late
        {"word": "us", "start_time": 0.8, "end_time": 1.0},
        {"word": "some", "start_time": 1.0, "end_time": 1.2},  # after a hiss: left out
        {"word": "bread,", "start_time": 1.2, "end_time": 1.4},
        {"word": "so", "start_time": 1.6, "end_time": 1.8},  # after a pause: left out
    ]
    differences = check_word_starts.fricative_differences(items, hissing)
    assert differences == pytest.approx([0.08])


# --- bench_ready -----------------------------------------------------------------------------------------

READY_LOG = """\
2026-11-28 08:47:23,300 INFO __main__: allocator: tcmalloc (reuses freed activations)
2026-11-28 08:47:26,912 INFO api.server.app: engine: torch (KOKORO_ENGINE=torch)
2026-11-28 08:47:27,020 INFO api.access: GET /ready 503 28 ms
2026-11-28 08:47:34,082 INFO api.engine.torch_engine: KModel loaded from /w on cpu (decoder bf16)
2026-11-28 08:47:40,207 INFO api.engine.torch_engine: compiled kernels: 7 graphs loaded from the cache, \
0 built (cache /c)
2026-11-28 08:47:41,339 INFO api.engine.scheduling.scheduler: engine torch ready in 14.4 s; \
batching: BatchPolicy()
2026-11-28 08:47:44,000 INFO api.engine.scheduling.scheduler: engine torch ready in 1.0 s (a later line)
"""


def test_ready_phases_are_read_from_the_log_against_the_start() -> None:
    started = bench_ready.log_times(READY_LOG)[0][0] - 2.5  # the process began 2.5 s before its first line
    assert bench_ready.phase_times(READY_LOG, started) == {
        "python": 2.5,
        "app": 6.11,
        "load": 13.28,
        "warmup": 19.41,
        "engine_ready": 20.54,
    }
    assert bench_ready.GRAPHS.search(READY_LOG).groups() == ("7", "0")


def test_ready_phases_not_logged_are_left_out() -> None:
    onnx_log = "2026-11-28 08:47:26,912 INFO api.server.app: engine: onnx (chosen)\nnot a log line\n"
    started = bench_ready.log_times(onnx_log)[0][0] - 1.0
    assert bench_ready.phase_times(onnx_log, started) == {"app": 1.0}


# --- check_precision ---------------------------------------------------------------------------------------


def test_precision_check_measures_snr_and_durations_over_the_joined_chunks() -> None:
    from api.engine.base import ChunkAudio

    rng = np.random.default_rng(0)
    first, second = rng.standard_normal(24_000), rng.standard_normal(12_000)
    assert check_precision.snr_db(first, first * 0.9) == pytest.approx(20.0)
    reference = [ChunkAudio(first, np.array([2, 3])), ChunkAudio(second, np.array([4]))]
    candidate = [ChunkAudio(first * 0.9, np.array([2, 3])), ChunkAudio(second * 0.9, np.array([4]))]
    compared = check_precision.compare(reference, candidate)
    assert (compared["chunks"], compared["seconds"], compared["same_durations"]) == (2, 1.5, True)
    assert compared["snr_db"] == pytest.approx(20.0)
    moved = [candidate[0], ChunkAudio(second, np.array([5]))]
    assert check_precision.compare(reference, moved)["same_durations"] is False


def test_the_book_benchmarks_text_and_ratios() -> None:
    text = common.book_text(5000)
    assert 5000 <= len(text) < 5000 + max(map(len, common.PARAGRAPHS)) + 2
    assert text.split("\n\n")[0] == common.PARAGRAPHS[0]
    level = {"ok": 1, "failed": 0}
    result = {
        "alone": {
            "1": {**level, "ttfb_p50_s": 0.5, "audio_s_per_s": 3.0},
            "4": {**level, "ttfb_p50_s": 2.0, "audio_s_per_s": 5.0},
        },
        "beside_job": {
            "1": {**level, "ttfb_p50_s": 0.55, "audio_s_per_s": 2.0},
            "4": {**level, "ttfb_p50_s": None, "audio_s_per_s": 0.0},
        },
        "job_alone": {"audio_s_per_s": 4.5},
    }
    ratios = bench_books.ratios(result)
    assert ratios["ttfb_p50_with_job_over_without_1"] == pytest.approx(1.1)
    assert ratios["ttfb_p50_with_job_over_without_4"] is None
    assert ratios["job_alone_over_speech_throughput"] == pytest.approx(0.9)


# --- the one tool: its subcommands, flags and report -------------------------------------------------------

OLD_FLAGS = {
    "--weights-dir",
    "--concurrency",
    "--engines",
    "--formats",
    "--server-formats",
    "--rounds",
    "--repeats",
}


def benchmark_flags(name: str) -> set[str]:
    parser = bench.build_parser(name)
    (subcommands,) = (action for action in parser._actions if action.choices and name in action.choices)
    return {flag for action in subcommands.choices[name]._actions for flag in action.option_strings}


@pytest.mark.parametrize("name", list(bench.BENCHMARKS))
def test_every_benchmark_speaks_one_flag_vocabulary(name: str) -> None:
    flags = benchmark_flags(name)
    assert {"--out", "--label"} <= flags
    assert not flags & OLD_FLAGS
    assert "--weights" in flags or name == "load"


def test_cpuinfo_family_and_model_number() -> None:
    info = common.parse_cpuinfo("cpu family\t: 6\nmodel\t\t: 207\nmodel name\t: Intel Xeon\nflags : avx2\n")
    assert (info["cpu_family"], info["cpu_model_number"], info["cpu_model"]) == (6, 207, "Intel Xeon")
    assert common.parse_cpuinfo("")["cpu_family"] is None


def test_every_report_has_the_same_keys_and_one_timestamp(tmp_path: Path) -> None:
    out = tmp_path / "ttfb.json"
    args = bench.parse_args(["ttfb", "--runs", "2", "--out", str(out), "--label", "a label"])
    common.Report(args).write({"budgets": []})
    report = json.loads(out.read_text())
    assert list(report) == ["benchmark", "timestamp", "command", "label", "args", "machine", "results"]
    assert report["benchmark"] == "ttfb"
    assert datetime.fromisoformat(report["timestamp"]).utcoffset() == timedelta(0)
    assert report["command"] == f"python -m scripts.bench ttfb --runs 2 --out {out} --label 'a label'"
    assert report["args"]["runs"] == 2
    assert report["args"]["out"] == str(out)
    assert not {"run", "benchmark", "command_line"} & set(report["args"])
    machine = report["machine"]
    assert {"cpu_model", "cpu_family", "cpu_model_number", "flags", "logical_cores", "memory_gib"} <= set(
        machine
    )
    assert {"torch", "python", "load_average", "load_average_end"} <= set(machine)
    assert report["results"] == {"budgets": []}


def test_a_report_without_out_goes_to_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    common.Report(bench.parse_args(["load"])).write({"levels": []})
    assert json.loads(capsys.readouterr().out)["results"] == {"levels": []}


def test_malformed_server_settings_are_refused_before_anything_starts() -> None:
    assert bench.parse_args(["ready", "--server-env", "A=1", "B=2", "--server-env", "C=3"]).settings == {
        "A": "1",
        "B": "2",
        "C": "3",
    }
    with pytest.raises(SystemExit):
        bench.parse_args(["idle-unload", "--server-env", "NOEQUALS"])


def test_nothing_edits_sys_path() -> None:
    root = Path(__file__).resolve().parents[2]
    edits = [
        str(path.relative_to(root))
        for folder in ("scripts", "tests")
        for path in (root / folder).rglob("*.py")
        if "sys.path." in path.read_text(encoding="utf-8") and path != Path(__file__).resolve()
    ]
    assert edits == []
