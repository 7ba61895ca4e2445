"""Two server processes behind the repo's real nginx config (Debian's nginx, on loopback), flooded with
a bounded burst: every answer is complete, decodable audio or a 503 with Retry-After; nothing hangs."""

from __future__ import annotations

import io
import os
import shutil
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

import av
import httpx
import pytest

from tests.deploy import load_render_nginx
from tests.harness import Server, free_port, running_server, serving, spawn

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
