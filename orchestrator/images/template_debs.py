"""Debian packages for a template (``debs = ["nodejs"]``), fetched on the host and installed in
a build with the network off, as a template's wheels are.

What to fetch is what the parent image lacks: apt on the host resolves the packages and their
dependencies against the parent's own dpkg status (read from the image, in a container with no
network), so only missing packages are downloaded, by ``apt-get download``, which checks each
against the hashes of apt's signed indexes. They come from the host's apt sources, which are
the ones the base image was bootstrapped from (``debootstrap``), so versions match the
parent's Debian release. The downloads are cached by the resolved versions (a new security
update is a new set).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
import urllib.parse
from pathlib import Path

import anyio

from orchestrator.backend.docker import DockerClient
from orchestrator.errors import ImageError, ImageToolMissingError
from orchestrator.images._cache import cache_dir, cached_files, fill_cache
from orchestrator.images.progress import BuildProgress

__all__ = ["DEBS_DOCKERFILE", "fetch_template_debs"]

# The Dockerfile of a template made of Debian packages: dpkg installs what the context holds,
# as root, with the network off; the image then runs as the sandbox user again.
DEBS_DOCKERFILE = """\
# A template's Debian packages on top of its parent image, fetched on the host (hash-checked
# against apt's signed indexes) and installed here with the network off.
ARG PARENT_IMAGE
FROM ${PARENT_IMAGE}
USER 0:0
COPY debs/ /tmp/sandhold-debs/
RUN set -eu; \\
    dpkg -i /tmp/sandhold-debs/*.deb; \\
    rm -rf /tmp/sandhold-debs /var/cache/debconf/*-old /var/lib/dpkg/*-old
USER 10001:10001
#ENV-LINES
"""
# Reading the parent's dpkg status is one short container; a download of tens of MB.
RESOLVE_TIMEOUT = 120.0
DOWNLOAD_TIMEOUT = 300.0
_C_LOCALE = {**os.environ, "LC_ALL": "C"}
# apt-get --print-uris: 'URI' FILE SIZE [HASH] (no hash for some sources), FILE being
# NAME_VERSION_ARCH.deb (an epoch's colon as %3a).
_URI_LINE = re.compile(r"^'[^']+' (?P<file>[^_\s]+_[^_\s]+_[^_\s]+\.deb) \d+(?: \S+)?$")


async def fetch_template_debs(
    client: DockerClient, parent_tag: str, packages: tuple[str, ...], *, progress: BuildProgress
) -> list[Path]:
    """The .deb files ``packages`` need on top of ``parent_tag``, from the cache or fetched."""
    if shutil.which("apt-get") is None:
        raise ImageToolMissingError(
            "apt-get is not installed on this host (needed to fetch a template's Debian packages)",
            hint="build on a Debian or Ubuntu host",
        )
    status, release = await client.call(lambda sdk: _parent_status(sdk, parent_tag))
    host = _codename(await anyio.Path("/etc/os-release").read_text(errors="replace"))
    if release != host:
        raise ImageError(
            f"the parent image is Debian {release or '(unknown)'} and this host's apt is "
            f"{host or '(unknown)'}: a template's Debian packages come from the host's apt "
            "sources, which must be the parent's release"
        )
    wanted = await _resolve(status, packages)
    if not wanted:
        progress.log(f"{', '.join(packages)}: already in the parent image")
        return []
    key = hashlib.sha256(" ".join(sorted(wanted)).encode()).hexdigest()[:16]
    dest = cache_dir() / "template-debs" / key
    found = await cached_files(dest, "*.deb")
    if found:
        progress.log(f"{len(found)} Debian packages: cached")
        return found
    progress.log(f"apt: downloading {len(wanted)} Debian packages for {', '.join(packages)}")

    async def download(staging: Path) -> None:
        # apt-get download checks every file against the hashes of apt's signed indexes.
        argv = ["apt-get", "-qq", "download", *wanted]
        with anyio.fail_after(DOWNLOAD_TIMEOUT):
            done = await anyio.run_process(argv, cwd=staging, check=False, env=_C_LOCALE)
        if done.returncode != 0:
            reason = done.stderr.decode("utf-8", "replace").strip()[-500:]
            raise ImageError(f"apt-get download failed: {reason}")

    return await fill_cache(dest, "*.deb", download)


def _parent_status(sdk: object, parent_tag: str) -> tuple[bytes, str]:
    """``/var/lib/dpkg/status`` of the parent image and its release's codename, read in a
    container with no network."""
    output = sdk.containers.run(  # type: ignore[attr-defined]
        parent_tag,
        ["cat", "/etc/os-release", "/var/lib/dpkg/status"],
        network_mode="none",
        remove=True,
        user="10001:10001",
        labels={"sandhold.build": "template-debs"},
        stdout=True,
        stderr=False,
    )
    text = bytes(output)
    at = text.find(b"\nPackage: ") + 1  # the status's first stanza; 0 if it has none
    return text[at:], _codename(text[:at].decode("utf-8", "replace"))


def _codename(os_release: str) -> str:
    for line in os_release.splitlines():
        if line.startswith("VERSION_CODENAME="):
            return line.partition("=")[2].strip().strip('"')
    return ""


async def _resolve(status: bytes, packages: tuple[str, ...]) -> list[str]:
    """``NAME=VERSION`` of every package apt would install over ``status``."""
    with tempfile.TemporaryDirectory(prefix="sandhold-debs-") as folder:
        status_file = Path(folder) / "status"
        status_file.write_bytes(status)
        argv = [
            "apt-get", "-qq", "--print-uris", "--no-install-recommends", "-y",
            "-o", f"Dir::State::status={status_file}",
            "-o", "Debug::NoLocking=1",
            "-o", f"Dir::Cache::archives={folder}",
            # No cache built from the host's own status: only the parent's counts.
            "-o", "Dir::Cache::pkgcache=",
            "-o", "Dir::Cache::srcpkgcache=",
            "install", *packages,
        ]  # fmt: skip
        with anyio.fail_after(RESOLVE_TIMEOUT):
            done = await anyio.run_process(argv, check=False, env=_C_LOCALE)
    if done.returncode != 0:
        reason = done.stderr.decode("utf-8", "replace").strip()[-500:]
        raise ImageError(f"apt cannot resolve {', '.join(packages)}: {reason}")
    wanted = []
    for line in done.stdout.decode("utf-8", "replace").splitlines():
        match = _URI_LINE.match(line.strip())
        if match is not None:
            name, version, _ = match["file"][: -len(".deb")].split("_")
            wanted.append(f"{name}={urllib.parse.unquote(version)}")
    return wanted
