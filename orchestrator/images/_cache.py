"""The per-user cache directory of image builds, and a lock that makes concurrent builds of the
same image on this host (two test runs, a CLI and a server) wait for one another instead of
building it twice."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import AsyncIterator
from pathlib import Path

import anyio

from orchestrator.errors import ImageError
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
