"""What goes into the build context besides the worker code: psutil wheels matching the base
image's Python, fetched on the host so the build itself needs no network.

The base's Python version and architecture are learnt once per image id by running a throwaway
container (network none, labelled, removed on every path) and cached under the user cache dir;
the wheels are cached there too, so a warm build never runs a container or pip.
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import anyio
import requests.exceptions

from orchestrator.backend.base import LABEL_ORCHESTRATOR
from orchestrator.backend.docker import DockerClient
from orchestrator.errors import ImageError
from orchestrator.images._cache import cache_dir, cached_files, fill_cache, require_pip
from orchestrator.images._process import run_tool
from orchestrator.images.progress import BuildProgress

__all__ = ["IMAGE_BUILD_LABEL", "fetch_wheels", "probe_python", "run_probe"]

# One pinned release: its abi3 wheels fit every CPython >= 3.6, so one pin serves every base.
PSUTIL_VERSION = "7.2.2"
# The wheels a download leaves in its folder of the cache.
WHEELS = "psutil-*.whl"
# Label value marking containers started by an image build (a sweep may remove any it finds).
IMAGE_BUILD_LABEL = "image-build"
# Starting python3 in a local image takes well under a second; a minute means something hangs.
PROBE_TIMEOUT = 60.0
# One ~300 kB download from the package index.
PIP_TIMEOUT = 300.0
_PROBE_CODE = (
    "import platform, sys; "
    "print(f'{sys.version_info[0]}.{sys.version_info[1]}', platform.machine(), "
    "platform.libc_ver()[0] or 'unknown')"
)
_VERSION = re.compile(r"^3\.\d{1,3}$")
_TOKEN = re.compile(r"^[A-Za-z0-9_.-]{1,32}$")


@dataclass(frozen=True)
class PythonTarget:
    """The Python of a base image, as pip's platform selection needs it."""

    version: str
    machine: str
    libc: str

    def platforms(self) -> list[str]:
        if self.libc == "glibc":
            return [f"manylinux2014_{self.machine}", f"manylinux_2_17_{self.machine}"]
        return [f"musllinux_1_1_{self.machine}", f"musllinux_1_2_{self.machine}"]


def parse_probe(text: str) -> PythonTarget:
    fields = text.split()
    if len(fields) != 3 or not _VERSION.match(fields[0]) or not all(map(_TOKEN.match, fields)):
        raise ImageError(f"unexpected answer from python3 in the base image: {text[:200]!r}")
    return PythonTarget(*fields)


async def probe_python(client: DockerClient, image_id: str) -> PythonTarget:
    """The base's Python version, machine and libc; from the cache when this id was seen."""
    cached = cache_dir() / "python-probe" / f"{image_id.removeprefix('sha256:')}.json"
    target = await anyio.to_thread.run_sync(_read_probe_cache, cached)
    if target is None:
        output = await client.call(_run_probe, image_id)
        target = parse_probe(output)
        await anyio.to_thread.run_sync(_write_atomic, cached, json.dumps(asdict(target)).encode())
    return target


def _read_probe_cache(path: Path) -> PythonTarget | None:
    try:
        data = json.loads(path.read_text())
        return parse_probe(f"{data['version']} {data['machine']} {data['libc']}")
    except (OSError, ValueError, KeyError, TypeError, ImageError):
        return None


def _run_probe(sdk: Any, image_id: str, code: str = _PROBE_CODE) -> str:
    """What ``python3 -c code`` prints in a throwaway container of ``image_id``."""
    container = sdk.containers.create(
        image_id,
        ["python3", "-c", code],
        labels={LABEL_ORCHESTRATOR: IMAGE_BUILD_LABEL},
        network_mode="none",
        cap_drop=["ALL"],
        security_opt=["no-new-privileges"],
        read_only=True,
        mem_limit="256m",
        pids_limit=64,
    )
    try:
        container.start()
        try:
            status = container.wait(timeout=PROBE_TIMEOUT)
        except requests.exceptions.RequestException:
            message = f"python3 in the base image did not answer in {PROBE_TIMEOUT:.0f} s"
            raise ImageError(message) from None
        output = container.logs(stdout=True, stderr=True).decode(errors="replace").strip()
        if status.get("StatusCode") != 0:
            raise ImageError(f"the base image cannot run python3: {output[-500:] or 'no output'}")
        return str(output)
    finally:
        container.remove(force=True)


async def run_probe(client: DockerClient, image_id: str, code: str) -> str:
    """Run ``python3 -c code`` once in a throwaway container of ``image_id`` (network none,
    labelled, removed on every path) and return what it printed."""
    return str(await client.call(_run_probe, image_id, code))


async def fetch_wheels(target: PythonTarget, *, progress: BuildProgress) -> list[Path]:
    """psutil wheels for ``target``, downloaded by pip on the first call and cached."""
    name = f"psutil-{PSUTIL_VERSION}-py{target.version}-{target.libc}-{target.machine}"
    dest = cache_dir() / "wheels" / name
    wheels = await cached_files(dest, WHEELS)
    if wheels:
        progress.log(f"psutil {PSUTIL_VERSION} for Python {target.version}: cached")
        return wheels
    require_pip("psutil wheels")
    progress.log(f"pip download psutil=={PSUTIL_VERSION} for Python {target.version}")
    return await fill_cache(dest, WHEELS, lambda staging: _pip_download(target, staging, progress))


async def _pip_download(target: PythonTarget, staging: Path, progress: BuildProgress) -> None:
    platforms = [arg for platform in target.platforms() for arg in ("--platform", platform)]
    argv = [
        sys.executable, "-m", "pip", "download", "--only-binary=:all:", "--no-deps",
        "--disable-pip-version-check", "--no-input", "--progress-bar", "off",
        "--python-version", target.version, *platforms,
        "--dest", str(staging), f"psutil=={PSUTIL_VERSION}",
    ]  # fmt: skip
    outcome = await run_tool(argv, progress=progress, timeout=PIP_TIMEOUT)
    if outcome.returncode != 0 or not await cached_files(staging, WHEELS):
        raise ImageError(
            f"pip could not download psutil=={PSUTIL_VERSION} for Python {target.version} "
            f"({', '.join(target.platforms())}): {outcome.describe()}",
            hint="pip needs its package index (PyPI or the index in pip's config) reachable",
        )


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.replace(tmp, path)
