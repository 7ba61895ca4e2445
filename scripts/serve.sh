#!/usr/bin/env bash
# Installs what the server needs (idempotent) and starts it; arguments go to `python -m api`
# (e.g. --port 8880 --workers 2). Weights are fetched on first start (see docs/weights.md).
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh runtime
exec .venv/bin/python -m api "$@"
