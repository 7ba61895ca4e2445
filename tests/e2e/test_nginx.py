"""Two server processes behind the repo's real nginx config (Debian's nginx, on loopback), flooded with
a bounded burst: every answer is complete, decodable audio or a 503 with Retry-After; nothing hangs."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import av
import httpx
import pytest

from scripts.harness import Server, free_port, running_server, serving, spawn
from tests.deploy import load_render_nginx

ROOT = Path(__file__).resolve().parents[2]
BURST = 40
TEXT = "A short sentence for the burst. And a second one, to make two chunks."


@pytest.fixture(scope="module")
def replicas(random_weights: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Server]]:
    limits = {
        "KOKORO_MAX_INFLIGHT": "2",
        "KOKORO_MAX_WAITING": "3",
        "KOKORO_MAX_WAIT_S": "10",
        "TONE_ENGINE_DELAY_S": "0.15",
    }
    with ExitStack() as stack:
        yield [
            stack.enter_context(
                running_server(
                    random_weights,
                    tmp_path_factory.mktemp(f"replica{i}") / "server.log",
                    module="tests.tone_server",
                    **limits,
                )
            )
            for i in range(2)
        ]


@pytest.fixture(scope="module")
def balancer(replicas: list[Server], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if shutil.which("nginx") is None:
        if os.environ.get("CI"):
            pytest.fail("nginx is not installed: scripts/test.sh installs Debian's nginx-light")
        pytest.skip("nginx is not installed (scripts/test.sh installs it)")
    render = load_render_nginx()
    port = free_port()
    upstreams = [server.url.removeprefix("http://") for server in replicas]
    folder = tmp_path_factory.mktemp("nginx")
    conf = render.write_config(folder, upstreams, f"127.0.0.1:{port}")
    with serving(spawn(render.nginx_command(conf), folder / "nginx.log", port), timeout_s=20) as nginx:
        yield nginx.url


def one_request(url: str, index: int) -> tuple[int, str]:
    fmt = ("pcm", "mp3")[index % 2]
    body = {"input": TEXT, "voice": "af_heart", "response_format": fmt}
    response = httpx.post(f"{url}/v1/audio/speech", json=body, timeout=httpx.Timeout(60, connect=5))
    if response.status_code == 200:
        seconds = len(response.content) / 48000 if fmt == "pcm" else decoded_seconds(response.content)
        assert seconds > 2.0, f"short audio: {seconds} s"
        return 200, ""
    assert response.status_code == 503, response.text
    assert int(response.headers["retry-after"]) >= 1
    assert set(response.json()["error"]) == {"message", "type", "param", "code"}
    return 503, response.headers["retry-after"]


def decoded_seconds(data: bytes) -> float:
    with av.open(io.BytesIO(data)) as container:
        return (
            sum(frame.samples for frame in container.decode(audio=0)) / container.streams.audio[0].sample_rate
        )


def test_a_burst_through_nginx_gets_audio_or_503(balancer: str, replicas: list[Server]) -> None:
    with ThreadPoolExecutor(max_workers=BURST) as pool:
        results = list(
            pool.map(lambda i: one_request(balancer, i), range(BURST))
        )  # raises on any other outcome
    statuses = [status for status, _ in results]
    print(f"{statuses.count(200)} x 200, {statuses.count(503)} x 503")
    assert len(results) == BURST
    assert statuses.count(200) >= 10  # 2 replicas x (2 in synthesis + 3 in line), retried by nginx
    assert all("POST /v1/audio/speech" in server.log() for server in replicas)  # both replicas served


def test_metrics_are_not_served_through_nginx(balancer: str, replicas: list[Server]) -> None:
    response = httpx.get(f"{balancer}/metrics", timeout=10)
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"
    assert httpx.get(f"{replicas[0].url}/metrics", timeout=10).status_code == 200  # inside, still there


def self_signed(folder: Path) -> Path:
    """A certificate for 127.0.0.1 and its key, as nginx/tls.conf expects them; returns the certificate."""
    request = ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"]
    names = ["-subj", "/CN=kokoro-test", "-addext", "subjectAltName=IP:127.0.0.1"]
    files = ["-keyout", str(folder / "privkey.pem"), "-out", str(folder / "fullchain.pem")]
    subprocess.run([*request, *names, *files], check=True, capture_output=True)
    return folder / "fullchain.pem"


def test_tls_at_nginx_serves_speech_over_https(replicas: list[Server], tmp_path: Path) -> None:
    """docker/nginx/tls.conf as docker/compose.tls.yml mounts it, with a self-signed certificate."""
    if shutil.which("nginx") is None:
        pytest.skip("nginx is not installed (scripts/test.sh installs it)")
    render = load_render_nginx()
    certs = tmp_path / "certs"
    certs.mkdir()
    certificate = self_signed(certs)
    port, tls_port = free_port(), free_port()
    folder = tmp_path / "nginx"
    conf = render.write_config(folder, [replicas[0].url.removeprefix("http://")], f"127.0.0.1:{port}")
    tls = (ROOT / "docker" / "nginx" / "tls.conf").read_text()
    assert "listen 8443 ssl;" in tls
    tls = tls.replace("listen 8443 ssl;", f"listen 127.0.0.1:{tls_port} ssl;")
    (folder / render.INCLUDES_NAME / "tls.conf").write_text(tls.replace("/etc/nginx/certs", str(certs)))
    https = httpx.Client(base_url=f"https://127.0.0.1:{tls_port}", verify=str(certificate), timeout=60)
    with serving(spawn(render.nginx_command(conf), folder / "nginx.log", port), timeout_s=20), https:
        body = {"input": TEXT, "voice": "af_heart", "response_format": "pcm"}
        response = https.post("/v1/audio/speech", json=body)
        assert response.status_code == 200
        assert len(response.content) / 48000 > 2.0
        assert https.get("/metrics").status_code == 404


def post_retrying(url: str, **request: Any) -> httpx.Response:
    """POST as a client should: again after Retry-After while the answer is 503 (after the burst above,
    nginx rests the replicas that answered 503 for a while)."""
    for _ in range(10):
        response = httpx.post(url, timeout=60, **request)
        if response.status_code != 503:
            break
        time.sleep(float(response.headers.get("retry-after", "1")))
    return response


def test_books_go_through_nginx_and_any_replica_answers(balancer: str, replicas: list[Server]) -> None:
    # A book file over nginx's 2 MB limit for speech bodies: its own location takes up to 65 MB.
    big = {"file": ("big.txt", b"A word or two. " * 250_000, "text/plain")}
    created = post_retrying(f"{balancer}/v1/audio/jobs", files=big)
    assert created.status_code == 202, created.text
    assert httpx.delete(f"{balancer}/v1/audio/jobs/{created.json()['id']}", timeout=10).status_code == 200
    book = (ROOT / "tests" / "data" / "books" / "alice.md").read_text()
    body = {"input": book, "input_format": "markdown", "response_format": "mp3"}
    job = post_retrying(f"{balancer}/v1/audio/jobs", json=body).json()
    deadline = time.monotonic() + 60
    while (state := httpx.get(f"{balancer}/v1/audio/jobs/{job['id']}", timeout=10).json())["state"] != "done":
        assert state["state"] in ("queued", "running"), state
        assert time.monotonic() < deadline, state
        time.sleep(0.2)
    # The replicas share the data directory: each one answers the job's state and its file.
    for server in replicas:
        assert httpx.get(f"{server.url}/v1/audio/jobs/{job['id']}", timeout=10).json() == state
    part = httpx.get(f"{balancer}{state['audio_url']}", headers={"Range": "bytes=0-1023"}, timeout=30)
    assert part.status_code == 206
    assert part.headers["content-range"] == f"bytes 0-1023/{state['bytes']}"
