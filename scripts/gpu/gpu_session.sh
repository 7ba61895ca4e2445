#!/usr/bin/env bash
# Runs the GPU checks and benchmarks on a lent GPU machine (an H100 or H200 with CUDA torch installed and no
# registry access), from a copy of this repository. What the image lacks travels as .gpu/site.tar.xz: the
# project's pure-Python and binary dependencies for that machine's Python (3.12), unpacked once per machine
# into /tmp/site. Weights are random (scripts/tools/random_weights.py: the real model's shapes, so its compute).
# docs/journal/gpu.md, entry 12, has the figures and how the tarball is made.
#
#   bash scripts/gpu/gpu_session.sh info check tests engine     # figures and logs under $OUT
#   bash scripts/gpu/gpu_session.sh server
#   bash scripts/gpu/gpu_session.sh ready                        # time to /ready, just in time and ahead of time
#   bash scripts/gpu/gpu_session.sh layouts graphs               # issue 59: the layouts, then graphs on and off
#   bash scripts/gpu/gpu_session.sh unload                       # issue 60: GPU memory back at idle unload
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
SITE=/tmp/site
if [ ! -f "$SITE/.unpacked" ]; then
    mkdir -p "$SITE" && tar -xJf .gpu/site.tar.xz -C "$SITE" && touch "$SITE/.unpacked" || exit 1
fi
# The en_core_web_sm alias (vendor/) as an installed distribution: spaCy checks its metadata by name, and
# misaki downloads the model when that check fails.
if [ ! -f "$SITE/en_core_web_sm-3.8.0.dist-info/METADATA" ]; then
    cp -r vendor/en_core_web_sm/en_core_web_sm "$SITE/" && mkdir -p "$SITE/en_core_web_sm-3.8.0.dist-info"
    printf 'Metadata-Version: 2.1\nName: en_core_web_sm\nVersion: 3.8.0\n' \
        >"$SITE/en_core_web_sm-3.8.0.dist-info/METADATA"
fi
export PYTHONPATH="$SITE:$PWD" HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
PYTHON=${PYTHON:-python3}
WEIGHTS=/tmp/random-weights
[ -f "$WEIGHTS/kokoro-v1_0.pth" ] || "$PYTHON" -m scripts.tools.random_weights "$WEIGHTS" >/dev/null || exit 1
ENGINE_ARGS=${ENGINE_ARGS:---batch-sizes 1 2 4 8 16 32 64 --mixes short long mixed --dtypes fp32 bf16 --runs 2}
SERVER_ARGS=${SERVER_ARGS:---workers 1 4 --clients 1 8 32 64 128 256 --duration 10}

for step in "$@"; do
    echo "=== $step $(date -u +%T)"
    case "$step" in
    info)
        nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
        nproc
        lscpu | grep -E "Model name|^CPU\(s\)"
        "$PYTHON" -c "import torch; print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name())"
        ;;
    tests)
        timeout 300 "$PYTHON" -m pytest -p no:cacheprovider -q -s --device cuda \
            tests/integration/test_batched.py -k "${TESTS_K:-not real_weights and not scheduler}" 2>&1 | tee "$OUT/tests.log"
        ;;
    engine)
        # shellcheck disable=SC2086
        timeout 420 "$PYTHON" -m scripts.bench batching --random-weights --device cuda $ENGINE_ARGS \
            --out "$OUT/batching-gpu.json" 2>&1 | tee "$OUT/engine.log"
        ;;
    server)
        # shellcheck disable=SC2086
        timeout "${SERVER_TIMEOUT:-420}" "$PYTHON" -m scripts.bench gpu-server --weights "$WEIGHTS" $SERVER_ARGS \
            --out "$OUT/gpu-server.json" 2>&1 | tee "$OUT/server.log"
        # The servers' own logs (the last layout's first), for when a level failed.
        for log in $(ls -t /tmp/kokoro-gpu-server-*/*/*.log 2>/dev/null | head -4); do
            echo "--- $log"
            grep -v -E "Warning|warn|WeightNorm" "$log" | tail -15
        done
        ;;
    layouts)
        # Issue 45, part B: today's default layout (4 workers, each its own engine, one call at a time) and
        # the shared pipelined engine, pcm and mp3 at 8/32/128 clients; then the bare engine at the batch
        # sizes a server forms, from one thread and from two lanes.
        # shellcheck disable=SC2086
        timeout "${SERVER_TIMEOUT:-420}" "$PYTHON" -m scripts.bench gpu-server --weights "$WEIGHTS" \
            --clients ${CONCURRENCY:-8 32 128} --duration "${DURATION:-6}" --max-warmup 8 --format ${FORMATS:-pcm mp3} \
            ${LAYOUTS:---variant today WORKERS=4 KOKORO_TORCH_LANES=1 --variant shared WORKERS=8 KOKORO_SHARED_ENGINE=true} \
            --out "$OUT/layouts.json" 2>&1 | tee "$OUT/layouts.log"
        for log in $(ls -t /tmp/kokoro-gpu-server-*/*/*.log 2>/dev/null | head -2); do
            echo "--- $log"
            grep -v -E "Warning|warn|WeightNorm" "$log" | tail -8
        done
        [ "${ENGINE_TIMEOUT:-150}" = 0 ] || timeout "${ENGINE_TIMEOUT:-150}" "$PYTHON" -m scripts.bench gpu-engine --weights "$WEIGHTS" \
            --batch-sizes ${ENGINE_SIZES:-8 16 32} --calls 6 --out "$OUT/engine.json" 2>&1 | tee "$OUT/engine.log"
        ;;
    ready)
        # Issue 46: one worker's server from process start to /ready 200 on the GPU, a cold start then a warm
        # one sharing a compile cache, with the fused kernels compiled just in time (the GPU's default) and
        # ahead of time (KOKORO_COMPILE_AHEAD_OF_TIME=true).
        for aot in false true; do
            timeout "${READY_TIMEOUT:-300}" "$PYTHON" -m scripts.bench ready --weights "$WEIGHTS" \
                --engine torch --starts 2 --server-env KOKORO_DEVICE=cuda --server-env "KOKORO_COMPILE_AHEAD_OF_TIME=$aot" \
                --out "$OUT/ready-aot-$aot.json" 2>&1 | tee "$OUT/ready-aot-$aot.log"
        done
        ;;
    graphs)
        # Issue 59, part B, after `layouts` (whose servers run with graphs, the default): the bucketed forward's
        # CUDA graphs against the library (the suite's tests, on the GPU), then the bare engine with graphs and
        # without at the batch sizes a server forms; the logs say the capture's time and memory. About 5 min.
        timeout 180 "$PYTHON" -m pytest -p no:cacheprovider -q -s --device cuda tests/integration/test_graphs.py \
            -k "padded_buckets or replay_runs or two_lanes or fixed_shape" 2>&1 | tail -20 | tee "$OUT/graphs-tests.log"
        for graphs in true false; do
            # shellcheck disable=SC2086
            timeout 150 "$PYTHON" -m scripts.bench gpu-engine --weights "$WEIGHTS" --batch-sizes ${ENGINE_SIZES:-8 32} \
                --calls 4 --cuda-graphs "$graphs" --out "$OUT/engine-graphs-$graphs.json" 2>&1 \
                | grep -v -E "Warning|warn" | tail -8 | tee "$OUT/engine-graphs-$graphs.log"
        done
        ;;
    unload)
        # Issue 60: idle unload on the GPU: GPU memory in use loaded, unloaded, reloaded; the reload's time.
        timeout 300 "$PYTHON" -m scripts.bench idle-unload --weights "$WEIGHTS" --engine torch \
            --server-env KOKORO_DEVICE=cuda --cycles 2 --out "$OUT/idle-unload.json" 2>&1 | tail -12 | tee "$OUT/unload.log"
        ;;
    profile)
        # shellcheck disable=SC2086
        timeout 300 "$PYTHON" -m scripts.tools.profile_gpu ${PROFILE_ARGS:-} \
            --out "$OUT/profile.json" 2>&1 | tee "$OUT/profile.log"
        ;;
    check)
        timeout 240 "$PYTHON" -m scripts.tools.gpu_engine_check --weights-dir "$WEIGHTS" 2>&1 | tee "$OUT/check.log"
        ;;
    g2p)
        "$PYTHON" -c "from api.text.phonemize import Phonemizer; print(Phonemizer().phonemize('Hello there.', 'a'))"
        ;;
    *)
        echo "unknown step $step" >&2
        ;;
    esac
done
echo "=== done $(date -u +%T)"
