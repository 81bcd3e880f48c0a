"""The per-user cache directory of image builds; a lock that makes concurrent builds of the
same image on this host (two test runs, a CLI and a server) wait for one another instead of
building it twice; and downloads into the cache that a concurrent build sees whole or not at
all (``cached_files``, ``fill_cache``)."""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import os
import shutil
import sys
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import anyio

from orchestrator.errors import ImageError, ImageToolMissingError
from orchestrator.images.progress import BuildProgress

# How often a waiting build looks whether the other one finished; a build takes seconds to minutes.
LOCK_POLL_INTERVAL = 0.5


def cache_dir() -> Path:
    """``$XDG_CACHE_HOME/sandhold``, else ``~/.cache/sandhold``."""
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "sandhold"


@contextlib.asynccontextmanager
async def build_lock(name: str, *, timeout: float, progress: BuildProgress) -> AsyncIterator[None]:
    """Hold the host-wide lock ``name`` (an advisory flock, released by the kernel if the holder
    dies), waiting at most ``timeout`` seconds for another holder."""
    path = cache_dir() / "locks" / f"{name}.lock"
    fd = await anyio.to_thread.run_sync(_open, path)
    try:
        try:
            with anyio.fail_after(timeout):
                await _acquire(fd, name, progress)
        except TimeoutError:
            raise ImageError(
                f"another build held the lock {path} for over {timeout:.0f} s"
            ) from None
        yield
    finally:
        os.close(fd)


def _open(path: Path) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)


async def _acquire(fd: int, name: str, progress: BuildProgress) -> None:
    waiting = False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if not waiting:
                progress.log(f"waiting for another build of {name} on this host")
                waiting = True
            await anyio.sleep(LOCK_POLL_INTERVAL)


async def cached_files(dest: Path, pattern: str) -> list[Path]:
    """The files matching ``pattern`` in the cache folder ``dest``, sorted; none if it is
    not there."""
    return await anyio.to_thread.run_sync(_files_in, dest, pattern)


async def fill_cache(
    dest: Path, pattern: str, download: Callable[[Path], Awaitable[None]]
) -> list[Path]:
    """Fill the cache folder ``dest``: ``download(staging)`` writes into a fresh folder beside
    it, which then becomes ``dest`` by one rename (a concurrent build sees all the files or
    none); the staging folder is removed on every path. The files matching ``pattern``."""
    staging = Path(await anyio.to_thread.run_sync(_make_staging, dest.parent))
    try:
        await download(staging)
        await anyio.to_thread.run_sync(_publish, staging, dest, pattern)
    finally:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(lambda: shutil.rmtree(staging, ignore_errors=True))
    return await cached_files(dest, pattern)


def require_pip(purpose: str) -> None:
    """``ImageToolMissingError`` unless this interpreter has pip, which downloads wheels."""
    if importlib.util.find_spec("pip") is None:
        raise ImageToolMissingError(
            f"pip is not available to {sys.executable} (needed to fetch {purpose})",
            hint="install pip for this Python (Debian package python3-pip)",
        )


def _files_in(directory: Path, pattern: str) -> list[Path]:
    return sorted(directory.glob(pattern)) if directory.is_dir() else []


def _make_staging(parent: Path) -> str:
    parent.mkdir(parents=True, exist_ok=True)
    return tempfile.mkdtemp(prefix=".download-", dir=parent)


def _publish(staging: Path, dest: Path, pattern: str) -> None:
    try:
        staging.rename(dest)
    except OSError:  # another build published first (or dest is in the way): keep theirs
        if not _files_in(dest, pattern):
            raise
