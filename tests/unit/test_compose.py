"""docker/compose.cpu.yml (and compose.tls.yml over it): valid against the Compose Specification's schema
(vendored, tests/data/schemas/compose-spec.json), safe by default (no start without API keys unless the env
file says so, /metrics not public), a compile-cache volume at the path the server uses, and health windows
longer than the slowest cold start measured. tests/e2e/test_nginx.py runs the nginx side (TLS, /metrics)
for real; no Docker engine runs on the project's machines, so Compose itself has not run."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from dotenv import dotenv_values

from api.server.security import MissingKeysError, required_keys
from api.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
COMPOSE = DOCKER / "compose.cpu.yml"
TLS = DOCKER / "compose.tls.yml"
POSTGRES = DOCKER / "compose.postgres.yml"
WYOMING = DOCKER / "compose.wyoming.yml"
SCHEMA = ROOT / "tests" / "data" / "schemas" / "compose-spec.json"
HOME = Path("/home/kokoro")  # the image user's home (Dockerfile.cpu)
# The slowest first start measured (compiling kernels with an empty cache): a 2-core Cascade Lake (issue 57).
SLOWEST_COLD_START_S = 175
VARIABLE = re.compile(r"\$\{(\w+)(?::([-?])([^}]*))?\}")


def interpolate(text: str, env: dict[str, str]) -> str:
    """Compose's ${VAR}, ${VAR:-default} and ${VAR:?error} substitution."""

    def value(match: re.Match[str]) -> str:
        name, kind, rest = match.groups()
        if env.get(name):
            return env[name]
        if kind == "?":
            raise KeyError(f"{name}: {rest}")
        return rest if kind == "-" else ""

    return VARIABLE.sub(value, text)


def load(path: Path, env: dict[str, str] | None = None) -> dict[str, Any]:
    return yaml.safe_load(interpolate(path.read_text(), env or {}))  # type: ignore[no-any-return]


def seconds(duration: str) -> float:
    units = {"s": 1, "m": 60, "h": 3600}
    return sum(float(n) * units[u] for n, u in re.findall(r"(\d+(?:\.\d+)?)([smh])", duration))


def env_files(service: dict[str, Any]) -> list[dict[str, Any]]:
    return [entry if isinstance(entry, dict) else {"path": entry} for entry in service["env_file"]]


def container_env(service: dict[str, Any], user_file: Path | None) -> dict[str, str]:
    """What a replica's environment gets from its env files (later files win) and `environment`."""
    merged: dict[str, str] = {}
    for entry in env_files(service):
        path = DOCKER / entry["path"]
        if entry["path"] == "kokoro.env":
            if user_file is None:
                assert entry["required"] is False
                continue
            path = user_file
        merged.update({k: v or "" for k, v in dotenv_values(path).items()})
    merged.update({k: str(v) for k, v in service["environment"].items()})
    return merged


def settings_of(env: dict[str, str]) -> Settings:
    return Settings(
        **{k.removeprefix("KOKORO_").lower(): v for k, v in env.items() if k.removeprefix("KOKORO_").lower()
           in Settings.model_fields and k.startswith("KOKORO_")}
    )  # fmt: skip


@pytest.mark.parametrize("files", [(COMPOSE,), (COMPOSE, TLS), (COMPOSE, POSTGRES), (COMPOSE, WYOMING)])
def test_the_compose_files_follow_the_compose_specification(files: tuple[Path, ...]) -> None:
    schema = json.loads(SCHEMA.read_text())
    for path in files:
        jsonschema.validate(
            load(path, {"TLS_CERTS": "/etc/ssl/kokoro", "POSTGRES_PASSWORD": "secret"}), schema
        )


def test_the_wyoming_overlay_turns_it_on_and_publishes_it_on_loopback_by_default() -> None:
    kokoro = load(WYOMING)["services"]["kokoro"]
    settings = settings_of({k: str(v) for k, v in kokoro["environment"].items()})
    assert settings.wyoming
    assert settings.wyoming_host == "0.0.0.0"  # the container's side
    assert settings.wyoming_sample_rate == 24000
    (published,) = kokoro["ports"]
    assert published == "127.0.0.1:10200-10209:10200"  # one port per replica, loopback unless told
    assert load(WYOMING, {"WYOMING_BIND": "192.168.1.20"})["services"]["kokoro"]["ports"][0].startswith(
        "192.168.1.20:"
    )


def test_the_postgresql_overlay_gives_every_replica_the_jobs_database() -> None:
    with pytest.raises(KeyError, match="POSTGRES_PASSWORD"):  # no database without a password
        load(POSTGRES)
    overlay = load(POSTGRES, {"POSTGRES_PASSWORD": "secret"})["services"]
    url = overlay["kokoro"]["environment"]["KOKORO_JOBS_DATABASE"]
    assert url == "postgresql://kokoro:secret@postgres:5432/kokoro"
    assert overlay["kokoro"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    postgres = overlay["postgres"]["environment"]
    assert (postgres["POSTGRES_USER"], postgres["POSTGRES_DB"]) == ("kokoro", "kokoro")
    assert Settings(jobs_database=url).jobs_database == url


def test_validation_catches_a_broken_compose_file() -> None:
    broken = load(COMPOSE)
    broken["services"]["kokoro"]["healthcheck"]["start_perod"] = "600s"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, json.loads(SCHEMA.read_text()))


def test_a_replica_without_keys_refuses_to_start() -> None:
    kokoro = load(COMPOSE)["services"]["kokoro"]
    settings = settings_of(container_env(kokoro, user_file=None))
    assert settings.require_api_keys
    with pytest.raises(MissingKeysError):
        required_keys(settings.api_keys, settings.api_keys_file, settings.require_api_keys)


def test_the_example_env_file_gives_keys_or_an_explicit_open_server(tmp_path: Path) -> None:
    kokoro = load(COMPOSE)["services"]["kokoro"]
    example = (DOCKER / "kokoro.env.example").read_text()
    user = tmp_path / "kokoro.env"
    user.write_text(example)  # copied, not filled in: still refused
    settings = settings_of(container_env(kokoro, user))
    with pytest.raises(MissingKeysError):
        required_keys(settings.api_keys, settings.api_keys_file, settings.require_api_keys)
    user.write_text(example.replace("KOKORO_API_KEYS=\n", "KOKORO_API_KEYS=alice:0123456789abcdef\n"))
    settings = settings_of(container_env(kokoro, user))
    keys = required_keys(settings.api_keys, settings.api_keys_file, settings.require_api_keys)
    assert [key.label for key in keys] == ["alice"]
    user.write_text(example.replace("# KOKORO_REQUIRE_API_KEYS=false", "KOKORO_REQUIRE_API_KEYS=false"))
    settings = settings_of(container_env(kokoro, user))
    assert required_keys(settings.api_keys, settings.api_keys_file, settings.require_api_keys) == []


def test_the_keys_file_stays_out_of_git_and_the_build_context() -> None:
    assert "/docker/kokoro.env" in (ROOT / ".gitignore").read_text().splitlines()
    assert "docker/kokoro.env" in (ROOT / ".dockerignore").read_text().splitlines()


def test_the_compile_cache_is_a_volume_at_the_servers_path() -> None:
    compose = load(COMPOSE)
    mounts = dict(mount.split(":", 1) for mount in compose["services"]["kokoro"]["volumes"])
    default = Settings.model_fields["compile_cache_dir"].default
    assert mounts["compile-cache"] == str(HOME / default.relative_to(Path.home()))
    assert "compile-cache" in compose["volumes"]


def test_uploaded_voices_are_a_volume_the_replicas_share_at_the_servers_path() -> None:
    """One named volume for every replica on the machine: an upload through one replica is served by all."""
    compose = load(COMPOSE)
    service = compose["services"]["kokoro"]
    mounts = dict(mount.split(":", 1) for mount in service["volumes"])
    default = Settings.model_fields["custom_voices_dir"].default
    assert mounts["custom-voices"] == str(HOME / default.relative_to(Path.home()))
    assert "custom-voices" in compose["volumes"]
    assert service["environment"].get("KOKORO_VOICE_UPLOADS", "true") != "false"


def test_health_windows_outlast_the_slowest_cold_start() -> None:
    check = load(COMPOSE)["services"]["kokoro"]["healthcheck"]
    assert seconds(check["start_period"]) >= 2 * SLOWEST_COLD_START_S
    assert "/ready" in " ".join(check["test"])


def test_metrics_stay_inside_and_tls_is_mounted_where_the_template_includes() -> None:
    template = (DOCKER / "nginx" / "kokoro.conf.template").read_text()
    assert re.search(r"location = /metrics \{\s*default_type application/json;\s*return 404", template)
    (include,) = re.findall(r"^\s*include (\S+)/\*\.conf;", template, flags=re.MULTILINE)
    nginx = load(TLS, {"TLS_CERTS": "/etc/ssl/kokoro"})["services"]["nginx"]
    targets = {mount.split(":")[1] for mount in nginx["volumes"]}
    assert f"{include}/tls.conf" in targets
    assert "/etc/nginx/certs" in targets
    assert nginx["ports"] == ["0.0.0.0:443:8443"]
    with pytest.raises(KeyError, match="TLS_CERTS"):
        load(TLS)


def test_the_published_address_can_be_kept_local() -> None:
    (port,) = load(COMPOSE, {"BIND": "127.0.0.1"})["services"]["nginx"]["ports"]
    assert port == "127.0.0.1:8880:8880"
