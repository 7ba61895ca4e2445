#!/usr/bin/env bash
# Fuzz a running server from its own OpenAPI document, longer than CI's tests/integration/test_fuzz.py:
# scripts/tools/fuzz_api.py's phases and checks (every check except positive_data_acceptance), N examples
# per operation, the JSON report on stdout. Usage: scripts/tools/fuzz.sh [URL] [EXAMPLES] [-- extra
# schemathesis options, e.g. -H "Authorization: Bearer KEY"]. Without a server: python -m scripts.tools.fuzz_api
set -euo pipefail
cd "$(dirname "$0")/../.."
url="${1:-http://127.0.0.1:8880}"
examples="${2:-1000}"
shift $(( $# > 2 ? 2 : $# ))
[ "${1:-}" != "--" ] || shift
exec .venv/bin/python -m scripts.tools.fuzz_api --url "$url" --max-examples "$examples" --min-cases 0 -- "$@"
