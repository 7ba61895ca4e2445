"""deploy/k8s/: rendered by kustomize itself (kubectl's, scripts/tools/get_kubectl.sh), every manifest valid
offline against the Kubernetes schemas (kubernetes-validate, strict), KEDA's ScaledObject and the Prometheus
Operator's PodMonitor against their own CRDs' schemas (tests/data/schemas/, strict as `kubectl apply
--validate=strict` is); probes, the preStop drain, the writable paths, the scaling query and the scrape
configuration checked against the server's own code."""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from api.metrics import Metrics
from api.server.drain import POLL_S, READ_TIMEOUT_S, UNANSWERED_S
from api.settings import DEFAULT_WEIGHTS_DIR, Settings

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
CRDS = ROOT / "tests" / "data" / "schemas"
KUBECTL = ROOT / ".venv" / "bin" / "kubectl"
VARIANTS = ("cpu", "gpu")
# What runs each variant's pods: on a CPU the kernels compile in the background of a serving pod, so its cache
# may go with the pod; on a GPU they compile before /ready, so each pod keeps its cache on a claim of its own.
WORKLOADS = {"cpu": "Deployment", "gpu": "StatefulSet"}
NAMESPACE = "kokoro"
# The oldest Kubernetes release still maintained upstream and the newest the package knows.
KUBERNETES_VERSIONS = ("1.29.0", kubernetes_validate.latest_version())
# Speech at speed 1.0: about 15 characters of English text per second of audio (150 words a minute).
CHARS_PER_AUDIO_SECOND = 15
# `timeout_graceful_shutdown` in api/__main__.py: uvicorn's drain after SIGTERM.
UVICORN_DRAIN_S = 30
# The variables docker/entrypoint.sh turns into flags (not settings).
ENTRYPOINT_VARS = {"KOKORO_WORKERS", "KOKORO_LIMIT_CONCURRENCY"}
# A hung server must be running again within this (issue 57).
HUNG_RESTART_S = 60


def kustomize(directory: Path) -> str:
    if not KUBECTL.exists():
        pytest.fail("kubectl is missing: run `bash scripts/tools/get_kubectl.sh` (scripts/test.sh does)")
    done = subprocess.run(
        [str(KUBECTL), "kustomize", str(directory)], capture_output=True, text=True, check=False, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@cache
def rendered_variant(variant: str) -> str:
    return kustomize(K8S / variant)


def documents(variant: str) -> list[dict[str, Any]]:
    """What `kubectl apply -k deploy/k8s/<variant>` applies, as kustomize renders it."""
    return [doc for doc in yaml.safe_load_all(rendered_variant(variant)) if doc]


def of_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = [doc for doc in docs if doc["kind"] == kind]
    return found


def workload(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """The variant's Deployment or StatefulSet."""
    (found,) = [doc for doc in docs if doc["kind"] in WORKLOADS.values()]
    return found


def container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (server,) = workload(docs)["spec"]["template"]["spec"]["containers"]
    return server  # type: ignore[no-any-return]


def compile_cache_mount(docs: list[dict[str, Any]]) -> str:
    """The name of the volume mounted at the server's compile-cache directory."""
    default = Settings.model_fields["compile_cache_dir"].default
    path = Path(env(docs)["HOME"]) / default.relative_to(Path.home())
    mounts = {mount["mountPath"]: mount["name"] for mount in container(docs)["volumeMounts"]}
    return mounts[str(path)]  # type: ignore[no-any-return]


def env(docs: list[dict[str, Any]]) -> dict[str, str]:
    """The server's environment: values, and for those taken from a Secret, the Secret's name and key."""
    return {
        item["name"]: item.get("value") or "secret:{name}/{key}".format(**item["valueFrom"]["secretKeyRef"])
        for item in container(docs)["env"]
    }


def strict(schema: Any) -> Any:
    """A CRD's schema with unknown fields refused, as the API server's strict field validation refuses them
    (a structural schema prunes them silently otherwise)."""
    if isinstance(schema, list):
        return [strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: strict(value) for key, value in schema.items()}
    if (
        out.get("type") == "object"
        and "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


@cache
def crd_schemas() -> dict[tuple[str, str], dict[str, Any]]:
    """(apiVersion, kind) -> the strict schema of each vendored CRD's served versions."""
    schemas = {}
    for path in sorted(CRDS.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        for version in crd["spec"]["versions"]:
            schema = strict(version["schema"]["openAPIV3Schema"])
            schemas[(f"{crd['spec']['group']}/{version['name']}", crd["spec"]["names"]["kind"])] = schema
    return schemas


def validate(doc: dict[str, Any]) -> None:
    schema = crd_schemas().get((doc["apiVersion"], doc["kind"]))
    if schema is not None:
        jsonschema.validate(doc, schema)
        return
    for version in KUBERNETES_VERSIONS:
        kubernetes_validate.validate(doc, version, strict=True)


@pytest.fixture(params=VARIANTS)
def variant(request: pytest.FixtureRequest) -> str:
    return request.param  # type: ignore[no-any-return]


@pytest.fixture
def rendered(variant: str) -> list[dict[str, Any]]:
    return documents(variant)


def test_every_manifest_is_valid(variant: str, rendered: list[dict[str, Any]]) -> None:
    assert sorted(doc["kind"] for doc in rendered) == sorted(
        [WORKLOADS[variant], "Service", "PodDisruptionBudget", "ScaledObject", "PodMonitor"]
    )
    for doc in rendered:
        assert doc["metadata"]["namespace"] == NAMESPACE, doc["kind"]
        validate(doc)


def test_the_vendored_crds_are_the_ones_the_manifests_use() -> None:
    assert {("keda.sh/v1alpha1", "ScaledObject"), ("monitoring.coreos.com/v1", "PodMonitor")} <= set(
        crd_schemas()
    )


@pytest.mark.parametrize(
    ("kind", "path", "value"),
    [
        ("Deployment", ("spec", "template", "spec", "terminationGracePeriod"), 1),  # a misspelt field
        ("Deployment", ("spec", "replicas"), "two"),
        ("Deployment", ("spec", "serviceName"), "kokoro-tts"),  # a StatefulSet's field
        ("ScaledObject", ("spec", "triggers", 0, "metadata", "threshold"), 3),  # KEDA wants strings
        ("ScaledObject", ("spec", "minReplicas"), 2),  # the HPA's name, not KEDA's
        ("ScaledObject", ("spec", "scaleTargetRef", "kind"), 7),
        ("PodMonitor", ("spec", "podMetricsEndpoints", 0, "scrapeInterval"), "15s"),  # it is `interval`
        ("PodMonitor", ("spec", "selector", "matchLabel"), {}),
    ],
)
def test_validation_catches_a_broken_manifest(kind: str, path: tuple[Any, ...], value: object) -> None:
    broken = copy.deepcopy(of_kind(documents("cpu"), kind))
    node = broken
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    with pytest.raises((kubernetes_validate.ValidationError, jsonschema.ValidationError)):
        validate(broken)


def test_probes(rendered: list[dict[str, Any]]) -> None:
    server = container(rendered)
    assert server["ports"] == [
        {"name": "http", "containerPort": 8880},
        {"name": "wyoming", "containerPort": 10200},
    ]
    for probe, path in (
        ("startupProbe", "/ready"),
        ("readinessProbe", "/ready"),
        ("livenessProbe", "/health"),
    ):
        assert server[probe]["httpGet"] == {"path": path, "port": "http"}, probe
    startup = server["startupProbe"]
    # A start that compiles its kernels before /ready: 175 s measured on a CPU (KOKORO_COMPILE_IN_BACKGROUND
    # false; by default a CPU is ready in seconds), up to 215 s on a GPU (issue 46).
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 2 * 215


def test_a_hung_server_is_restarted_within_a_minute(rendered: list[dict[str, Any]]) -> None:
    liveness = container(rendered)["livenessProbe"]
    # /health is answered by the event loop, which synthesis never blocks: 20 s of silence is a hang.
    detected_s = liveness["periodSeconds"] * liveness["failureThreshold"] + liveness["timeoutSeconds"]
    assert detected_s >= 20
    # The kill uses the probe's grace, not the pod's drain-sized one; the preStop hook inside it gives up on
    # a server that does not answer /metrics (api/server/drain.py; tests/e2e/test_drain_server.py runs it).
    grace_s = liveness["terminationGracePeriodSeconds"]
    # The hook gives up at most one read and one poll after UNANSWERED_S; 2 s for Python's start.
    assert grace_s >= UNANSWERED_S + READ_TIMEOUT_S + POLL_S + 2
    assert detected_s + grace_s <= HUNG_RESTART_S


def test_drain_outlasts_the_longest_stream(rendered: list[dict[str, Any]]) -> None:
    settings = Settings(
        **{
            name.removeprefix("KOKORO_").lower(): value
            for name, value in env(rendered).items()
            if name.startswith("KOKORO_") and name not in ENTRYPOINT_VARS
        }
    )
    longest_stream_s = settings.max_wait_s + settings.max_input_chars / CHARS_PER_AUDIO_SECOND
    command = container(rendered)["lifecycle"]["preStop"]["exec"]["command"]
    assert command[:3] == ["python", "-m", "api.server.drain"]
    drain_s = float(command[command.index("--timeout") + 1])
    assert drain_s >= longest_stream_s
    grace_s = workload(rendered)["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace_s >= drain_s + UVICORN_DRAIN_S
    assert f"timeout_graceful_shutdown={UVICORN_DRAIN_S}," in (ROOT / "api" / "__main__.py").read_text()


def test_environment_names_settings(rendered: list[dict[str, Any]]) -> None:
    for name in env(rendered):
        if name.startswith("KOKORO_") and name not in ENTRYPOINT_VARS:
            assert name.removeprefix("KOKORO_").lower() in Settings.model_fields, name


def test_book_jobs_go_to_postgresql_from_a_secret_and_scale_on_their_queue(
    rendered: list[dict[str, Any]],
) -> None:
    variables = env(rendered)
    assert variables["KOKORO_JOBS_DATABASE"] == "secret:kokoro-jobs-database/url"
    database = next(item for item in container(rendered)["env"] if item["name"] == "KOKORO_JOBS_DATABASE")
    assert (
        database["valueFrom"]["secretKeyRef"]["optional"] is True
    )  # without it: no book jobs, pods still run
    assert variables["KOKORO_DATA_DIR"] == "none"  # a pod's own disk: finished files are copied to /tmp
    triggers = {trigger["name"]: trigger for trigger in of_kind(rendered, "ScaledObject")["spec"]["triggers"]}
    assert set(triggers) == {"speech", "books"}
    query = triggers["books"]["metadata"]["query"]
    assert query.startswith("max(kokoro_book_units_waiting{")  # every pod reports the whole queue
    assert 'namespace="kokoro"' in query
    assert "kokoro_book_units_waiting" in Metrics().registry._names_to_collectors  # the server exports it


def test_the_wyoming_port_is_served_and_off_until_turned_on(rendered: list[dict[str, Any]]) -> None:
    variables = env(rendered)
    assert variables["KOKORO_WYOMING"] == "false"  # no authentication: on only where the network is trusted
    assert variables["KOKORO_WYOMING_HOST"] == "0.0.0.0"
    ports = {port["name"]: port for port in of_kind(rendered, "Service")["spec"]["ports"]}
    assert ports["wyoming"]["port"] == Settings().wyoming_port == 10200
    assert ports["wyoming"]["targetPort"] == "wyoming"


def test_read_only_root_with_the_paths_the_server_writes(rendered: list[dict[str, Any]]) -> None:
    server = container(rendered)
    assert server["securityContext"]["readOnlyRootFilesystem"] is True
    mounts = {mount["mountPath"]: mount["name"] for mount in server["volumeMounts"]}
    home = Path(env(rendered)["HOME"])
    # tempfile's directory: metrics files, the worker board, ONNX scratch files.
    assert tempfile.gettempdir() == "/tmp"
    assert "/tmp" in mounts
    # The weights cache when fetching (~/.cache/kokoro-openai-server/...).
    inside = home / DEFAULT_WEIGHTS_DIR.relative_to(Path.home())
    assert any(inside.is_relative_to(mount) for mount in mounts), inside
    spec = workload(rendered)["spec"]
    volumes = {volume["name"] for volume in spec["template"]["spec"]["volumes"]}
    claims = {claim["metadata"]["name"] for claim in spec.get("volumeClaimTemplates", [])}
    assert set(mounts.values()) == volumes | claims


def test_the_cpu_compile_cache_goes_with_the_pod() -> None:
    """A new pod is ready in seconds on an empty cache and compiles in the background, so the cache is the
    pod's own emptyDir and the pods are a plain Deployment, rolled over without losing a serving pod."""
    docs = documents("cpu")
    spec = of_kind(docs, "Deployment")["spec"]
    volumes = {volume["name"]: volume for volume in spec["template"]["spec"]["volumes"]}
    assert "emptyDir" in volumes[compile_cache_mount(docs)]
    assert not {"volumeClaimTemplates", "serviceName"} & set(spec)
    assert all("persistentVolumeClaim" not in volume for volume in volumes.values())
    # The background compile is what makes an empty cache cheap: on by default, and set where it is relied on.
    assert Settings.model_fields["compile_in_background"].default is True
    assert env(docs)["KOKORO_COMPILE_IN_BACKGROUND"] == "true"
    # A new pod is ready before an old one drains: a rollout never lowers the serving capacity.
    assert spec["strategy"]["type"] == "RollingUpdate"
    assert spec["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}


def test_the_gpu_compile_cache_outlives_the_pod() -> None:
    """The GPU's kernels compile before /ready: each pod's compiled kernels live on its own claim, kept when
    the pod is replaced or scaled away."""
    docs = documents("gpu")
    spec = of_kind(docs, "StatefulSet")["spec"]
    (claim,) = spec["volumeClaimTemplates"]
    assert compile_cache_mount(docs) == claim["metadata"]["name"]
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]  # any storage class has it
    assert spec["persistentVolumeClaimRetentionPolicy"] == {"whenScaled": "Retain", "whenDeleted": "Retain"}
    # Owned by the server's user on mount.
    assert spec["template"]["spec"]["securityContext"]["fsGroup"] == 10001


def test_uploads_are_off_where_each_pod_has_its_own_disk(rendered: list[dict[str, Any]]) -> None:
    """No claim is shared between the pods (emptyDirs, and on the GPU the one claim template, each pod's
    own, ReadWriteOnce): an upload would be served by one replica only, so uploads are off until a
    ReadWriteMany claim is mounted."""
    spec = workload(rendered)["spec"]
    claims = spec.get("volumeClaimTemplates", [])
    assert all(claim["spec"]["accessModes"] == ["ReadWriteOnce"] for claim in claims)
    assert all("persistentVolumeClaim" not in volume for volume in spec["template"]["spec"]["volumes"])
    custom = Path(env(rendered)["HOME"]) / Settings.model_fields["custom_voices_dir"].default.relative_to(
        Path.home()
    )
    mounts = {mount["mountPath"] for mount in container(rendered)["volumeMounts"]}
    assert str(custom) not in mounts
    assert env(rendered)["KOKORO_VOICE_UPLOADS"] == "false"


def test_gpu_variant_asks_for_a_gpu() -> None:
    gpu = container(documents("gpu"))
    assert gpu["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert gpu["image"].endswith(":gpu")
    assert "/home/kokoro/.triton" in {mount["mountPath"] for mount in gpu["volumeMounts"]}
    assert container(documents("cpu"))["image"].endswith(":cpu")


def test_a_rebuilt_tag_is_pulled_again(rendered: list[dict[str, Any]]) -> None:
    assert container(rendered)["imagePullPolicy"] == "Always"


def test_an_overlay_sets_the_registrys_image(tmp_path: Path) -> None:
    """The docs' way to point a variant at an image of one's registry, before the first apply."""
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    shutil.copytree(K8S, tmp_path / "k8s")
    (overlay / "kustomization.yaml").write_text(
        "resources: [../k8s/cpu]\n"
        "images:\n"
        "  - name: kokoro-openai-server\n"
        "    newName: registry.example.com/team/kokoro-openai-server\n"
        "    newTag: cpu-1a2b3c4\n"
    )
    docs = [doc for doc in yaml.safe_load_all(kustomize(overlay)) if doc]
    assert container(docs)["image"] == "registry.example.com/team/kokoro-openai-server:cpu-1a2b3c4"
    docs_text = (ROOT / "docs" / "deploy.md").read_text()
    assert "newName: $REGISTRY/kokoro-openai-server" in docs_text


def scaling_queries(docs: list[dict[str, Any]]) -> dict[str, str]:
    """Each trigger's query, by the trigger's name."""
    return {
        trigger["name"]: str(trigger["metadata"]["query"])
        for trigger in of_kind(docs, "ScaledObject")["spec"]["triggers"]
    }


def test_scaling_reads_the_servers_queue_gauges(rendered: list[dict[str, Any]]) -> None:
    scaled = of_kind(rendered, "ScaledObject")
    pods = workload(rendered)
    target = scaled["spec"]["scaleTargetRef"]
    assert (target["apiVersion"], target["kind"], target["name"]) == (
        pods["apiVersion"],
        pods["kind"],
        pods["metadata"]["name"],
    )
    assert {trigger["metricType"] for trigger in scaled["spec"]["triggers"]} == {"AverageValue"}  # per pod
    (trigger,) = [trigger for trigger in scaled["spec"]["triggers"] if trigger["name"] == "speech"]
    query = scaling_queries(rendered)["speech"]
    names = set(re.search(r'__name__=~"([^"]+)"', query).group(1).split("|"))  # type: ignore[union-attr]
    metrics = Metrics()
    assert names == {metrics.in_flight.describe()[0].name, metrics.waiting.describe()[0].name}
    # Summed over a pod's workers (livesum), so that each pod reports its own total.
    assert metrics.in_flight._multiprocess_mode == metrics.waiting._multiprocess_mode == "livesum"
    assert float(trigger["metadata"]["threshold"]) <= scaled_inflight(rendered)


def pod_names(kind: str, name: str) -> list[str]:
    """Names Kubernetes gives a workload's pods: a StatefulSet's are numbered, a Deployment's carry its
    ReplicaSet's pod-template hash and 5 random characters (both from bcdfghjklmnpqrstvwxz2456789)."""
    if kind == "StatefulSet":
        return [f"{name}-0", f"{name}-12"]
    return [f"{name}-7d9f8b6c5d-x2x4z", f"{name}-58fc97b4d-2lqkw"]


def test_scaling_counts_this_workloads_pods_only(rendered: list[dict[str, Any]]) -> None:
    pods = workload(rendered)
    name = pods["metadata"]["name"]
    (other_kind,) = set(WORKLOADS.values()) - {pods["kind"]}
    for query in scaling_queries(rendered).values():
        namespace = re.search(r'namespace="([^"]+)"', query).group(1)  # type: ignore[union-attr]
        assert namespace == pods["metadata"]["namespace"]
        selected = re.search(r'pod=~"([^"]+)"', query).group(1)  # type: ignore[union-attr]
        for pod in pod_names(pods["kind"], name):
            assert re.fullmatch(selected, pod), pod  # PromQL's regexes are anchored, as fullmatch
        others = [
            *pod_names(other_kind, name),  # the other variant's pods, left behind in the namespace
            *pod_names(pods["kind"], f"{name}-canary"),
            *pod_names(pods["kind"], f"other-{name}"),
            f"{name}-gpu-0",
            name,
        ]
        for other in others:
            assert not re.fullmatch(selected, other), other
        assert query.rstrip().endswith("or vector(0)")


def test_keda_keeps_a_pod_for_the_disruption_budget(rendered: list[dict[str, Any]]) -> None:
    assert "replicas" not in workload(rendered)["spec"]  # KEDA owns the count: an apply must not reset it
    budget = of_kind(rendered, "PodDisruptionBudget")["spec"]
    assert "maxUnavailable" not in budget
    assert budget["minAvailable"] < of_kind(rendered, "ScaledObject")["spec"]["minReplicaCount"]


def scaled_inflight(docs: list[dict[str, Any]]) -> float:
    """Requests a pod synthesizes at once: the threshold must be reached before they start to wait."""
    variables = env(docs)
    return int(variables["KOKORO_WORKERS"]) * int(variables["KOKORO_MAX_INFLIGHT"])


def test_service_budget_and_monitor_select_the_pods(rendered: list[dict[str, Any]]) -> None:
    pods = workload(rendered)
    labels = pods["spec"]["template"]["metadata"]["labels"]
    assert pods["spec"]["selector"]["matchLabels"].items() <= labels.items()
    selectors = [
        of_kind(rendered, "Service")["spec"]["selector"],
        of_kind(rendered, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"],
        of_kind(rendered, "PodMonitor")["spec"]["selector"]["matchLabels"],
    ]
    for selector in selectors:
        assert selector.items() <= labels.items()
    if pods["kind"] == "StatefulSet":
        assert pods["spec"]["serviceName"] == of_kind(rendered, "Service")["metadata"]["name"]


def test_the_pod_monitor_scrapes_the_servers_metrics(rendered: list[dict[str, Any]]) -> None:
    (endpoint,) = of_kind(rendered, "PodMonitor")["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] in {port["name"] for port in container(rendered)["ports"]}
    assert endpoint["path"] == "/metrics"


def scrape_job() -> dict[str, Any]:
    (job,) = yaml.safe_load((K8S / "monitoring" / "prometheus-scrape.yaml").read_text())["scrape_configs"]
    return job  # type: ignore[no-any-return]


def test_the_plain_scrape_job_keeps_the_servers_pods_in_its_namespace() -> None:
    job = scrape_job()
    (discovery,) = job["kubernetes_sd_configs"]
    assert discovery == {"role": "pod", "namespaces": {"names": [NAMESPACE]}}
    docs = documents("cpu")
    labels = workload(docs)["spec"]["template"]["metadata"]["labels"]
    rules = job["relabel_configs"]
    keeps = {rule["source_labels"][0]: rule["regex"] for rule in rules if rule.get("action") == "keep"}
    assert keeps["__meta_kubernetes_pod_label_app_kubernetes_io_name"] == labels["app.kubernetes.io/name"]
    assert keeps["__meta_kubernetes_pod_container_port_name"] == container(docs)["ports"][0]["name"]
    targets = {rule["target_label"] for rule in job["relabel_configs"] if "target_label" in rule}
    assert {"namespace", "pod"} <= targets  # what the scaling query matches on


def test_promtool_accepts_the_plain_scrape_job(tmp_path: Path) -> None:
    """Its relabelling rules; Debian's Prometheus is built without Kubernetes discovery, so a file's targets
    stand in for it (tests/e2e/test_prometheus_scaling.py feeds them the labels Kubernetes would)."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is missing: apt-get install prometheus (scripts/test.sh does)")
    job = scrape_job()
    del job["kubernetes_sd_configs"]
    job["file_sd_configs"] = [{"files": [str(tmp_path / "targets.json")]}]
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump({"scrape_configs": [job]}))
    done = subprocess.run(
        [promtool, "check", "config", str(config)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_docs_show_how_to_apply() -> None:
    text = (ROOT / "docs" / "deploy.md").read_text()
    for variant in VARIANTS:
        assert f"kubectl apply -k deploy/k8s/{variant}" in text
