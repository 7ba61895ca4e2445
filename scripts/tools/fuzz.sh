#!/usr/bin/env bash
# Fuzz a running server from its own OpenAPI document, longer than CI's tests/integration/test_fuzz.py:
# every schemathesis check except positive_data_acceptance (see that test for why), N examples per
# operation. Usage: scripts/tools/fuzz.sh [URL] [EXAMPLES] [-- extra schemathesis options, e.g. -H "Authorization: Bearer KEY"]
set -euo pipefail
cd "$(dirname "$0")/../.."
url="${1:-http://127.0.0.1:8880}"
examples="${2:-1000}"
shift $(( $# > 2 ? 2 : $# ))
[ "${1:-}" != "--" ] || shift
exec .venv/bin/schemathesis run "$url/openapi.json" --url "$url" --checks all \
    --exclude-checks positive_data_acceptance --max-examples "$examples" --report junit \
    --report-dir bench-results/fuzz "$@"
