"""``ensure_worker_image``: the one entry point that makes sure a current worker image exists,
building the base and the worker only when their inputs changed."""

from __future__ import annotations

import os
from dataclasses import dataclass

import anyio

from orchestrator.backend.docker import DockerClient
from orchestrator.images._cache import build_lock
from orchestrator.images.base import ensure_base_image
from orchestrator.images.progress import ONE_TIME_BUILD, BuildProgress, NullProgress
from orchestrator.images.wheels import fetch_wheels, probe_python
from orchestrator.images.worker import (
    BUILD_TIMEOUT,
    BuildInputs,
    build_worker_image,
    image_inputs_hash,
    image_is_current,
    read_inputs,
    worker_tag,
)

__all__ = ["ImageBuildResult", "ensure_worker_image"]

# Waiting for another process's build of the same worker image: its own bound, and some.
WORKER_LOCK_TIMEOUT = BUILD_TIMEOUT + 60.0
# Said before the worker image is built: the worker's files copied and psutil installed from its
# wheel with the network off, seconds to a minute on 2 cores.
WORKER_BUILD_ESTIMATE = "a minute or less"
STEP_BASE = "base image"
STEP_PYTHON = "python in base"
STEP_WHEELS = "psutil wheels"
STEP_WORKER = "worker image"


@dataclass(frozen=True)
class ImageBuildResult:
    """The worker image to run sessions from, whether this call built it, and its base."""

    tag: str
    built: bool
    base_image: str


async def ensure_worker_image(
    client: DockerClient,
    *,
    base_image: str | None = None,
    suite: str | None = None,
    progress: BuildProgress | None = None,
) -> ImageBuildResult:
    """The current worker image, built (with its base, if need be) when missing.

    ``base_image`` defaults to ``SANDHOLD_BASE_IMAGE`` then ``BASE_IMAGE``; without one, the base is
    ``sandhold-base:<suite>`` bootstrapped from Debian packages (``suite`` defaults to
    ``SANDHOLD_DEBIAN_SUITE``, then this host's codename).
    """
    progress = progress or NullProgress()
    base_image = base_image or os.environ.get("SANDHOLD_BASE_IMAGE") or os.environ.get("BASE_IMAGE")

    progress.step(STEP_BASE)
    base = await ensure_base_image(client, base_image=base_image, suite=suite, progress=progress)
    progress.done(STEP_BASE)

    progress.step(STEP_PYTHON)
    target = await probe_python(client, base.id)
    progress.log(f"Python {target.version} on {target.machine} ({target.libc})")
    progress.done(STEP_PYTHON)

    progress.step(STEP_WHEELS)
    wheel_paths = await fetch_wheels(target, progress=progress)
    progress.done(STEP_WHEELS)

    progress.step(STEP_WORKER)
    inputs = await anyio.to_thread.run_sync(read_inputs, wheel_paths)
    inputs_hash = image_inputs_hash(
        dockerfile=inputs.dockerfile,
        worker_files=inputs.worker_files,
        wheels=inputs.wheels,
        base_image_id=base.id,
    )
    tag = worker_tag(inputs_hash)
    built = False
    if not await image_is_current(client, tag, inputs_hash):
        built = await _build_once(client, inputs, base.ref, inputs_hash, progress)
    progress.log(f"{tag} {'built' if built else 'is current'}")
    progress.done(STEP_WORKER)
    return ImageBuildResult(tag=tag, built=built, base_image=base.ref)


async def _build_once(
    client: DockerClient,
    inputs: BuildInputs,
    base_ref: str,
    inputs_hash: str,
    progress: BuildProgress,
) -> bool:
    """Build unless another process built the same image while this one waited for the lock."""
    lock = f"worker-{inputs_hash[:16]}"
    async with build_lock(lock, timeout=WORKER_LOCK_TIMEOUT, progress=progress):
        if await image_is_current(client, worker_tag(inputs_hash), inputs_hash):
            return False
        notice = f"{ONE_TIME_BUILD} of the worker image: about {WORKER_BUILD_ESTIMATE}"
        progress.step(notice)
        progress.done(notice)
        await build_worker_image(
            client, inputs=inputs, base_ref=base_ref, inputs_hash=inputs_hash, progress=progress
        )
        return True
