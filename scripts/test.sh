#!/usr/bin/env bash
# Installs what the tests need (idempotent) and runs lint + the whole test suite, offline.
# Extra arguments go to pytest. Fails when a test fails or when no test ran.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh test
export HF_HUB_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1

.venv/bin/ruff check api tests scripts
.venv/bin/mypy
set +e
.venv/bin/python -m pytest "$@"
status=$?
set -e
if [ "$status" -eq 5 ]; then
    echo "test.sh: pytest collected no tests: failing" >&2
    exit 1
fi
exit "$status"
