"""The weights package: layout, atomic writes, the hub source against a fake hub, the CLI, ensure_weights."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch

from api.settings import Settings
from api.weights import ensure_weights
from api.weights.base import SourceUnavailableError, WeightsSource
from api.weights.cli import main
from api.weights.hub import CHECKPOINT_SHA256, REPO_ID, REVISION, HubSource
from api.weights.layout import (
    CHECKPOINT_FILE,
    CONFIG_FILE,
    OFFICIAL_VOICES,
    VOICE_PACK_SHAPE,
    ConfigMismatchError,
    HashMismatchError,
    WeightsLayout,
    atomic_write,
    check_voice_pack,
    sha256_file,
    shipped_config,
)
from api.weights.sources import get_source

pytestmark = pytest.mark.unit

VOICES = ("af_heart", "am_adam", "bf_emma")
FAKE_CHECKPOINT = b"not really a checkpoint, but bytes with a known sha256"


class FakeHub:
    """Serves a repository from a local directory; publishes the hashes the files had when built."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.downloads: list[str] = []
        self.published = {
            path.relative_to(root).as_posix(): None if path.name == CONFIG_FILE else sha256_file(path)
            for path in root.rglob("*")
            if path.is_file()
        }

    def list_files(self, repo_id: str, *, revision: str) -> dict[str, str | None]:
        assert (repo_id, revision) == (REPO_ID, REVISION)
        return dict(self.published)

    def download(
        self, repo_id: str, filename: str, *, revision: str, local_dir: Path, progress: bool
    ) -> Path:
        assert (repo_id, revision) == (REPO_ID, REVISION)
        self.downloads.append(filename)
        target = local_dir / filename
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(self.root / filename, target)
        return target

    def serve(self, filename: str, content: bytes) -> str:
        """Change what is served (not what is published); return the new content's sha256."""
        (self.root / filename).write_bytes(content)
        return sha256_file(self.root / filename)

    def sha(self, filename: str) -> str:
        """The sha256 published for an LFS file."""
        published = self.published[filename]
        assert published is not None
        return published

    def source(self, checkpoint_sha256: str | None = None) -> HubSource:
        pinned = checkpoint_sha256 or self.sha(CHECKPOINT_FILE)
        return HubSource(checkpoint_sha256=pinned, list_files=self.list_files, download=self.download)


def _save_voice(path: Path, tensor: torch.Tensor) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(tensor, path)


def _write_repo(root: Path, config: dict[str, object] | None = None) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / CONFIG_FILE).write_text(json.dumps(config or shipped_config()), encoding="utf-8")
    (root / CHECKPOINT_FILE).write_bytes(FAKE_CHECKPOINT)
    generator = torch.Generator().manual_seed(0)
    for name in VOICES:
        _save_voice(root / "voices" / f"{name}.pt", torch.randn(VOICE_PACK_SHAPE, generator=generator))
    return root


def _stray_files(dest: Path) -> list[Path]:
    """Temporary files or staging directories left anywhere under dest."""
    return [path for path in dest.rglob("*") if path.name.startswith(".") or path.suffix == ".tmp"]


@pytest.fixture
def hub(tmp_path: Path) -> FakeHub:
    return FakeHub(_write_repo(tmp_path / "repo"))


@pytest.fixture
def dest(tmp_path: Path) -> Path:
    return tmp_path / "weights"


class RecordingFactory:
    """A source factory for the CLI and ensure_weights that records which sources were asked for."""

    def __init__(self, source: WeightsSource) -> None:
        self.source = source
        self.names: list[str] = []

    def __call__(self, name: str) -> WeightsSource:
        self.names.append(name)
        return self.source


class FailingSource:
    name = "failing"

    def __init__(self, error: Exception) -> None:
        self.error = error

    def fetch(self, dest: Path, *, progress: bool = True) -> None:
        raise self.error


# --- layout -------------------------------------------------------------------------------------------


def test_official_voices_are_54_unique_names() -> None:
    assert len(OFFICIAL_VOICES) == 54
    assert len(set(OFFICIAL_VOICES)) == 54
    assert all(re.fullmatch(r"[abefhijpz][fm]_[a-z]+", name) for name in OFFICIAL_VOICES)
    assert {"af_heart", "am_adam", "bf_emma", "zm_yunyang"} <= set(OFFICIAL_VOICES)


def test_voice_names_lists_sorted_stems_of_pt_files(tmp_path: Path) -> None:
    layout = WeightsLayout(tmp_path)
    assert layout.voice_names() == []
    for name in ("zf_xiaobei", "af_heart"):
        _save_voice(layout.voice_path(name), torch.zeros(VOICE_PACK_SHAPE))
    (layout.voices_dir / "README.txt").write_text("not a voice")
    assert layout.voice_names() == ["af_heart", "zf_xiaobei"]
    assert layout.voice_path("af_heart") == tmp_path / "voices" / "af_heart.pt"


def test_is_complete_needs_config_checkpoint_and_a_voice(tmp_path: Path) -> None:
    layout = WeightsLayout(tmp_path)
    assert set(layout.missing()) == {CONFIG_FILE, CHECKPOINT_FILE, "voices/*.pt (no voice packs)"}
    layout.config_path.write_text("{}")
    layout.checkpoint_path.write_bytes(b"x")
    assert not layout.is_complete()
    _save_voice(layout.voice_path("af_heart"), torch.zeros(VOICE_PACK_SHAPE))
    assert layout.is_complete()
    assert layout.missing() == []


def test_sha256_file_matches_hashlib_over_several_chunks(tmp_path: Path) -> None:
    import hashlib

    data = bytes(range(256)) * 10_000  # 2.5 MB: several read chunks
    (tmp_path / "blob").write_bytes(data)
    assert sha256_file(tmp_path / "blob") == hashlib.sha256(data).hexdigest()


def _write_then_fail(target: Path, data: bytes, error: Exception, seen: list[Path]) -> None:
    with atomic_write(target) as tmp:
        seen.append(tmp)
        tmp.write_bytes(data)
        raise error


def test_atomic_write_leaves_nothing_on_an_exception(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "file.bin"
    seen: list[Path] = []
    with pytest.raises(RuntimeError, match="boom"):
        _write_then_fail(target, b"half written", RuntimeError("boom"), seen)
    assert seen[0].parent == target.parent  # same directory, so the final rename is atomic
    assert not target.exists()
    assert list(target.parent.iterdir()) == []


def test_atomic_write_keeps_the_old_file_on_failure_and_replaces_it_on_success(tmp_path: Path) -> None:
    target = tmp_path / "file.bin"
    target.write_bytes(b"old")
    with pytest.raises(ValueError, match="rejected"):
        _write_then_fail(target, b"new but bad", ValueError("rejected"), [])
    assert target.read_bytes() == b"old"
    with atomic_write(target) as tmp:
        tmp.write_bytes(b"new")
    assert target.read_bytes() == b"new"
    assert [path.name for path in tmp_path.iterdir()] == ["file.bin"]


def test_hash_mismatch_error_names_file_expected_and_actual() -> None:
    error = HashMismatchError("voices/af_heart.pt", "a" * 64, "b" * 64)
    assert "voices/af_heart.pt" in str(error)
    assert "a" * 64 in str(error)
    assert "b" * 64 in str(error)


@pytest.mark.parametrize(
    ("tensor", "message"),
    [
        (torch.zeros(510, 256), "shape"),
        (torch.zeros(509, 1, 256), "shape"),
        (torch.zeros(VOICE_PACK_SHAPE, dtype=torch.float64), "dtype"),
        (torch.full(VOICE_PACK_SHAPE, float("nan")), "NaN"),
        ({"af_heart": torch.zeros(VOICE_PACK_SHAPE)}, "expected a tensor"),
    ],
)
def test_check_voice_pack_rejects_bad_packs(tensor: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_voice_pack(tensor, "af_heart")


def test_check_voice_pack_accepts_a_good_pack() -> None:
    pack = torch.zeros(VOICE_PACK_SHAPE)
    assert check_voice_pack(pack, "af_heart") is pack


# --- hub source against a fake hub ------------------------------------------------------------------


def test_fetch_writes_the_complete_layout(hub: FakeHub, dest: Path) -> None:
    hub.source().fetch(dest, progress=False)
    layout = WeightsLayout(dest)
    assert layout.is_complete()
    assert layout.voice_names() == sorted(VOICES)
    assert layout.checkpoint_path.read_bytes() == FAKE_CHECKPOINT
    assert json.loads(layout.config_path.read_text()) == shipped_config()
    for name in VOICES:
        assert torch.equal(
            torch.load(layout.voice_path(name)), torch.load(hub.root / "voices" / f"{name}.pt")
        )
    assert _stray_files(dest) == []


def test_fetch_logs_one_line_per_voice(hub: FakeHub, dest: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="api.weights.hub")
    hub.source().fetch(dest, progress=False)
    assert "voices 1/3: af_heart" in caplog.messages
    assert "voices 3/3: bf_emma" in caplog.messages


def test_tampered_voice_is_rejected_and_left_out(hub: FakeHub, dest: Path) -> None:
    published = hub.sha("voices/am_adam.pt")
    tampered = torch.load(hub.root / "voices" / "am_adam.pt")
    tampered[0, 0, 0] += 1.0
    _save_voice(hub.root / "tampered.pt", tampered)
    actual = hub.serve("voices/am_adam.pt", (hub.root / "tampered.pt").read_bytes())

    with pytest.raises(HashMismatchError) as caught:
        hub.source().fetch(dest, progress=False)

    assert (caught.value.expected, caught.value.actual) == (published, actual)
    assert published in str(caught.value)
    assert actual in str(caught.value)
    assert "am_adam.pt" in str(caught.value)
    assert not (dest / "voices" / "am_adam.pt").exists()
    assert (dest / "voices" / "af_heart.pt").exists()  # verified before the failure, kept
    assert _stray_files(dest) == []


@pytest.mark.parametrize("pinned", ["injected", "official"])
def test_tampered_checkpoint_is_rejected_and_left_out(hub: FakeHub, dest: Path, pinned: str) -> None:
    # "official": the fake bytes are checked against the real pinned hash, which they cannot match.
    expected = hub.sha(CHECKPOINT_FILE) if pinned == "injected" else CHECKPOINT_SHA256
    actual = hub.serve(CHECKPOINT_FILE, FAKE_CHECKPOINT + b" tampered") if pinned == "injected" else None
    source = hub.source(checkpoint_sha256=expected)

    with pytest.raises(HashMismatchError) as caught:
        source.fetch(dest, progress=False)

    assert caught.value.expected == expected
    assert caught.value.actual == (actual or sha256_file(hub.root / CHECKPOINT_FILE))
    assert CHECKPOINT_FILE in str(caught.value)
    assert not (dest / CHECKPOINT_FILE).exists()
    assert not (dest / "voices").exists()
    assert _stray_files(dest) == []


def test_voice_of_the_wrong_shape_is_rejected_even_with_a_matching_hash(tmp_path: Path, dest: Path) -> None:
    root = _write_repo(tmp_path / "repo")
    _save_voice(root / "voices" / "bf_emma.pt", torch.zeros(510, 256))
    hub = FakeHub(root)  # publishes the hash of the wrong-shaped pack

    with pytest.raises(ValueError, match=r"bf_emma.*shape"):
        hub.source().fetch(dest, progress=False)
    assert not (dest / "voices" / "bf_emma.pt").exists()
    assert _stray_files(dest) == []


def test_config_that_differs_from_the_shipped_one_is_rejected(tmp_path: Path, dest: Path) -> None:
    config = shipped_config()
    config["n_token"] = 179
    hub = FakeHub(_write_repo(tmp_path / "repo", config))

    with pytest.raises(ConfigMismatchError, match="n_token"):
        hub.source().fetch(dest, progress=False)
    assert not (dest / CONFIG_FILE).exists()
    assert _stray_files(dest) == []


def test_config_differing_only_in_informational_keys_is_accepted(tmp_path: Path, dest: Path) -> None:
    config = shipped_config()
    config["multispeaker"] = False
    FakeHub(_write_repo(tmp_path / "repo", config)).source().fetch(dest, progress=False)
    assert WeightsLayout(dest).is_complete()


def test_config_that_is_not_json_is_rejected(hub: FakeHub, dest: Path) -> None:
    hub.serve(CONFIG_FILE, b"<html>rate limited</html>")
    with pytest.raises(ValueError, match="Expecting value"):
        hub.source().fetch(dest, progress=False)
    assert not (dest / CONFIG_FILE).exists()


def test_a_second_fetch_keeps_verified_files_and_replaces_corrupt_ones(hub: FakeHub, dest: Path) -> None:
    hub.source().fetch(dest, progress=False)
    (dest / "voices" / "am_adam.pt").write_bytes(b"corrupted on disk")
    hub.downloads.clear()

    hub.source().fetch(dest, progress=False)

    assert hub.downloads == [CONFIG_FILE, "voices/am_adam.pt"]
    assert sha256_file(dest / "voices" / "am_adam.pt") == hub.sha("voices/am_adam.pt")


def test_unreachable_hub_raises_source_unavailable(hub: FakeHub, dest: Path) -> None:
    def offline(repo_id: str, *, revision: str) -> dict[str, str | None]:
        raise ConnectionError("Name or service not known")

    source = HubSource(list_files=offline, download=hub.download)
    with pytest.raises(SourceUnavailableError, match="hub could not be reached"):
        source.fetch(dest, progress=False)


def test_default_hub_client_fails_cleanly_in_offline_mode(dest: Path) -> None:
    from huggingface_hub import constants

    if not constants.HF_HUB_OFFLINE:
        pytest.skip("needs HF_HUB_OFFLINE=1 so that nothing reaches the network")
    with pytest.raises(SourceUnavailableError, match="hub could not be reached"):
        HubSource().fetch(dest, progress=False)
    assert not (dest / CONFIG_FILE).exists()


def test_get_source_knows_hub_and_rejects_unknown_names() -> None:
    source = get_source("hub")
    assert isinstance(source, HubSource)
    assert source.name == "hub"
    assert (source.repo_id, source.revision, source.checkpoint_sha256) == (
        REPO_ID,
        REVISION,
        CHECKPOINT_SHA256,
    )
    with pytest.raises(ValueError, match="unknown weights source 'pypi'"):
        get_source("pypi")


# --- CLI --------------------------------------------------------------------------------------------


def test_cli_fetch_writes_the_layout_and_says_where(
    hub: FakeHub, dest: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    factory = RecordingFactory(hub.source())
    assert main(["fetch", "--source", "hub", "--dir", str(dest)], source_factory=factory) == 0
    assert factory.names == ["hub"]
    assert WeightsLayout(dest).is_complete()
    assert str(dest) in capsys.readouterr().out


def test_cli_fetch_skips_a_complete_layout_unless_forced(
    hub: FakeHub, dest: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hub.source().fetch(dest, progress=False)
    factory = RecordingFactory(FailingSource(AssertionError("must not be fetched")))

    assert main(["fetch", "--dir", str(dest)], source_factory=factory) == 0
    assert factory.names == []
    assert "already complete" in capsys.readouterr().out

    factory.source = hub.source()
    assert main(["fetch", "--dir", str(dest), "--force"], source_factory=factory) == 0
    assert factory.names == ["auto"]  # the setting's default, resolved by get_source


def test_cli_fetch_reports_a_hash_mismatch_in_one_line(
    hub: FakeHub, dest: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hub.serve(CHECKPOINT_FILE, b"tampered")
    factory = RecordingFactory(hub.source())

    assert main(["fetch", "--dir", str(dest)], source_factory=factory) == 1

    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ")
    assert "sha256 mismatch" in err
    assert hub.sha(CHECKPOINT_FILE) in err
    assert "\n" not in err


def test_cli_fetch_points_at_kokoro_weights_dir_when_the_hub_is_unreachable(
    dest: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    factory = RecordingFactory(
        FailingSource(SourceUnavailableError("the Hugging Face hub could not be reached"))
    )
    assert main(["fetch", "--dir", str(dest)], source_factory=factory) == 1
    err = capsys.readouterr().err
    assert "could not be reached" in err
    assert "KOKORO_WEIGHTS_DIR" in err


def test_cli_fetch_defaults_to_the_settings_directory(
    hub: FakeHub, dest: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KOKORO_WEIGHTS_DIR", str(dest))
    assert main(["fetch"], source_factory=RecordingFactory(hub.source())) == 0
    assert WeightsLayout(dest).is_complete()


def test_cli_verify_accepts_a_good_layout_and_names_the_checkpoint(
    hub: FakeHub, dest: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hub.source().fetch(dest, progress=False)
    assert main(["verify", "--dir", str(dest)]) == 0
    out = capsys.readouterr().out
    assert "not the official Kokoro-82M v1.0 checkpoint" in out
    assert "3 of 3 usable" in out


def test_cli_verify_fails_on_a_broken_voice_and_on_an_incomplete_layout(
    hub: FakeHub, dest: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hub.source().fetch(dest, progress=False)
    _save_voice(dest / "voices" / "am_adam.pt", torch.zeros(2, 2))
    assert main(["verify", "--dir", str(dest)]) == 1
    assert "am_adam" in capsys.readouterr().err

    (dest / CHECKPOINT_FILE).unlink()
    assert main(["verify", "--dir", str(dest)]) == 1
    assert CHECKPOINT_FILE in capsys.readouterr().err


# --- ensure_weights ---------------------------------------------------------------------------------


def test_ensure_weights_returns_a_complete_layout_without_fetching(hub: FakeHub, dest: Path) -> None:
    hub.source().fetch(dest, progress=False)
    factory = RecordingFactory(FailingSource(AssertionError("must not be fetched")))
    layout = ensure_weights(Settings(weights_dir=dest, fetch_weights=False), source_factory=factory)
    assert layout == WeightsLayout(dest)
    assert factory.names == []


def test_ensure_weights_fetches_missing_weights_when_allowed(hub: FakeHub, dest: Path) -> None:
    factory = RecordingFactory(hub.source())
    settings = Settings(weights_dir=dest, fetch_weights=True, weights_source="hub")
    layout = ensure_weights(settings, source_factory=factory)
    assert factory.names == ["hub"]
    assert layout.is_complete()


def test_ensure_weights_lists_what_is_missing_when_fetching_is_off(dest: Path) -> None:
    factory = RecordingFactory(FailingSource(AssertionError("must not be fetched")))
    with pytest.raises(FileNotFoundError, match=r"config\.json.*kokoro-v1_0\.pth.*voices"):
        ensure_weights(Settings(weights_dir=dest, fetch_weights=False), source_factory=factory)
    assert factory.names == []
