"""modal_app.py: imports offline, its settings hang together, and its readiness wait works."""

from __future__ import annotations

import inspect
import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import modal
import pytest
from packaging.version import Version

import modal_app
from api.settings import Settings

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]

# Imports modal_app in a fresh interpreter where opening any network connection raises, without
# Modal credentials, and prints its settings.
OFFLINE_IMPORT = """
import json, socket
def refuse(*args, **kwargs):
    raise OSError("network access during import")
socket.socket.connect = refuse
socket.create_connection = refuse
import modal_app
from api.settings import Settings
names = ["GPU", "WORKERS", "MAX_INPUTS", "MIN_CONTAINERS", "MAX_CONTAINERS", "SCALEDOWN_WINDOW_S"]
print(json.dumps({name: getattr(modal_app, name) for name in names} | {"app": modal_app.app.name}))
"""


def test_imports_offline_without_a_token(tmp_path: Path) -> None:
    env = {key: value for key, value in os.environ.items() if not key.startswith("MODAL_")}
    env.update(HOME=str(tmp_path), MODAL_CONFIG_PATH=str(tmp_path / "absent.toml"))
    result = subprocess.run(
        [sys.executable, "-c", OFFLINE_IMPORT],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    settings = json.loads(result.stdout.splitlines()[-1])
    assert settings == {
        "GPU": "H100",
        "WORKERS": modal_app.WORKERS,
        "MAX_INPUTS": modal_app.MAX_INPUTS,
        "MIN_CONTAINERS": modal_app.MIN_CONTAINERS,
        "MAX_CONTAINERS": modal_app.MAX_CONTAINERS,
        "SCALEDOWN_WINDOW_S": modal_app.SCALEDOWN_WINDOW_S,
        "app": modal_app.APP_NAME,
    }


def test_the_app_serves_one_web_function() -> None:
    assert isinstance(modal_app.app, modal.App)
    assert modal_app.app.name == "kokoro-tts"
    assert isinstance(modal_app.serve, modal.Function)
    assert modal_app.serve.app is modal_app.app


def test_runs_on_one_h100_with_several_workers() -> None:
    assert modal_app.GPU == "H100"
    assert modal_app.WORKERS >= 2
    assert modal_app.CPU >= 2 * modal_app.WORKERS  # G2P and encoding run on the CPU, per worker
    assert modal_app.MEMORY_MIB >= 2560 * modal_app.WORKERS
    assert modal_app.PORT == 8880


def test_concurrency_limits_fit_together() -> None:
    # Each worker interleaves several streams; Modal never sends a container more than its workers
    # can hold, and starts scaling out before a container is full.
    assert modal_app.MAX_INPUTS == modal_app.WORKERS * modal_app.INPUTS_PER_WORKER
    assert modal_app.INPUTS_PER_WORKER >= 2
    assert 1 <= modal_app.TARGET_INPUTS < modal_app.MAX_INPUTS
    # Workers accept unevenly: each can hold twice its share (in synthesis + waiting), and uvicorn's
    # cap sits above that, so a full worker answers admission's 503 with Retry-After, not uvicorn's.
    assert modal_app.MAX_WAITING >= modal_app.INPUTS_PER_WORKER
    assert modal_app.LIMIT_CONCURRENCY > modal_app.INPUTS_PER_WORKER + modal_app.MAX_WAITING


def test_server_gets_the_admission_limits_that_match_modals_routing() -> None:
    env = modal_app.server_env()
    assert int(env["KOKORO_MAX_INFLIGHT"]) * modal_app.WORKERS == modal_app.MAX_INPUTS
    assert int(env["KOKORO_MAX_WAITING"]) == modal_app.MAX_WAITING
    # The longest input's audio (15 characters a second at speed 1.0) streams out within a request's limit.
    assert int(env["KOKORO_MAX_INPUT_CHARS"]) / 15 < modal_app.TIMEOUT_S / 2
    assert env["PATH"] == os.environ["PATH"]  # the image's environment is kept
    assert {"max_inflight", "max_waiting"} <= set(Settings.model_fields)


def test_scaling_and_time_limits_are_sane() -> None:
    assert 0 <= modal_app.MIN_CONTAINERS <= modal_app.MAX_CONTAINERS
    assert 1 <= modal_app.MAX_CONTAINERS <= 16
    assert 60 <= modal_app.SCALEDOWN_WINDOW_S <= 1200  # Modal allows at most 20 minutes
    assert 300 <= modal_app.TIMEOUT_S <= 24 * 3600
    assert 60 <= modal_app.STARTUP_TIMEOUT_S <= modal_app.TIMEOUT_S


def test_image_comes_from_the_gpu_dockerfile_with_baked_weights() -> None:
    assert modal_app.DOCKERFILE == ROOT / "Dockerfile.gpu"
    assert "ARG WEIGHTS_SOURCE=" in modal_app.DOCKERFILE.read_text()
    assert modal_app.WEIGHTS_SOURCE in ("hub", "registry")


def test_server_command_is_the_images_command_with_workers_and_limit() -> None:
    assert modal_app.server_command() == [
        "python", "-m", "api", "--host", "0.0.0.0", "--port", "8880",
        "--workers", str(modal_app.WORKERS), "--limit-concurrency", str(modal_app.LIMIT_CONCURRENCY),
    ]  # fmt: skip


class FakeProcess:
    def __init__(self, returncode: int | None = None) -> None:
        self.returncode = returncode

    def poll(self) -> int | None:
        return self.returncode


@pytest.fixture
def ready_server() -> Iterator[tuple[str, list[int]]]:
    """/ready answers the statuses in the returned list, in order, then 200; answered ones are removed."""
    statuses: list[int] = []
    answered: list[int] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            status = statuses.pop(0) if statuses else 200
            answered.append(status)
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    statuses.extend([503, 503, 200, 503, 200])
    yield f"http://127.0.0.1:{server.server_address[1]}/ready", answered
    server.shutdown()
    server.server_close()


def test_wait_until_ready_needs_successes_in_a_row(ready_server: tuple[str, list[int]]) -> None:
    url, answered = ready_server
    modal_app.wait_until_ready(FakeProcess(), url, timeout_s=10, in_a_row=3, poll_s=0.01)
    assert answered == [503, 503, 200, 503, 200, 200, 200]


def test_wait_until_ready_fails_when_the_server_exits(ready_server: tuple[str, list[int]]) -> None:
    url, _ = ready_server
    with pytest.raises(RuntimeError, match="exited with status 1"):
        modal_app.wait_until_ready(FakeProcess(1), url, timeout_s=10, in_a_row=3, poll_s=0.01)


def test_wait_until_ready_gives_up_after_its_timeout() -> None:
    with pytest.raises(TimeoutError, match="not ready"):
        modal_app.wait_until_ready(
            FakeProcess(), "http://127.0.0.1:9/ready", timeout_s=0.2, in_a_row=1, poll_s=0.05
        )


def test_api_keys_come_from_a_secret_and_metrics_need_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """The endpoint is public: the Secret's KOKORO_API_KEYS is the server's api_keys setting, and the
    environment the server gets puts /metrics behind a key and the compile cache on the Volume."""
    assert modal_app.SECRET_KEY == "KOKORO_API_KEYS"
    monkeypatch.setenv(modal_app.SECRET_KEY, "ops:secret-key")
    for name, value in modal_app.server_env().items():
        monkeypatch.setenv(name, value)
    settings = Settings()
    assert settings.api_keys == "ops:secret-key"
    assert settings.metrics_require_key is True
    assert settings.compile_cache_dir == Path(modal_app.COMPILE_CACHE_DIR)
    assert modal_app.COMPILE_CACHE_DIR.startswith(modal_app.CACHE_MOUNT + "/")


def test_the_installed_modal_takes_every_argument_used() -> None:
    """pyproject.toml's pin of modal is a release that has these (checked against it)."""
    function = set(inspect.signature(modal.App.function).parameters)
    assert {"gpu", "cpu", "memory", "min_containers", "max_containers", "scaledown_window"} <= function
    assert {"timeout", "startup_timeout", "secrets", "volumes"} <= function
    assert "startup_timeout" in inspect.signature(modal.web_server).parameters
    assert {"max_inputs", "target_inputs"} <= set(inspect.signature(modal.concurrent).parameters)
    assert "required_keys" in inspect.signature(modal.Secret.from_name).parameters
    assert "create_if_missing" in inspect.signature(modal.Volume.from_name).parameters
    pin = re.search(r'"modal==([\d.]+)"', (ROOT / "pyproject.toml").read_text())
    assert pin is not None
    assert Version(pin.group(1)) == Version(modal.__version__)


def test_deploy_docs_say_how_to_create_the_secret_and_the_response_start_limit() -> None:
    docs = (ROOT / "docs" / "deploy.md").read_text()
    assert f"modal secret create {modal_app.SECRET_NAME} {modal_app.SECRET_KEY}=" in docs
    assert f"{modal_app.RESPONSE_START_LIMIT_S} s" in docs
    assert "stream: false" in docs
    assert modal_app.CACHE_VOLUME in docs
    # modal 1.6's CLI: `volume rm` takes a path inside the volume, `volume delete` removes the volume.
    assert f"modal volume rm -r {modal_app.CACHE_VOLUME} /compile" in docs
    assert f"{modal_app.CACHE_MOUNT}/compile" == modal_app.COMPILE_CACHE_DIR
    assert f"modal volume delete {modal_app.CACHE_VOLUME}" in docs


def test_the_docs_install_the_pinned_modal() -> None:
    pins = re.findall(r'"modal==([\d.]+)"', (ROOT / "pyproject.toml").read_text())
    assert pins == [modal.__version__]
    assert f"pip install modal=={pins[0]}" in (ROOT / "docs" / "deploy.md").read_text()


def test_uploads_are_off_without_a_voices_volume_and_go_to_it_with_one() -> None:
    """A container's own disk goes when it scales down, and no other container sees it: uploads only onto
    a Volume named at deploy time (docs/voices.md#where-they-live)."""
    assert modal_app.voice_env(None) == {"KOKORO_VOICE_UPLOADS": "false"}
    on = modal_app.voice_env("kokoro-voices")
    assert on == {"KOKORO_VOICE_UPLOADS": "true", "KOKORO_CUSTOM_VOICES_DIR": modal_app.VOICES_MOUNT}
    assert set(on) <= {f"KOKORO_{name.upper()}" for name in Settings.model_fields}
    if modal_app.VOICES_VOLUME is None:
        assert modal_app.VOICES_MOUNT not in modal_app.VOLUMES
        assert modal_app.server_env()["KOKORO_VOICE_UPLOADS"] == "false"
