"""The Hugging Face hub source: hexgrad/Kokoro-82M at a pinned revision, every file verified."""

from __future__ import annotations

import contextlib
import errno
import importlib
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path, PurePosixPath
from typing import Protocol, TypeVar

from api.weights.base import SourceUnavailableError
from api.weights.layout import (
    CHECKPOINT_FILE,
    CONFIG_FILE,
    VOICE_SUFFIX,
    VOICES_DIR,
    atomic_write,
    check_config,
    load_config,
    load_voice_pack,
    sha256_file,
    verify_sha256,
)

logger = logging.getLogger(__name__)

REPO_ID = "hexgrad/Kokoro-82M"
REVISION = "f3ff3571791e39611d31c381e3a41a3af07b4987"
CHECKPOINT_SHA256 = "496dba118d1a58f5f3db2efc88dbdc216e0483fc89fe6e47ee1f2c53f18ad1e4"

# Repository path -> the sha256 the hub publishes for it (LFS files), or None (files kept in git).
FileIndex = Mapping[str, str | None]

T = TypeVar("T")

# The HTTP client differs between huggingface_hub versions (requests, httpx, httpx2).
_HTTP_CLIENT_ERRORS = (
    ("httpx2", "TransportError"),
    ("httpx", "TransportError"),
    ("requests", "RequestException"),
)


class ListFiles(Protocol):
    def __call__(self, repo_id: str, *, revision: str) -> FileIndex: ...


class Download(Protocol):
    def __call__(
        self, repo_id: str, filename: str, *, revision: str, local_dir: Path, progress: bool
    ) -> Path: ...


def hub_file_index(repo_id: str, *, revision: str) -> dict[str, str | None]:
    """Every file of the repository at `revision`, with the LFS sha256 the hub reports for it."""
    from huggingface_hub import HfApi

    info = HfApi().model_info(repo_id, revision=revision, files_metadata=True)
    return {sibling.rfilename: sibling.lfs.sha256 if sibling.lfs else None for sibling in info.siblings or []}


def hub_download(repo_id: str, filename: str, *, revision: str, local_dir: Path, progress: bool) -> Path:
    """Download one file into `local_dir` with huggingface_hub (its tqdm bar shows unless progress=False)."""
    from huggingface_hub import hf_hub_download

    with _progress_bars(progress):
        return Path(hf_hub_download(repo_id, filename, revision=revision, local_dir=local_dir))


@contextlib.contextmanager
def _progress_bars(enabled: bool) -> Iterator[None]:
    from huggingface_hub.utils.tqdm import (
        are_progress_bars_disabled,
        disable_progress_bars,
        enable_progress_bars,
    )

    if enabled or are_progress_bars_disabled():
        yield
        return
    disable_progress_bars()
    try:
        yield
    finally:
        enable_progress_bars()


def _network_errors() -> tuple[type[BaseException], ...]:
    """The exceptions that mean "the hub could not be reached or refused", across huggingface_hub versions."""
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    errors: list[type[BaseException]] = [ConnectionError, TimeoutError, HfHubHTTPError]
    errors.append(LocalEntryNotFoundError)  # raised instead of a download in offline mode
    for module, name in _HTTP_CLIENT_ERRORS:
        with contextlib.suppress(ImportError):
            errors.append(getattr(importlib.import_module(module), name))
    return tuple(errors)


def voice_files(index: FileIndex) -> list[str]:
    """The voice packs in a repository listing, sorted: voices/NAME.pt."""
    return sorted(
        path
        for path in index
        if PurePosixPath(path).parent == PurePosixPath(VOICES_DIR) and path.endswith(VOICE_SUFFIX)
    )


def _take(staged: Path, tmp: Path) -> None:
    """Move a staged download onto `tmp`; copy when it is a link or lies on another file system."""
    if staged.is_symlink():
        shutil.copyfile(staged, tmp)
        return
    try:
        os.replace(staged, tmp)
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
        shutil.copyfile(staged, tmp)


def _is_current(target: Path, sha256: str | None) -> bool:
    return sha256 is not None and target.is_file() and sha256_file(target) == sha256.lower()


class HubSource:
    """Fetches config.json, the checkpoint and every voice pack of REPO_ID at REVISION into a directory.

    Files are downloaded into a staging directory inside the destination, verified (checkpoint against
    the pinned sha256, voice packs against the sha256 the hub publishes at the pinned revision and
    against the voice-pack shape, config.json against the shipped Kokoro-82M config) and only then moved
    into place atomically. Files already in place with the expected hash are kept. The hub calls are
    injectable so tests never touch the network.
    """

    name: str = "hub"

    def __init__(
        self,
        *,
        repo_id: str = REPO_ID,
        revision: str = REVISION,
        checkpoint_sha256: str = CHECKPOINT_SHA256,
        list_files: ListFiles = hub_file_index,
        download: Download = hub_download,
    ) -> None:
        self.repo_id = repo_id
        self.revision = revision
        self.checkpoint_sha256 = checkpoint_sha256.lower()
        self._list_files = list_files
        self._download = download

    def fetch(self, dest: Path, *, progress: bool = True) -> None:
        index = self._reach("listing files", lambda: self._list_files(self.repo_id, revision=self.revision))
        voices = self._required_files(index)
        dest.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=".staging-", dir=dest) as staging:
            for repo_path in (CONFIG_FILE, CHECKPOINT_FILE):
                logger.info("%s", repo_path)
                self._install(repo_path, index.get(repo_path), dest, Path(staging), progress)
            for number, repo_path in enumerate(voices, 1):
                logger.info("voices %d/%d: %s", number, len(voices), PurePosixPath(repo_path).stem)
                self._install(repo_path, index.get(repo_path), dest, Path(staging), progress)
        logger.info("fetched %s@%s into %s (%d voices)", self.repo_id, self.revision[:7], dest, len(voices))

    def _required_files(self, index: FileIndex) -> list[str]:
        voices = voice_files(index)
        missing = [path for path in (CONFIG_FILE, CHECKPOINT_FILE) if path not in index]
        if not voices:
            missing.append(f"{VOICES_DIR}/*{VOICE_SUFFIX}")
        if missing:
            raise ValueError(f"{self.repo_id}@{self.revision} lacks {', '.join(missing)}")
        return voices

    def _install(
        self, repo_path: str, published_sha256: str | None, dest: Path, staging: Path, progress: bool
    ) -> None:
        target = dest / repo_path
        expected = self.checkpoint_sha256 if repo_path == CHECKPOINT_FILE else published_sha256
        if _is_current(target, expected):
            logger.info("%s already in place and verified", repo_path)
            return
        staged = self._reach(
            f"downloading {repo_path}",
            lambda: self._download(
                self.repo_id, repo_path, revision=self.revision, local_dir=staging, progress=progress
            ),
        )
        with atomic_write(target) as tmp:
            _take(staged, tmp)
            self._verify(repo_path, tmp, expected, shown_as=target)

    def _verify(self, repo_path: str, path: Path, expected: str | None, *, shown_as: Path) -> None:
        if repo_path == CONFIG_FILE:
            check_config(load_config(path), name=str(shown_as))
            return
        if expected is None:
            raise ValueError(f"{repo_path}: the hub publishes no sha256 for it at {self.revision}")
        verify_sha256(path, expected, name=shown_as)
        if repo_path != CHECKPOINT_FILE:
            load_voice_pack(path, PurePosixPath(repo_path).stem)

    def _reach(self, what: str, call: Callable[[], T]) -> T:
        try:
            return call()
        except _network_errors() as exc:
            raise SourceUnavailableError(
                f"the Hugging Face hub could not be reached ({what} of {self.repo_id}@{self.revision[:7]}): "
                f"{type(exc).__name__}: {exc}"
            ) from exc
