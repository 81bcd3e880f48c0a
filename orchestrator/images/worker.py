"""The worker image: ``sandhold-worker:<hash>`` built FROM the base with ``Dockerfile.worker``.

The tag carries a hash of every input (the Dockerfile, the worker code, the wheels, the base
image id), so an image whose tag exists is current and is never rebuilt. The build runs with the
network off: the context holds everything it installs.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator._resources import worker_dockerfile, worker_source_dir
from orchestrator.backend.docker import DockerClient, NotFoundError
from orchestrator.errors import ImageError
from orchestrator.images._engine_build import build_blocking
from orchestrator.images.progress import BuildProgress

__all__ = [
    "BUILD_TIMEOUT",
    "BuildInputs",
    "build_worker_image",
    "image_exists",
    "image_inputs_hash",
    "image_is_current",
    "read_inputs",
    "worker_files",
    "worker_tag",
]

WORKER_REPOSITORY = "sandhold-worker"
LABEL_IMAGE_INPUTS = "sandhold.image-inputs"
# Hex digits of the inputs hash in the tag: 64 bits, no accidental collision among local images.
TAG_HASH_CHARS = 16
# The build copies a few files and unpacks one wheel; ten minutes means a wedged engine.
BUILD_TIMEOUT = 600.0


@dataclass(frozen=True)
class BuildInputs:
    """Everything the worker image is made of, read from disk."""

    dockerfile: bytes
    worker_files: tuple[tuple[str, bytes], ...]
    wheels: tuple[tuple[str, bytes], ...]


def read_inputs(wheel_paths: Iterable[Path]) -> BuildInputs:
    return BuildInputs(
        dockerfile=worker_dockerfile().read_bytes(),
        worker_files=tuple(worker_files(worker_source_dir())),
        wheels=tuple(sorted((path.name, path.read_bytes()) for path in wheel_paths)),
    )


def worker_files(directory: Path) -> list[tuple[str, bytes]]:
    """Every ``.py`` file below ``directory`` as (relative POSIX path, bytes), sorted by path;
    caches and symlinks are not part of the worker."""
    found = []
    for path in directory.rglob("*.py"):
        relative = path.relative_to(directory)
        if "__pycache__" in relative.parts or path.is_symlink() or not path.is_file():
            continue
        found.append((relative.as_posix(), path.read_bytes()))
    return sorted(found)


def image_inputs_hash(
    *,
    dockerfile: bytes,
    worker_files: Iterable[tuple[str, bytes]],
    wheels: Iterable[tuple[str, bytes]],
    base_image_id: str,
) -> str:
    """sha256 over every input, each length-prefixed so no two input sets share a byte stream."""
    digest = hashlib.sha256()

    def part(kind: bytes, data: bytes) -> None:
        digest.update(kind + len(data).to_bytes(8, "big") + data)

    part(b"dockerfile", dockerfile)
    for name, data in sorted(worker_files):
        part(b"worker-path", name.encode())
        part(b"worker-file", data)
    for name, data in sorted(wheels):
        part(b"wheel-name", name.encode())
        part(b"wheel", data)
    part(b"base-image-id", base_image_id.encode())
    return digest.hexdigest()


def worker_tag(inputs_hash: str) -> str:
    return f"{WORKER_REPOSITORY}:{inputs_hash[:TAG_HASH_CHARS]}"


async def image_exists(client: DockerClient, tag: str) -> bool:
    """Whether the engine holds an image of that tag (a readiness check: sessions need it)."""
    try:
        await client.call(lambda sdk: sdk.images.get(tag))
    except NotFoundError:
        return False
    return True


async def image_is_current(client: DockerClient, tag: str, inputs_hash: str) -> bool:
    try:
        image = await client.call(lambda sdk: sdk.images.get(tag))
    except NotFoundError:
        return False
    labels = image.labels or {}
    return bool(labels.get(LABEL_IMAGE_INPUTS) == inputs_hash)


async def build_worker_image(
    client: DockerClient,
    *,
    inputs: BuildInputs,
    base_ref: str,
    inputs_hash: str,
    progress: BuildProgress,
) -> None:
    """Build ``worker_tag(inputs_hash)`` from ``inputs``, streaming the build log to progress."""
    tag = worker_tag(inputs_hash)
    labels = {LABEL_IMAGE_INPUTS: inputs_hash}
    await client.call(_build_blocking, inputs, tag, base_ref, labels, progress)
    if not await image_is_current(client, tag, inputs_hash):
        raise ImageError(f"the build of {tag} ended without producing it")


def _build_blocking(
    sdk: Any,
    inputs: BuildInputs,
    tag: str,
    base_ref: str,
    labels: Mapping[str, str],
    progress: BuildProgress,
) -> None:
    context = Path(tempfile.mkdtemp(prefix="sandhold-worker-context-"))
    try:
        _write_context(context, inputs)
        build_blocking(
            sdk,
            context=context,
            tag=tag,
            buildargs={"BASE_IMAGE": base_ref},
            labels=labels,
            progress=progress,
            timeout=BUILD_TIMEOUT,
        )
    finally:
        shutil.rmtree(context, ignore_errors=True)


def _write_context(context: Path, inputs: BuildInputs) -> None:
    (context / "Dockerfile").write_bytes(inputs.dockerfile)
    for folder, files in (("worker", inputs.worker_files), ("wheels", inputs.wheels)):
        (context / folder).mkdir()
        for name, data in files:
            target = context / folder / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            os.chmod(target, 0o644)
