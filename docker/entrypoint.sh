#!/bin/sh
# Container entrypoint. When the command is the server (`python -m api ...`), KOKORO_WORKERS and
# KOKORO_LIMIT_CONCURRENCY become its --workers and --limit-concurrency flags; they go right after
# `api`, so flags given on the command line come later and win. Any other command runs unchanged.
set -eu

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
