#!/usr/bin/env bash
# Creates (or updates) the virtual environment at .venv. Idempotent: a second run with unchanged
# inputs only checks a stamp. Usage: scripts/setup.sh [runtime|test]
set -euo pipefail
cd "$(dirname "$0")/.."

extras="${1:-runtime}"
python="${PYTHON:-python3}"
# The CPU build of torch 2.13.0 installs from local disk on the project machines; GPU images override this.
torch_spec="${TORCH_SPEC:-torch==2.13.0}"
# Optional: the index torch comes from (pip's --index-url for that one install), e.g.
# https://download.pytorch.org/whl/cpu in the CPU image, where PyPI's torch==2.13.0 is a CUDA build.
torch_index=()
[ -z "${TORCH_INDEX_URL:-}" ] || torch_index=(--index-url "$TORCH_INDEX_URL")

# tcmalloc: `python -m api` runs under it where it is installed (api/allocator.py; the torch engine on a CPU
# runs faster in less memory). Debian's package, installed where we may (root with apt-get); elsewhere the
# server uses the C library's malloc and says so in its log.
if ! /sbin/ldconfig -p 2>/dev/null | grep 'libtcmalloc_minimal\.so' >/dev/null; then
    if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
        echo "setup: installing Debian's libtcmalloc-minimal4 (the server's allocator)" >&2
        { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libtcmalloc-minimal4; } \
            >/dev/null || echo "setup: libtcmalloc-minimal4 did not install: the server uses malloc" >&2
    else
        echo "setup: no tcmalloc here (apt-get install libtcmalloc-minimal4 makes the server faster)" >&2
    fi
fi

[ -x .venv/bin/python ] || "$python" -m venv .venv
pip=(.venv/bin/python -m pip --disable-pip-version-check -q)

stamp=".venv/.setup-$extras"
# The inputs' hash through Python (macOS has no sha256sum).
want=$(cat pyproject.toml scripts/setup.sh vendor/en_core_web_sm/pyproject.toml \
    | "$python" -c 'import hashlib, sys; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest()[:16])')
want="$want $torch_spec${TORCH_INDEX_URL:+ $TORCH_INDEX_URL}"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    exit 0
fi

echo "setup: installing $torch_spec and the project ($extras) into .venv" >&2
"${pip[@]}" install --upgrade pip 2>&1 | grep -v "is ignored" >&2 || true
"${pip[@]}" install ${torch_index[@]+"${torch_index[@]}"} "$torch_spec" 2>&1 | grep -v "is ignored" >&2 || true
target="."
[ "$extras" = "test" ] && target=".[test]"
# The project and its dependencies through uv, which installs them in about a quarter of pip's time (27 s
# against 2 min 7 s on a 2-core Xeon, a new venv; docs/journal/test-suite.md, entry 33). uv keeps the torch
# installed above (any 2.13.0 build satisfies the project), takes pip's constraint file where one is set
# (the images' exact versions). It compiles the byte code at install, as pip does: left to the first import,
# it is never written where PYTHONDONTWRITEBYTECODE is set (these machines set it) or the files are
# read-only (an image's), and every process compiled its imports again: `import kokoro` took 11.7-12.5 s
# against 5.9-6.6 s compiled, on a 2-core Xeon (journal, entry 41). Where uv cannot install (no PyPI, only
# pip's own indexes), pip does it.
constraint=()
[ -z "${PIP_CONSTRAINT:-}" ] || constraint=(--constraint "$PIP_CONSTRAINT")
"${pip[@]}" install uv 2>&1 | grep -v "is ignored" >&2 || true
if ! .venv/bin/python -m uv pip install -q --compile-bytecode --python .venv/bin/python ${constraint[@]+"${constraint[@]}"} \
    -e "$target" ./vendor/en_core_web_sm; then
    echo "setup: uv could not install the project: pip installs it" >&2
    "${pip[@]}" install -e "$target" ./vendor/en_core_web_sm 2>&1 | grep -v "is ignored" >&2 || true
fi
# pip's output is filtered above, so verify the result explicitly.
.venv/bin/python -c "import torch, kokoro, misaki, av, fastapi, en_core_web_sm, api" \
    || { echo "setup: install failed" >&2; exit 1; }
[ "$extras" != "test" ] || .venv/bin/python -c "import pytest, openai, httpx" \
    || { echo "setup: test extras failed to install" >&2; exit 1; }
echo "$want" > "$stamp"
