"""The wheels of a template's lock, for the Python of its parent image, downloaded on the host
by pip with ``--require-hashes`` (a file whose sha256 the lock does not list is refused) and kept
in the build cache, so a warm build downloads nothing and a cold one only once per lock and
target.

The parent's Python (version, machine, glibc version: the manylinux levels it can load) is learnt
once per image id by a throwaway container and cached. Only glibc bases are supported: the
shipped locks list manylinux wheels only.
"""

from __future__ import annotations

import json
import re
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import anyio

from orchestrator.backend.docker import DockerClient
from orchestrator.errors import ImageError
from orchestrator.images._cache import cache_dir, cached_files, fill_cache, require_pip
from orchestrator.images._process import run_tool
from orchestrator.images.lockfile import Pin, lock_digest, render_lock
from orchestrator.images.progress import BuildProgress
from orchestrator.images.wheels import run_probe

__all__ = ["TemplateTarget", "fetch_template_wheels", "parse_target", "probe_target"]

# scipy and numpy are ~40 and ~17 MB a wheel; a slow link takes minutes for the whole set.
DOWNLOAD_TIMEOUT = 1200.0
# The oldest manylinux level there is (manylinux2014 is 2_17): every glibc base loads it.
MIN_GLIBC_MINOR = 17
_PROBE_CODE = (
    "import platform, sys; "
    "print(f'{sys.version_info[0]}.{sys.version_info[1]}', platform.machine(), "
    "*(platform.libc_ver() if platform.libc_ver()[0] else ('unknown', '0')))"
)
_ANSWER = re.compile(
    r"^(3\.\d{1,3}) ([A-Za-z0-9_]{1,32}) ([A-Za-z0-9_]{1,32}) (\d{1,3})\.(\d{1,3})"
)


@dataclass(frozen=True)
class TemplateTarget:
    """The parent image's Python, as pip's platform selection needs it."""

    version: str
    machine: str
    libc: str
    glibc_major: int
    glibc_minor: int

    def platforms(self) -> list[str]:
        """Every manylinux tag this glibc loads, newest first (pip takes any of them)."""
        if self.libc != "glibc" or self.glibc_major != 2:
            raise ImageError(
                f"templates need a glibc base; this one has {self.libc} "
                f"{self.glibc_major}.{self.glibc_minor}",
                hint="build on the Debian base or the official Python image",
            )
        minors = range(max(self.glibc_minor, MIN_GLIBC_MINOR), MIN_GLIBC_MINOR - 1, -1)
        return [*(f"manylinux_2_{minor}_{self.machine}" for minor in minors),
                f"manylinux2014_{self.machine}"]  # fmt: skip

    def key(self) -> str:
        return f"py{self.version}-{self.libc}{self.glibc_major}.{self.glibc_minor}-{self.machine}"


def parse_target(text: str) -> TemplateTarget:
    found = _ANSWER.match(text.strip())
    if found is None:
        raise ImageError(f"unexpected answer from python3 in the parent image: {text[:200]!r}")
    version, machine, libc, major, minor = found.groups()
    return TemplateTarget(version, machine, libc, int(major), int(minor))


async def probe_target(client: DockerClient, image_id: str) -> TemplateTarget:
    """The parent's Python; from the cache when this image id was seen."""
    cached = cache_dir() / "template-probe" / f"{image_id.removeprefix('sha256:')}.json"
    target = await anyio.to_thread.run_sync(_read_cache, cached)
    if target is None:
        target = parse_target(await run_probe(client, image_id, _PROBE_CODE))
        await anyio.to_thread.run_sync(_write_cache, cached, target)
    return target


def _read_cache(path: Path) -> TemplateTarget | None:
    try:
        data = json.loads(path.read_text())
        return TemplateTarget(
            str(data["version"]), str(data["machine"]), str(data["libc"]),
            int(data["glibc_major"]), int(data["glibc_minor"]),
        )  # fmt: skip
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_cache(path: Path, target: TemplateTarget) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    with open(fd, "w") as handle:
        handle.write(json.dumps(asdict(target)))
    Path(tmp).replace(path)


async def fetch_template_wheels(
    pins: tuple[Pin, ...], target: TemplateTarget, *, progress: BuildProgress
) -> list[Path]:
    """A wheel of every pin for ``target``, from the cache or downloaded into it."""
    dest = cache_dir() / "template-wheels" / f"{lock_digest(pins)[:16]}-{target.key()}"
    wheels = await cached_files(dest, "*.whl")
    if wheels:
        progress.log(f"{len(wheels)} wheels for Python {target.version}: cached")
        return wheels
    require_pip("a template's wheels")
    progress.log(f"pip download {len(pins)} pinned wheels for Python {target.version}")

    async def download(staging: Path) -> None:
        await _pip_download(pins, target, staging, progress)
        found = await cached_files(staging, "*.whl")
        if len(found) != len(pins):
            raise ImageError(f"pip downloaded {len(found)} wheels for {len(pins)} pins")

    return await fill_cache(dest, "*.whl", download)


async def _pip_download(
    pins: tuple[Pin, ...], target: TemplateTarget, staging: Path, progress: BuildProgress
) -> None:
    lock = staging / ".requirements.lock"
    await anyio.to_thread.run_sync(lock.write_text, render_lock(pins))
    platforms = [arg for platform in target.platforms() for arg in ("--platform", platform)]
    argv = [
        sys.executable, "-m", "pip", "download", "--only-binary=:all:", "--no-deps",
        "--require-hashes", "--disable-pip-version-check", "--no-input", "--progress-bar", "off",
        "--python-version", target.version, *platforms,
        "--dest", str(staging), "-r", str(lock),
    ]  # fmt: skip
    tally = DownloadTally(progress, len(pins))
    outcome = await run_tool(argv, progress=tally, timeout=DOWNLOAD_TIMEOUT)
    await anyio.to_thread.run_sync(lambda: lock.unlink(missing_ok=True))
    if outcome.returncode != 0:
        raise ImageError(
            f"pip could not download the pinned wheels for Python {target.version} on "
            f"{target.machine}: {outcome.describe()}",
            hint="the lock must list a wheel of every pin for this Python and platform, and "
            "pip needs its package index reachable",
        )


# pip's line for each file it fetches: "Downloading numpy-2.1.3-...whl (16.3 MB)".
_DOWNLOADING = re.compile(r"Downloading (\S+?)(?: \(([\d.]+) (B|kB|KB|MB|GB)\))?\s*$")
_UNITS = {"B": 1, "kB": 1000, "KB": 1000, "MB": 1000**2, "GB": 1000**3}


class DownloadTally:
    """The progress of a ``pip download``, with each file pip starts to fetch told as a running
    count: ``3 of 40 wheels, 48.1 MB: numpy-2.1.3-...whl``. Other lines pass unchanged."""

    def __init__(self, progress: BuildProgress, total_files: int) -> None:
        self._progress = progress
        self._total = total_files
        self.files = 0
        self.bytes = 0

    def step(self, name: str) -> None:
        self._progress.step(name)

    def done(self, name: str) -> None:
        self._progress.done(name)

    def log(self, line: str) -> None:
        found = _DOWNLOADING.search(line.strip())
        if found is None:
            self._progress.log(line)
            return
        name, size, unit = found.groups()
        self.files += 1
        if size is not None:
            self.bytes += int(float(size) * _UNITS[unit])
        megabytes = self.bytes / 1000**2
        filename = name.rsplit("/", 1)[-1]
        self._progress.log(
            f"{self.files} of {self._total} wheels, {megabytes:.1f} MB downloaded: {filename}"
        )
