"""Building ``sandhold-base:<suite>-<packages>`` without a registry: debootstrap a minimal Debian
root file system (minbase + ``BASE_PACKAGES``) from the mirror in this machine's own apt sources,
strip apt's caches, tar it with numeric owners and import the tar into the engine.

Invariant: the work directory is removed on every path, and never while anything is still mounted
below it (debootstrap mounts /proc, /sys and may bind /dev into the target; deleting through such a
mount would delete the host's files).
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import tempfile
from pathlib import Path

import anyio

from orchestrator.backend.docker import DockerClient
from orchestrator.errors import ImageError, ImageToolMissingError, InvalidArgumentError
from orchestrator.images._process import run_tool
from orchestrator.images.progress import BuildProgress
from orchestrator.images.sources import find_mirror

__all__ = [
    "BASE_PACKAGES",
    "DEBOOTSTRAP_TIMEOUT",
    "base_tag",
    "build_base_image",
    "check_suite",
    "default_suite",
    "mounts_under",
    "remove_workdir",
]

BASE_REPOSITORY = "sandhold-base"
# What debootstrap adds to minbase: the worker's interpreter, and git (E2B's SDK runs git in the
# sandbox for its git helpers). The tag names them, so a base made with another set is not
# taken for this one.
BASE_PACKAGES = ("python3", "git")
# A Debian codename doubles as a Docker tag; nothing else may reach debootstrap's argv.
SUITE_PATTERN = re.compile(r"^[a-z][a-z0-9.-]{0,62}$")
# minbase + python3 + git is ~120 packages: minutes on a slow mirror, never an hour.
DEBOOTSTRAP_TIMEOUT = 1800.0
# Tarring ~200 MB of local files.
TAR_TIMEOUT = 300.0
_MNT_DETACH = 2
# Left behind by apt during the bootstrap; useless in an image, and large.
_STRIP_GLOBS = (
    "var/cache/apt/*.bin",
    "var/cache/apt/archives/*.deb",
    "var/cache/apt/archives/partial/*",
    "var/lib/apt/lists/*",
    "var/log/apt/*",
)


def base_tag(suite: str) -> str:
    return f"{BASE_REPOSITORY}:{_tag_of(suite)}"


def _tag_of(suite: str) -> str:
    return "-".join((suite, *BASE_PACKAGES))


def default_suite(os_release: Path = Path("/etc/os-release")) -> str:
    """``SANDHOLD_DEBIAN_SUITE``, else this host's ``VERSION_CODENAME``."""
    suite = os.environ.get("SANDHOLD_DEBIAN_SUITE") or _codename(os_release)
    if not suite:
        raise ImageError(
            "cannot tell which Debian suite to bootstrap",
            hint="pass --suite (the codename of a Debian release) or set SANDHOLD_DEBIAN_SUITE",
        )
    return check_suite(suite)


def check_suite(suite: str) -> str:
    if not SUITE_PATTERN.match(suite):
        raise InvalidArgumentError(f"not a Debian suite name: {suite!r}")
    return suite


def _codename(os_release: Path) -> str | None:
    try:
        text = os_release.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "VERSION_CODENAME":
            return value.strip().strip("\"'") or None
    return None


def require_debootstrap() -> str:
    """The path of debootstrap, once it is known to be usable by this process."""
    if os.geteuid() != 0:
        raise ImageError(
            "building the base image with debootstrap needs root",
            hint="run `sandhold image build` once as root, or pass --base-image with a local image",
        )
    tool = shutil.which("debootstrap")
    if tool is None:
        raise ImageToolMissingError(
            "debootstrap is not installed (needed to build the base image without a registry)",
            hint="install the Debian package `debootstrap` (apt-get install debootstrap)",
        )
    return tool


async def build_base_image(client: DockerClient, *, suite: str, progress: BuildProgress) -> str:
    """Bootstrap ``suite`` and import it as ``base_tag(suite)``; returns the new image's id."""
    tool = require_debootstrap()
    mirror = await anyio.to_thread.run_sync(find_mirror, suite)
    if mirror is None:
        raise ImageError(
            f"no apt source of this machine serves {suite!r} over a transport debootstrap can use",
            hint="add a `deb` entry to /etc/apt/sources.list, or pass --base-image",
        )
    packages = " + ".join(BASE_PACKAGES)
    progress.log(f"debootstrap {suite} (minbase + {packages}) from this host's apt mirror")
    workdir = Path(await anyio.to_thread.run_sync(tempfile.mkdtemp, None, "sandhold-base-"))
    try:
        return await _bootstrap_and_import(client, tool, suite, mirror, workdir, progress)
    finally:
        with anyio.CancelScope(shield=True):
            problem = await anyio.to_thread.run_sync(remove_workdir, workdir)
        if problem:
            progress.log(problem)


async def _bootstrap_and_import(
    client: DockerClient,
    tool: str,
    suite: str,
    mirror: str,
    workdir: Path,
    progress: BuildProgress,
) -> str:
    rootfs, tarball = workdir / "rootfs", workdir / "rootfs.tar"
    include = "--include=" + ",".join(BASE_PACKAGES)
    argv = [tool, "--variant=minbase", include, suite, str(rootfs), mirror]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive", "LC_ALL": "C"}
    outcome = await run_tool(argv, progress=progress, timeout=DEBOOTSTRAP_TIMEOUT, env=env)
    if outcome.returncode != 0:
        log_tail = await anyio.to_thread.run_sync(_debootstrap_log_tail, rootfs)
        raise ImageError(f"debootstrap {suite} failed: {log_tail or outcome.describe()}")
    await anyio.to_thread.run_sync(_strip, rootfs)
    tar = ["tar", "--numeric-owner", "--xattrs", "-C", str(rootfs), "-cf", str(tarball), "."]
    outcome = await run_tool(tar, progress=progress, timeout=TAR_TIMEOUT)
    if outcome.returncode != 0:
        raise ImageError(f"tar of the base file system failed: {outcome.describe()}")
    progress.log(f"importing {base_tag(suite)}")
    changes = [
        "ENV LANG=C.UTF-8",
        'CMD ["python3"]',
        f"LABEL sandhold.image=base sandhold.debian-suite={suite}",
    ]
    await client.call(
        lambda sdk: sdk.api.import_image_from_file(
            str(tarball), repository=BASE_REPOSITORY, tag=_tag_of(suite), changes=changes
        )
    )
    image = await client.call(lambda sdk: sdk.images.get(base_tag(suite)))
    return str(image.id)


def _debootstrap_log_tail(rootfs: Path) -> str:
    try:
        lines = (rootfs / "debootstrap" / "debootstrap.log").read_text(errors="replace")
    except OSError:
        return ""
    return " | ".join(line for line in lines.splitlines()[-8:] if line.strip())


def _strip(rootfs: Path) -> None:
    for pattern in _STRIP_GLOBS:
        for path in rootfs.glob(pattern):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink(missing_ok=True)


def remove_workdir(workdir: Path) -> str | None:
    """Unmount whatever is left mounted below ``workdir``, then delete it. Returns a warning
    instead of deleting when something stays mounted."""
    try:
        for mount in sorted(mounts_under(workdir), key=len, reverse=True):
            _detach(mount)
        left = mounts_under(workdir)
    except OSError as exc:
        return f"left {workdir} in place: cannot read the mount table ({exc.strerror})"
    if left:
        return f"left {workdir} in place: still mounted below it: {', '.join(left)}"
    shutil.rmtree(workdir, ignore_errors=True)
    return None


def mounts_under(directory: Path, mountinfo: Path = Path("/proc/self/mountinfo")) -> list[str]:
    """Mount points at or below ``directory``, from the kernel's own table (OSError when the
    table cannot be read: then nothing below ``directory`` is known to be safe to delete)."""
    root = os.path.realpath(directory)
    text = mountinfo.read_text(encoding="utf-8", errors="replace")
    found = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 5:
            continue
        point = _unescape(fields[4])
        if point == root or point.startswith(root + "/"):
            found.append(point)
    return found


def _unescape(field: str) -> str:
    # mountinfo writes space, tab, newline and backslash as octal escapes (\040 ...).
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _detach(mount: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.umount2(mount.encode(), _MNT_DETACH)
