"""deploy/k8s/: every manifest valid against the Kubernetes schemas (offline, kubernetes-validate), KEDA's
ScaledObject structurally; probes, the preStop drain, the writable paths and the scaling metrics checked
against the server's own code."""

from __future__ import annotations

import copy
import re
import tempfile
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from api.metrics import Metrics
from api.settings import DEFAULT_WEIGHTS_DIR, Settings

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
VARIANTS = ("cpu", "gpu")
# The oldest Kubernetes release still maintained upstream and the newest the package knows.
KUBERNETES_VERSIONS = ("1.29.0", kubernetes_validate.latest_version())
KEDA = ("keda.sh/v1alpha1", "ScaledObject")
# What kustomize does with these kustomizations: list resources, nothing else (no patches, no generators),
# so that rendering them is concatenation and the files validated here are exactly what is applied.
KUSTOMIZATION_KEYS = {"apiVersion", "kind", "resources"}
# Speech at speed 1.0: about 15 characters of English text per second of audio (150 words a minute).
CHARS_PER_AUDIO_SECOND = 15
# `timeout_graceful_shutdown` in api/__main__.py: uvicorn's drain after SIGTERM.
UVICORN_DRAIN_S = 30
# The variables docker/entrypoint.sh turns into flags (not settings).
ENTRYPOINT_VARS = {"KOKORO_WORKERS", "KOKORO_LIMIT_CONCURRENCY"}

# KEDA 2.x's ScaledObject, the fields used here (kubernetes-validate has no schema for KEDA's CRD).
SCALED_OBJECT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": KEDA[0]},
        "kind": {"const": KEDA[1]},
        "metadata": {"type": "object", "required": ["name"]},
        "spec": {
            "type": "object",
            "required": ["scaleTargetRef", "triggers"],
            "additionalProperties": False,
            "properties": {
                "scaleTargetRef": {
                    "type": "object",
                    "required": ["name"],
                    "properties": {"name": {"type": "string"}, "kind": {"type": "string"}},
                },
                "minReplicaCount": {"type": "integer", "minimum": 0},
                "maxReplicaCount": {"type": "integer", "minimum": 1},
                "pollingInterval": {"type": "integer", "minimum": 1},
                "cooldownPeriod": {"type": "integer", "minimum": 0},
                "advanced": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {"horizontalPodAutoscalerConfig": {"type": "object"}},
                },
                "triggers": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "required": ["type", "metadata"],
                        "additionalProperties": False,
                        "properties": {
                            "type": {"const": "prometheus"},
                            "metricType": {"enum": ["AverageValue", "Value"]},
                            "metadata": {
                                "type": "object",
                                "required": ["serverAddress", "query", "threshold"],
                                "additionalProperties": {"type": "string"},
                            },
                        },
                    },
                },
            },
        },
    },
}


def documents(path: Path) -> list[dict[str, Any]]:
    """What `kubectl apply -k` applies for a kustomization directory, or the documents of one file."""
    if path.is_file():
        return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    kustomization = yaml.safe_load((path / "kustomization.yaml").read_text())
    assert set(kustomization) <= KUSTOMIZATION_KEYS, kustomization
    return [doc for resource in kustomization["resources"] for doc in documents(path / resource)]


def of_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = [doc for doc in docs if doc["kind"] == kind]
    return found


def container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (server,) = of_kind(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    return server  # type: ignore[no-any-return]


def env(docs: list[dict[str, Any]]) -> dict[str, str]:
    return {item["name"]: item["value"] for item in container(docs)["env"]}


def validate(doc: dict[str, Any]) -> None:
    if (doc["apiVersion"], doc["kind"]) == KEDA:
        jsonschema.validate(doc, SCALED_OBJECT_SCHEMA)
        behavior = doc["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
        doc = {
            "apiVersion": "autoscaling/v2",
            "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": "behavior"},
            "spec": {
                "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "x"},
                "maxReplicas": doc["spec"]["maxReplicaCount"],
                "behavior": behavior,
            },
        }
    for version in KUBERNETES_VERSIONS:
        kubernetes_validate.validate(doc, version, strict=True)


@pytest.fixture(params=VARIANTS)
def rendered(request: pytest.FixtureRequest) -> list[dict[str, Any]]:
    return documents(K8S / request.param)


def test_every_manifest_is_valid(rendered: list[dict[str, Any]]) -> None:
    assert {doc["kind"] for doc in rendered} == {
        "Deployment",
        "Service",
        "PodDisruptionBudget",
        "ScaledObject",
    }
    for doc in rendered:
        validate(doc)


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("spec", "template", "spec", "terminationGracePeriod"), 1),  # a misspelt field
        (("spec", "replicas"), "two"),
    ],
)
def test_validation_catches_a_broken_deployment(path: tuple[str, ...], value: object) -> None:
    broken = copy.deepcopy(of_kind(documents(K8S / "cpu"), "Deployment"))
    node = broken
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(broken)


def test_validation_catches_a_broken_scaled_object() -> None:
    broken = copy.deepcopy(of_kind(documents(K8S / "cpu"), "ScaledObject"))
    broken["spec"]["triggers"][0]["metadata"]["threshold"] = 3  # KEDA wants strings
    with pytest.raises(jsonschema.ValidationError):
        validate(broken)


def test_probes(rendered: list[dict[str, Any]]) -> None:
    server = container(rendered)
    assert server["ports"] == [{"name": "http", "containerPort": 8880}]
    for probe, path in (
        ("startupProbe", "/ready"),
        ("readinessProbe", "/ready"),
        ("livenessProbe", "/health"),
    ):
        assert server[probe]["httpGet"] == {"path": path, "port": "http"}, probe
    startup = server["startupProbe"]
    # A first start compiles kernels: 175 s measured on a CPU, up to 215 s on a GPU (issue 46).
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 2 * 215
    liveness = server["livenessProbe"]
    # /health is answered by the event loop, which synthesis never blocks; a minute of silence is a hang.
    assert liveness["periodSeconds"] * liveness["failureThreshold"] >= 60


def test_drain_outlasts_the_longest_stream(rendered: list[dict[str, Any]]) -> None:
    deployment = of_kind(rendered, "Deployment")
    settings = Settings(
        **{
            name.removeprefix("KOKORO_").lower(): value
            for name, value in env(rendered).items()
            if name.startswith("KOKORO_") and name not in ENTRYPOINT_VARS
        }
    )
    longest_stream_s = settings.max_wait_s + settings.max_input_chars / CHARS_PER_AUDIO_SECOND
    command = container(rendered)["lifecycle"]["preStop"]["exec"]["command"]
    assert command[:3] == ["python", "-m", "api.drain"]
    drain_s = float(command[command.index("--timeout") + 1])
    assert drain_s >= longest_stream_s
    grace_s = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace_s >= drain_s + UVICORN_DRAIN_S
    assert f"timeout_graceful_shutdown={UVICORN_DRAIN_S}," in (ROOT / "api" / "__main__.py").read_text()


def test_environment_names_settings(rendered: list[dict[str, Any]]) -> None:
    for name in env(rendered):
        if name.startswith("KOKORO_") and name not in ENTRYPOINT_VARS:
            assert name.removeprefix("KOKORO_").lower() in Settings.model_fields, name


def test_read_only_root_with_the_paths_the_server_writes(rendered: list[dict[str, Any]]) -> None:
    server = container(rendered)
    assert server["securityContext"]["readOnlyRootFilesystem"] is True
    mounts = {mount["mountPath"] for mount in server["volumeMounts"]}
    home = Path(env(rendered)["HOME"])
    # tempfile's directory: metrics files, the worker board, ONNX scratch files.
    assert tempfile.gettempdir() == "/tmp"
    assert "/tmp" in mounts
    # The compiled kernels' cache and the weights cache when fetching (~/.cache/kokoro-openai-server/...).
    for default in (DEFAULT_WEIGHTS_DIR, Settings.model_fields["compile_cache_dir"].default):
        inside = home / default.relative_to(Path.home())
        assert any(inside.is_relative_to(mount) for mount in mounts), inside
    volumes = {
        volume["name"]: volume
        for volume in of_kind(rendered, "Deployment")["spec"]["template"]["spec"]["volumes"]
    }
    assert all("emptyDir" in volume for volume in volumes.values())
    assert {mount["name"] for mount in server["volumeMounts"]} == set(volumes)


def test_gpu_variant_asks_for_a_gpu() -> None:
    gpu = container(documents(K8S / "gpu"))
    assert gpu["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert gpu["image"].endswith(":gpu")
    assert "/home/kokoro/.triton" in {mount["mountPath"] for mount in gpu["volumeMounts"]}
    assert container(documents(K8S / "cpu"))["image"].endswith(":cpu")


def test_scaling_reads_the_servers_queue_gauges(rendered: list[dict[str, Any]]) -> None:
    scaled = of_kind(rendered, "ScaledObject")
    deployment = of_kind(rendered, "Deployment")
    assert scaled["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["metricType"] == "AverageValue"  # per pod
    query = trigger["metadata"]["query"]
    names = set(re.search(r'__name__=~"([^"]+)"', query).group(1).split("|"))  # type: ignore[union-attr]
    metrics = Metrics()
    assert names == {metrics.in_flight.describe()[0].name, metrics.waiting.describe()[0].name}
    # Summed over a pod's workers (livesum), so that each pod reports its own total.
    assert metrics.in_flight._multiprocess_mode == metrics.waiting._multiprocess_mode == "livesum"
    pods = re.search(r'pod=~"([^"]+)"', query).group(1)  # type: ignore[union-attr]
    assert re.fullmatch(pods, deployment["metadata"]["name"] + "-7d9f8b6c5d-x2x4z")
    assert float(trigger["metadata"]["threshold"]) <= scaled_inflight(rendered)


def scaled_inflight(docs: list[dict[str, Any]]) -> float:
    """Requests a pod synthesizes at once: the threshold must be reached before they start to wait."""
    variables = env(docs)
    return int(variables["KOKORO_WORKERS"]) * int(variables["KOKORO_MAX_INFLIGHT"])


def test_service_and_budget_select_the_pods(rendered: list[dict[str, Any]]) -> None:
    labels = of_kind(rendered, "Deployment")["spec"]["template"]["metadata"]["labels"]
    service = of_kind(rendered, "Service")["spec"]["selector"]
    budget = of_kind(rendered, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"]
    assert service.items() <= labels.items()
    assert budget.items() <= labels.items()


def test_docs_show_how_to_apply() -> None:
    text = (ROOT / "docs" / "deploy.md").read_text()
    for variant in VARIANTS:
        assert f"kubectl apply -k deploy/k8s/{variant}" in text
