#!/usr/bin/env bash
# Installs what the tests need (idempotent) and runs lint + the whole test suite, offline.
# Extra arguments go to pytest. Fails when a test fails or when no test ran.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh test
# The load-balancer test runs Debian's nginx on loopback, the page tests Debian's headless Chromium and its
# driver; install them where we may (CI runs as root). No browser is downloaded from anywhere else.
missing=()
command -v nginx >/dev/null 2>&1 || missing+=(nginx-light)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v chromedriver >/dev/null 2>&1 || missing+=(chromium-driver)
if [ "${#missing[@]}" -gt 0 ] && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    echo "test.sh: installing Debian's ${missing[*]} for the load-balancer and page tests" >&2
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
export HF_HUB_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1

.venv/bin/ruff check api tests scripts docker modal_app.py
.venv/bin/mypy
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

# The 30 slowest tests are listed at the end, to see where CI's time goes.
run_pytest --durations=30 "$@"
# A whole run also repeats the numerics tests at a lower CPU dispatch level (scalar ATen kernels, oneDNN
# and MKL on their SSE paths), so a result that holds on one machine's kernels only fails on any machine.
# Left out of the second run: the simulated layout-dependent FFT (the same on any kernels), the scheduler's
# test (it checks routing, not numerics), the bf16 decoder's (bf16 on scalar kernels took over 5 minutes;
# its bound is about rounding, not kernel paths), and four variants of the batch tests whose kernels the
# kept variants run too (the library's batch of real weights: the same ATen kernels as its single items;
# padded random weights; the eager padded and compiled per-item prepared kernels: the compiled padded and
# eager per-item ones stay). The second run took 3.5-5 minutes on 2 cores with the compile cache filled, 9.5
# with it empty as on a fresh machine; the whole run 40 minutes there (docs/testing.md).
# With arguments (a chosen subset), only that subset runs.
if [ "$#" -eq 0 ]; then
    echo "test.sh: numerics tests again at the lowest dispatch level" >&2
    left_out=(layout_dependent_fft scheduler_batches bf16_decoder "mixed_batch_equals_single_items[library]"
        "mixed_batch_equals_single_items[padded-vocoder]" "item_by_item[eager-padded-vocoder]"
        "item_by_item[compiled-vocoder-per-item]")
    # Its 15 slowest tests are listed too: this stage took 9.5 minutes on a fresh compile cache.
    ATEN_CPU_CAPABILITY=default ONEDNN_MAX_CPU_ISA=SSE41 MKL_CBWR=COMPATIBLE run_pytest -m numerics \
        --durations=15 -k "$(printf 'not %s and ' "${left_out[@]}" | sed 's/ and $//')"
fi
