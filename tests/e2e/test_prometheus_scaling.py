"""The autoscaler's input, end to end: Debian's Prometheus scrapes a real server process (two uvicorn workers
over the tone engine) through the relabelling rules of deploy/k8s/monitoring/prometheus-scrape.yaml, while
`python -m scripts.bench load` loads it; the ScaledObjects' exact queries, evaluated through Prometheus's HTTP
API, must give the requests in flight plus waiting that the server reports (within one, as the issue asks),
and 0 once the load is over. The server stands as a pod of each variant (the CPU's Deployment, the GPU's
StatefulSet), and each variant's query must count its own pod only; decoy targets (the same pods in another
namespace, and a port of another name) must not count.

Debian's Prometheus is built without Kubernetes discovery, so a file of targets carries the
`__meta_kubernetes_*` labels Kubernetes discovery would give the pod; everything after discovery is the
shipped job's."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from scripts.harness import ROOT, Server, free_port, running_server, spawn, stop_process

K8S = ROOT / "deploy" / "k8s"
GAUGES = ("kokoro_requests_in_flight", "kokoro_requests_waiting")
SCRAPE_INTERVAL_S = 1.0
CLIENTS = 8
NAMESPACE = "kokoro"
# A pod of each variant's workload, as Kubernetes names them: a Deployment's pod carries its ReplicaSet's
# hash and 5 random characters, a StatefulSet's is numbered.
PODS = {"cpu": "kokoro-tts-7d9f8b6c5d-x2x4z", "gpu": "kokoro-tts-0"}


def scaling_queries() -> dict[str, str]:
    queries = {}
    for variant in ("cpu", "gpu"):
        scaled = yaml.safe_load((K8S / variant / "scaledobject.yaml").read_text())
        (trigger,) = [trigger for trigger in scaled["spec"]["triggers"] if trigger["name"] == "speech"]
        queries[variant] = trigger["metadata"]["query"]
    return queries


def pod_target(server: Server, namespace: str, pod: str, port_name: str) -> dict[str, Any]:
    """The server as Kubernetes pod discovery (role: pod) would present one of its container ports."""
    return {
        "targets": [server.url.removeprefix("http://")],
        "labels": {
            "__meta_kubernetes_namespace": namespace,
            "__meta_kubernetes_pod_name": pod,
            "__meta_kubernetes_pod_label_app_kubernetes_io_name": "kokoro-tts",
            "__meta_kubernetes_pod_container_port_name": port_name,
        },
    }


@pytest.fixture
def server(random_weights: Path, tmp_path: Path) -> Iterator[Server]:
    with running_server(
        random_weights,
        tmp_path / "server.log",
        module="tests.tone_server",
        workers="2",
        TONE_ENGINE_DELAY_S="0.3",
        KOKORO_MAX_INFLIGHT="2",  # 8 clients on 2 workers: 4 in synthesis, the rest waiting
        KOKORO_MAX_WAITING="8",
    ) as started:
        yield started


@pytest.fixture
def prometheus(server: Server, tmp_path: Path) -> Iterator[Server]:
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.fail("prometheus is missing: apt-get install prometheus (scripts/test.sh does)")
    (job,) = yaml.safe_load((K8S / "monitoring" / "prometheus-scrape.yaml").read_text())["scrape_configs"]
    del job["kubernetes_sd_configs"]
    targets = tmp_path / "targets.json"
    targets.write_text(
        json.dumps(
            [
                *(pod_target(server, NAMESPACE, pod, "http") for pod in PODS.values()),
                # Another namespace's pods.
                *(pod_target(server, "staging", pod, "http") for pod in PODS.values()),
                pod_target(server, NAMESPACE, "kokoro-tts-1", "debug"),  # a port the job does not keep
            ]
        )
    )
    job["file_sd_configs"] = [{"files": [str(targets)], "refresh_interval": "1s"}]
    job["scrape_interval"] = f"{SCRAPE_INTERVAL_S:.0f}s"
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump({"scrape_configs": [job]}))
    port = free_port()
    command = [
        binary,
        f"--config.file={config}",
        f"--storage.tsdb.path={tmp_path / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    process = spawn(command, tmp_path / "prometheus.log", port)
    try:
        deadline = time.monotonic() + 60
        while not answers(f"{process.url}/-/ready"):
            process.check_alive()
            assert time.monotonic() < deadline, process.log()
            time.sleep(0.25)
        yield process
    finally:
        stop_process(process.process)


def answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def evaluate(prometheus: Server, query: str) -> float:
    response = httpx.get(f"{prometheus.url}/api/v1/query", params={"query": query}, timeout=10)
    response.raise_for_status()
    body = response.json()
    assert body["status"] == "success", body
    (sample,) = body["data"]["result"]  # `sum(...) or vector(0)`: always exactly one
    return float(sample["value"][1])


def reported(server: Server) -> float:
    """Requests in flight plus waiting, as the server's own /metrics says (both workers summed)."""
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name in GAUGES
    )


def scraped_targets(prometheus: Server) -> list[dict[str, Any]]:
    response = httpx.get(f"{prometheus.url}/api/v1/targets", timeout=10)
    return response.json()["data"]["activeTargets"]  # type: ignore[no-any-return]


def every_target_up(prometheus: Server) -> bool:
    targets = scraped_targets(prometheus)
    return bool(targets) and all(target["health"] == "up" for target in targets)


def test_the_scaling_query_reads_the_servers_queue(
    server: Server, prometheus: Server, tmp_path: Path
) -> None:
    queries = scaling_queries()
    deadline = time.monotonic() + 30
    while not every_target_up(prometheus):  # each variant's query reads its own pod's
        assert time.monotonic() < deadline, scraped_targets(prometheus)
        time.sleep(0.5)
    kept = {(found["labels"]["namespace"], found["labels"]["pod"]) for found in scraped_targets(prometheus)}
    # The `debug` port is dropped.
    assert kept == {(namespace, pod) for namespace in (NAMESPACE, "staging") for pod in PODS.values()}

    load = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "scripts.bench",
            "load",
            f"--url={server.url}",
            "--clients",
            str(CLIENTS),
            "--requests",
            str(3 * CLIENTS),
            "--format",
            "pcm",
            "--texts",
            "long",
            "--no-decode",
            f"--out={tmp_path / 'load.json'}",
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    pairs: list[tuple[float, dict[str, float]]] = []
    try:
        while load.poll() is None:
            # The server's count held for longer than a scrape interval on both sides of the queries, so the
            # newest scrape saw that same count.
            before = reported(server)
            time.sleep(2 * SCRAPE_INTERVAL_S + 0.2)
            during = reported(server)
            evaluated = {variant: evaluate(prometheus, query) for variant, query in queries.items()}
            if before == during == reported(server) and during > 0:
                pairs.append((during, evaluated))
    finally:
        load.wait(300)
    assert load.returncode == 0
    summary = json.loads((tmp_path / "load.json").read_text())
    assert sum(level["ok"] for level in summary["results"]["levels"]) == 3 * CLIENTS, summary

    assert len(pairs) >= 3, pairs
    assert max(server_count for server_count, _ in pairs) > 2 * 2  # some waited: both gauges were in play
    print("server count, evaluated queries:", pairs)
    for server_count, evaluated in pairs:
        for variant, value in evaluated.items():
            assert abs(value - server_count) <= 1, (variant, pairs)

    time.sleep(3 * SCRAPE_INTERVAL_S)
    assert reported(server) == 0
    after = {variant: evaluate(prometheus, query) for variant, query in queries.items()}
    assert after == {"cpu": 0, "gpu": 0}
