#!/usr/bin/env bash
# Creates (or updates) the virtual environment at .venv. Idempotent: a second run with unchanged
# inputs only checks a stamp. Usage: scripts/setup.sh [runtime|test]
#
# The interpreter: $PYTHON, else the first of python3, python3.13, python3.12, python3.11, python3.10 and
# python3.14 on PATH that is Python 3.10 to 3.14 (docs/deploy.md, "Python versions"). An existing .venv keeps
# its own.
set -euo pipefail
cd "$(dirname "$0")/.."

extras="${1:-runtime}"
# The CPU build of torch 2.13.0 installs from local disk on the project machines; GPU images override this.
torch_spec="${TORCH_SPEC:-torch==2.13.0}"
say() { echo "setup: $*" >&2; }
# The index torch comes from (pip's --index-url for that one install). Unset: PyTorch's CPU index where it
# answers and the machine has no NVIDIA GPU (PyPI's torch==2.13.0 for Linux is a CUDA build with about 3 GB
# of nvidia-* wheels), else pip's own sources. Set, even empty, it wins (the images set it).
cpu_index=https://download.pytorch.org/whl/cpu
torch_note=""
if [ -z "${TORCH_INDEX_URL+set}" ] && [ "$(uname -s)" = Linux ] && ! command -v nvidia-smi >/dev/null 2>&1; then
    if command -v python3 >/dev/null 2>&1 && python3 -c "import sys, urllib.request
urllib.request.urlopen(sys.argv[1] + '/torch/', timeout=5)" "$cpu_index" >/dev/null 2>&1; then
        TORCH_INDEX_URL=$cpu_index
        torch_note="PyTorch's CPU index (no NVIDIA GPU here; TORCH_INDEX_URL= for pip's own sources)"
    else
        torch_note="pip's own sources: PyTorch's CPU index does not answer (PyPI's Linux build is CUDA's)"
    fi
fi
torch_index=()
[ -z "${TORCH_INDEX_URL:-}" ] || torch_index=(--index-url "$TORCH_INDEX_URL")

# --- the interpreter ---------------------------------------------------------------------------------------
supported() { "$1" -c 'import sys; sys.exit(not (3, 10) <= sys.version_info[:2] <= (3, 14))' 2>/dev/null; }
version_of() { "$1" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])' 2>/dev/null || echo "?"; }
if [ -x .venv/bin/python ]; then
    python=.venv/bin/python
elif [ -n "${PYTHON:-}" ]; then
    python="$PYTHON"
else
    python=""
    for candidate in python3 python3.13 python3.12 python3.11 python3.10 python3.14; do
        if command -v "$candidate" >/dev/null 2>&1 && supported "$candidate"; then
            python="$candidate"
            break
        fi
    done
    if [ -z "$python" ]; then
        found=$(command -v python3 >/dev/null 2>&1 && echo "python3 is Python $(version_of python3)" || echo "no python3")
        say "$found; this server runs on Python 3.10 to 3.14: install one (e.g. apt-get install python3.12-venv) or set PYTHON=/path/to/python3.1x"
        exit 1
    fi
fi
if ! supported "$python"; then
    say "$python is Python $(version_of "$python"); this server runs on Python 3.10 to 3.14: set PYTHON=/path/to/python3.1x (and remove .venv if it is the old one)"
    exit 1
fi
pyver=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')

# --- what the system needs ----------------------------------------------------------------------------------
# Debian's packages, installed where we may (root with apt-get), else named:
# - tcmalloc: `python -m api` runs under it where it is installed (api/engine/allocator.py; the torch engine on a CPU
#   runs faster in less memory); elsewhere the server uses the C library's malloc and says so in its log;
# - venv and the Python headers of a Debian python3 (a bare Debian has neither: the headers are what the
#   compiled CPU kernels build against), and g++ (the compiled kernels; mojimoji, Japanese text, which has no
#   wheel for Python 3.13 and later).
apt_wanted=()
/sbin/ldconfig -p 2>/dev/null | grep 'libtcmalloc_minimal\.so' >/dev/null || apt_wanted+=(libtcmalloc-minimal4)
command -v g++ >/dev/null 2>&1 || apt_wanted+=(g++)
[ -x .venv/bin/python ] || "$python" -c 'import ensurepip' >/dev/null 2>&1 || apt_wanted+=("python$pyver-venv")
"$python" -c 'import os, sysconfig; assert os.path.isfile(os.path.join(sysconfig.get_paths()["include"], "Python.h"))' \
    >/dev/null 2>&1 || apt_wanted+=("python$pyver-dev")
if [ "${#apt_wanted[@]}" -gt 0 ]; then
    if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
        say "installing Debian's ${apt_wanted[*]}"
        { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${apt_wanted[@]}"; } \
            >/dev/null || say "Debian's ${apt_wanted[*]} did not install"
    else
        say "missing here: ${apt_wanted[*]} (Debian's names; without tcmalloc the server is slower, without"
        say "g++ and the Python headers its CPU kernels run eagerly, without the venv module nothing installs)"
    fi
fi

if [ ! -x .venv/bin/python ]; then
    say "Python $(version_of "$python") ($(command -v "$python")): making .venv"
    "$python" -m venv .venv || { say "could not make .venv with $python (Debian: apt-get install python$pyver-venv)"; exit 1; }
fi
pip=(.venv/bin/python -m pip --disable-pip-version-check)

stamp=".venv/.setup-$extras"
# The inputs' hash through Python (macOS has no sha256sum).
want=$(cat pyproject.toml scripts/setup.sh vendor/en_core_web_sm/pyproject.toml \
    | .venv/bin/python -c 'import hashlib, sys; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest()[:16])')
want="$want $torch_spec${TORCH_INDEX_URL:+ $TORCH_INDEX_URL} py$pyver"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    exit 0
fi

# --- the packages ------------------------------------------------------------------------------------------
# Each step's own progress shows: pip's download bar for torch (hundreds of MB), uv's for the rest.
# pip's warnings about this machine's configured local indexes (absent folders) are left out.
quiet_pip() { "${pip[@]}" "$@" 2> >(grep -v "is ignored" >&2); }
say "[1/3] pip and uv"
quiet_pip install -q --upgrade pip uv
[ -n "$torch_note" ] || torch_note="${TORCH_INDEX_URL:-the index pip is configured with}"
say "[2/3] $torch_spec from $torch_note"
quiet_pip install ${torch_index[@]+"${torch_index[@]}"} "$torch_spec"
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
#
# kokoro 0.9.4 and misaki 0.9.4, the newest, declare Requires-Python <3.13. uv reads only the lower bound of a
# dependency's Requires-Python, so it installs them on 3.13 and 3.14 too; pip is told to ignore the bound. The
# suite passes on Python 3.13 with them (docs/deploy.md, "Python versions").
say "[3/3] the project ($extras) and its dependencies"
constraint=()
[ -z "${PIP_CONSTRAINT:-}" ] || constraint=(--constraint "$PIP_CONSTRAINT")
past_bound=()
if [ "${pyver#3.}" -ge 13 ]; then
    say "Python $pyver: kokoro 0.9.4 and misaki 0.9.4 say Python <3.13; installing them past that bound (they run here: docs/deploy.md)"
    past_bound=(--ignore-requires-python)
fi
if ! .venv/bin/python -m uv pip install --compile-bytecode --python .venv/bin/python ${constraint[@]+"${constraint[@]}"} \
    -e "$target" ./vendor/en_core_web_sm; then
    say "uv could not install the project: pip installs it"
    quiet_pip install ${past_bound[@]+"${past_bound[@]}"} -e "$target" ./vendor/en_core_web_sm || true
fi
# pip's output is filtered above, so verify the result explicitly.
.venv/bin/python -c "import torch, kokoro, misaki, av, fastapi, en_core_web_sm, api" \
    || { say "install failed"; exit 1; }
[ "$extras" != "test" ] || .venv/bin/python -c "import pytest, openai, httpx" \
    || { say "test extras failed to install"; exit 1; }
echo "$want" > "$stamp"
say "done: Python $(version_of .venv/bin/python) in .venv, $(.venv/bin/python -c 'import torch; print("torch", torch.__version__)')"
