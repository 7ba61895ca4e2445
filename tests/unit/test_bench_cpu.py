"""The pure parts of `python -m scripts.bench cpu` (scripts/bench/cpu.py): text rotation, the RSS plateau
blocks, the engine read from the server's log, the library and server records, the ratios, the table and the
arguments. No model, no server."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import pytest

from scripts.bench import __main__ as bench
from scripts.bench import common
from scripts.bench import cpu as bench_cpu
from scripts.bench import load as loadtest
from scripts.bench.measure import library_summary


def parse_args(argv: list[str]) -> argparse.Namespace:
    return bench.parse_args(["cpu", *argv])


# --- texts -----------------------------------------------------------------------------------------------


def test_builtin_texts_are_paragraphs_of_one_to_four_sentences() -> None:
    assert 15 <= len(common.PARAGRAPHS) <= 25
    assert len(set(common.PARAGRAPHS)) == len(common.PARAGRAPHS)
    for text in common.PARAGRAPHS:
        sentences = sum(text.count(end) for end in ".?!")
        assert 1 <= sentences <= 4, text
        assert text.endswith((".", "?", "!"))
    lengths = sorted(len(text) for text in common.PARAGRAPHS)
    assert lengths[-1] > 3 * lengths[0]  # mixed lengths


def test_a_text_file_replaces_the_builtin_texts(tmp_path: Path) -> None:
    assert parse_args([]).texts == common.PARAGRAPHS
    path = tmp_path / "texts.txt"
    path.write_text("One long\nparagraph.\n\n\nAnother one.\n", encoding="utf-8")
    assert parse_args(["--text-file", str(path)]).texts == (
        "One long paragraph.",
        "Another one.",
    )


@pytest.mark.parametrize("content", [None, "\n\n  \n"])
def test_a_missing_or_empty_text_file_is_refused_before_anything_starts(
    tmp_path: Path, content: str | None, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "texts.txt"
    if content is not None:
        path.write_text(content, encoding="utf-8")
    with pytest.raises(SystemExit) as exc:
        parse_args(["--text-file", str(path)])
    assert exc.value.code == 2
    assert "texts.txt" in capsys.readouterr().err


def test_the_run_on_texts_are_long_single_sentences() -> None:
    texts = loadtest.read_texts(Path(__file__).parents[2] / "scripts" / "bench" / "texts" / "run-on.txt")
    assert len(texts) == 7
    assert all(len(text) > 1400 and text.count(".") == 1 for text in texts)


def test_texts_rotate_like_the_load_test() -> None:
    assert bench_cpu.rotated(["a", "b", "c"], 7) == ["a", "b", "c", "a", "b", "c", "a"]
    assert bench_cpu.rotated(["a", "b", "c"], 2) == ["a", "b"]


# --- RSS plateau blocks ----------------------------------------------------------------------------------


def sample(index: int, start_s: float, latency_s: float, status: int = 200, audio_s: float = 2.0) -> Any:
    ok = status == 200
    return loadtest.Sample(
        index=index, format="pcm", start_s=start_s, status=status, error=None if ok else f"http_{status}",
        size_bytes=100, headers_s=0.1, ttfb_s=0.2, latency_s=latency_s, audio_s=audio_s if ok else None,
    )  # fmt: skip


def test_completion_times_are_sorted_on_the_phase_clock() -> None:
    samples = [sample(0, 0.0, 5.0), sample(1, 0.0, 2.0), sample(2, 2.0, 1.0)]
    assert bench_cpu.completion_times(samples, started=100.0) == [102.0, 103.0, 105.0]


def test_plateau_blocks_take_the_highest_reading_of_each_block() -> None:
    completions = [101.0, 102.0, 103.0, 104.0, 105.0]
    rss = [(100.5, 500.0), (101.5, 700.0), (102.5, 650.0), (103.5, 900.0), (104.5, 800.0), (106.0, 999.0)]
    blocks = bench_cpu.plateau_blocks(completions, rss, started=100.0, block=2)
    assert blocks == [
        {"requests": 2, "end_s": 2.0, "rss_max_mib": 700.0},  # 100 .. 102
        {"requests": 2, "end_s": 4.0, "rss_max_mib": 900.0},  # 102 .. 104
        {"requests": 1, "end_s": 5.0, "rss_max_mib": 800.0},  # 104 .. 105, the last, short block
    ]


def test_a_block_without_readings_gets_the_last_one_before_its_end() -> None:
    completions = [101.0, 101.1, 101.2]
    rss = [(100.5, 600.0), (101.05, 650.0)]
    blocks = bench_cpu.plateau_blocks(completions, rss, started=100.0, block=1)
    assert [b["rss_max_mib"] for b in blocks] == [600.0, 650.0, 650.0]
    assert bench_cpu.plateau_blocks(completions, [], started=100.0, block=1)[0]["rss_max_mib"] is None


def test_no_requests_no_blocks() -> None:
    assert bench_cpu.plateau_blocks([], [(1.0, 500.0)], started=0.0) == []
    assert bench_cpu.BLOCK_REQUESTS == 20


def test_the_sampler_reads_this_process() -> None:
    with bench_cpu.RssSampler(os.getpid(), interval=0.01) as sampler:
        pass
    assert len(sampler.readings) >= 2  # at least the first reading and the one at the end
    times = [at for at, _ in sampler.readings]
    assert times == sorted(times)
    assert all(rss > 0 for _, rss in sampler.readings)


def test_the_sampler_of_a_gone_process_reads_nothing() -> None:
    with bench_cpu.RssSampler(2**22 + 12345, interval=0.01) as sampler:
        pass
    assert sampler.readings == []


# --- the engine the server chose -------------------------------------------------------------------------

LOG = """INFO:     Started server process [123]
2026-01-01 12:00:00 INFO api.server.app: engine: onnx (CPU (avx2 fma): the int8 ONNX Runtime engine, ...)
2026-01-01 12:00:09 INFO api.engine.scheduling.scheduler: engine onnx ready in 9.1 s; batching: ...
"""


def test_the_engine_comes_from_the_servers_choice_line_first() -> None:
    assert bench_cpu.chosen_engine(LOG, {"KOKORO_ENGINE": "torch"}) == ("onnx", "log engine:")


def test_then_from_its_ready_line_then_from_the_environment() -> None:
    ready_only = "INFO api.engine.scheduling.scheduler: engine torch ready in 4.0 s; batching: ...\n"
    assert bench_cpu.chosen_engine(ready_only, {}) == ("torch", "log ready")
    assert bench_cpu.chosen_engine("", {"KOKORO_ENGINE": "onnx"}) == ("onnx", "KOKORO_ENGINE")
    assert bench_cpu.chosen_engine("", {"KOKORO_ENGINE": "auto"}) == (None, None)
    assert bench_cpu.chosen_engine("engine: something else\n", {}) == (None, None)


# --- records, ratios, table ------------------------------------------------------------------------------


def test_library_summary_totals_its_texts() -> None:
    texts = [
        {"chars": 100, "audio_s": 6.0, "wall_s": 2.0},
        {"chars": 50, "audio_s": 3.0, "wall_s": 1.0},
    ]
    summary = library_summary(texts)
    assert summary == {
        "texts_measured": 2,
        "audio_s": 9.0,
        "wall_s": 3.0,
        "audio_s_per_s": 3.0,
        "chars_per_s": 50.0,
    }
    assert library_summary([])["audio_s_per_s"] is None


def server_record() -> dict[str, Any]:
    texts = ("x" * 10, "y" * 30)
    samples = [sample(0, 0.0, 1.0), sample(1, 0.0, 2.0), sample(2, 1.0, 2.0, status=503), sample(3, 2.0, 3.0)]
    level = loadtest.summarize(2, samples, wall_s=5.0)
    record: dict[str, Any] = bench_cpu.server_load_record(level, texts)
    return record


def test_server_record_counts_non_200s_and_the_chars_of_the_successes() -> None:
    record = server_record()
    assert (record["requests"], record["ok"], record["non_200"]) == (4, 3, 1)
    assert record["status_counts"] == {"200": 3, "503": 1}
    assert record["audio_s_per_s"] == pytest.approx(6.0 / 5.0)
    assert record["chars_per_s"] == pytest.approx((10 + 30 + 30) / 5.0)  # requests 0, 1 and 3
    assert record["latency_p50_s"] == pytest.approx(2.0)
    assert record["ttfb_p95_s"] == pytest.approx(0.2)


def test_transport_errors_count_as_non_200() -> None:
    broken = loadtest.Sample(
        index=0, format="pcm", start_s=0.0, status=None, error="timeout", size_bytes=0, headers_s=None,
        ttfb_s=None, latency_s=9.0,
    )  # fmt: skip
    record = bench_cpu.server_load_record(loadtest.summarize(1, [broken], wall_s=9.0), ("a",))
    assert record["non_200"] == 1
    assert record["latency_p50_s"] is None
    assert record["chars_per_s"] == 0.0


def test_ratio_is_server_over_library() -> None:
    library = {"audio_s_per_s": 2.0, "chars_per_s": 40.0}
    server = {"audio_s_per_s": 3.0, "chars_per_s": 50.0}
    assert bench_cpu.comparison(library, server) == {
        "ratio_vs_library": 1.5,
        "chars_ratio_vs_library": 1.25,
    }
    assert bench_cpu.comparison(None, server) == {"ratio_vs_library": None, "chars_ratio_vs_library": None}
    assert bench_cpu.comparison({"audio_s_per_s": None, "chars_per_s": 0.0}, server) == {
        "ratio_vs_library": None,
        "chars_ratio_vs_library": None,
    }


def test_a_busy_machine_is_named() -> None:
    assert bench_cpu.busy_warning(0.3, 2) is None
    assert bench_cpu.busy_warning(1.0, 8) is None
    warning = bench_cpu.busy_warning(5.79, 2)
    assert warning is not None
    assert "5.79 on 2 cores" in warning


def test_kernel_env_names_every_variable_set_or_not() -> None:
    seen = bench_cpu.kernel_env({"MKL_CBWR": "COMPATIBLE", "PATH": "/bin"})
    assert seen == {
        "ATEN_CPU_CAPABILITY": None,
        "ONEDNN_MAX_CPU_ISA": None,
        "MKL_ENABLE_INSTRUCTIONS": None,
        "MKL_CBWR": "COMPATIBLE",
        "OMP_NUM_THREADS": None,
    }


def full_report(library_runs: list[dict[str, Any]]) -> dict[str, Any]:
    server = {
        "engine": "onnx",
        "clients": 4,
        **server_record(),
        "rss_idle_mib": 400.0,
        "rss_plateau": [{"requests": 20, "end_s": 9.0, "rss_max_mib": 610.0}, {"rss_max_mib": None}],
        "hwm_mib": 650.0,
    }
    library = bench_cpu.faster_library(library_runs)
    return {
        "library_runs": library_runs,
        "library": library,
        "server": server,
        **bench_cpu.comparison(library, server),
    }


def test_table_shows_both_sides_and_the_ratio() -> None:
    library = {"threads": 2, "peak_rss_mib": 900.0, "audio_s_per_s": 0.6, "chars_per_s": 7.0}
    text = bench_cpu.table(full_report([library]))
    lines = text.splitlines()
    assert len(lines) == 4
    assert "library (torch fp32, 2 threads)" in lines[1]
    assert "-/-/900" in lines[1]
    assert "server (onnx, 4 clients)" in lines[2]
    assert "400/610/650" in lines[2]
    assert lines[2].split()[-1] == "1"  # the 503
    assert lines[3].startswith("server / library: 2.000x audio-s/s")


def test_the_ratio_is_against_the_faster_library_run() -> None:
    before = {"when": "before", "threads": 2, "peak_rss_mib": 900.0, "audio_s_per_s": 0.6, "chars_per_s": 7.0}
    after = {"when": "after", "threads": 2, "peak_rss_mib": 910.0, "audio_s_per_s": 0.8, "chars_per_s": 9.0}
    report = full_report([before, after])
    assert report["library"] is after
    assert report["ratio_vs_library"] == 1.5  # the server's 1.2 over the faster run's 0.8
    lines = bench_cpu.table(report).splitlines()
    assert len(lines) == 5
    assert "library (torch fp32, 2 threads, before)" in lines[1]
    assert "library (torch fp32, 2 threads, after)" in lines[2]
    assert lines[4] == (
        "server / library: 1.500x audio-s/s, 1.556x chars/s (against the faster library run, after)"
    )


def test_the_faster_run_skips_runs_without_a_figure() -> None:
    runs = [{"audio_s_per_s": None}, {"audio_s_per_s": 0.5}]
    assert bench_cpu.faster_library(runs) is runs[1]
    assert bench_cpu.faster_library([{"audio_s_per_s": None}]) is None
    assert bench_cpu.faster_library([]) is None


def test_table_without_the_library() -> None:
    lines = bench_cpu.table(full_report([])).splitlines()
    assert "skipped" in lines[1]
    assert len(lines) == 3


# --- arguments and the server's environment --------------------------------------------------------------


def test_defaults() -> None:
    args = parse_args([])
    assert (args.clients, args.requests, args.warmup) == (4, 200, 4)
    assert args.out is None  # the report goes to stdout
    assert args.weights == common.DEFAULT_WEIGHTS
    assert args.engine is None
    assert args.library_texts is None
    assert args.library_threads == 2
    assert args.server_env == []
    assert not args.skip_library
    assert not args.library_once


def test_server_env_holds_the_weights_the_engine_and_the_extra_pairs() -> None:
    args = parse_args(
        ["--engine", "torch", "--server-env", "KOKORO_MAX_INFLIGHT=2", "--server-env", "KOKORO_ENGINE=onnx"]
    )
    env = bench_cpu.server_env(args, {"PATH": "/bin", "KOKORO_FETCH_WEIGHTS": "true"})
    assert env["PATH"] == "/bin"
    assert env["KOKORO_WEIGHTS_DIR"] == str(common.DEFAULT_WEIGHTS)
    assert env["KOKORO_FETCH_WEIGHTS"] == "false"
    assert env["HF_HUB_OFFLINE"] == "1"
    assert env["KOKORO_MAX_INFLIGHT"] == "2"
    assert env["KOKORO_ENGINE"] == "onnx"  # --server-env comes last


def test_without_engine_the_server_keeps_its_default() -> None:
    env = bench_cpu.server_env(parse_args([]), {})
    assert "KOKORO_ENGINE" not in env


@pytest.mark.parametrize(
    "argv",
    [["--server-env", "NOEQUALS"], ["--clients", "0"], ["--engine", "tensorflow"], ["--warmup", "-1"]],
)
def test_bad_arguments_stop_before_anything_starts(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(argv)


def test_report_is_json_and_keeps_the_arguments(tmp_path: Path) -> None:
    out = tmp_path / "cpu.json"
    args = parse_args(["--out", str(out), "--skip-library"])
    report = common.Report(args, leave_out=bench_cpu.LEAVE_OUT)
    report.write(bench_cpu.results(args.texts, [], full_report([])["server"]))
    document = json.loads(out.read_text())
    assert document["benchmark"] == "cpu"
    assert document["args"]["out"] == str(out)
    assert "texts" not in document["args"]
    results = document["results"]
    assert results["ratio_vs_library"] is None
    assert results["library_runs"] == []
    assert results["library"] is None
    assert set(bench_cpu.KERNEL_ENV) == set(results["kernel_env"])
    assert "flags" in document["machine"]
    assert results["texts"] == list(common.PARAGRAPHS)


def test_the_allocator_is_read_from_the_servers_log() -> None:
    assert common.logged_allocator("x INFO __main__: allocator: tcmalloc (reuses ...)\n") == "tcmalloc"
    system = "x INFO __main__: allocator: the C library's malloc (KOKORO_ALLOCATOR=system)\n"
    assert common.logged_allocator(system) == "malloc"
    assert common.logged_allocator("engine: torch\n") is None
