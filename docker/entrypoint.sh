#!/bin/sh
# Container entrypoint. When the command is the server (`python -m api ...`), KOKORO_WORKERS and
# KOKORO_LIMIT_CONCURRENCY become its --workers and --limit-concurrency flags; they go right after
# `api`, so flags given on the command line come later and win. Any other command runs unchanged.
set -eu

# The CPUs this container may use: its affinity (cpuset), narrowed by a cgroup v2 CPU quota (--cpus).
usable_cpus() {
    cpus=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)  # nproc itself obeys OMP_NUM_THREADS
    if [ -r /sys/fs/cgroup/cpu.max ]; then
        read -r quota period < /sys/fs/cgroup/cpu.max
        if [ "$quota" != max ]; then
            limit=$(((quota + period - 1) / period))
            if [ "$limit" -lt "$cpus" ]; then cpus=$limit; fi
        fi
    fi
    echo "$cpus"
}

# More engine threads than CPUs make synthesis slower, not faster (ONNX Runtime on 2 cores: 4 threads
# 1.7-2.1x and 8 threads 3.0-4.6x slower than 2; docs/performance.md), so the image's default of 4
# threads is lowered to what the container may use.
if [ -n "${OMP_NUM_THREADS:-}" ]; then
    cpus=$(usable_cpus)
    if [ "$OMP_NUM_THREADS" -gt "$cpus" ]; then
        echo "entrypoint: OMP_NUM_THREADS=$OMP_NUM_THREADS but $cpus CPUs are usable: using $cpus" >&2
        OMP_NUM_THREADS=$cpus
        export OMP_NUM_THREADS
    fi
fi

if [ "$#" -ge 3 ] && [ "$1" = python ] && [ "$2" = -m ] && [ "$3" = api ]; then
    shift 3
    if [ -n "${KOKORO_LIMIT_CONCURRENCY:-}" ]; then
        set -- --limit-concurrency "$KOKORO_LIMIT_CONCURRENCY" "$@"
    fi
    if [ -n "${KOKORO_WORKERS:-}" ]; then
        set -- --workers "$KOKORO_WORKERS" "$@"
    fi
    set -- python -m api "$@"
fi
exec "$@"
