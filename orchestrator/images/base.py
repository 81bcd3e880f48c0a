"""Choosing the base image the worker is built on: a given image (local, else pulled within a
bounded time), else ``sbx-base:<suite>`` reused or bootstrapped from Debian packages."""

from __future__ import annotations

from dataclasses import dataclass

import anyio

from orchestrator.backend.docker._client import DockerClient, NotFoundError
from orchestrator.errors import BackendError, BackendUnavailableError, ImageError
from orchestrator.images._cache import build_lock
from orchestrator.images.debootstrap import (
    DEBOOTSTRAP_TIMEOUT,
    base_tag,
    build_base_image,
    check_suite,
    default_suite,
)
from orchestrator.images.progress import BuildProgress

# A reachable registry streams progress within seconds and a small base lands in a minute or two;
# a registry that cannot be reached should cost no more than this before the debootstrap fallback.
PULL_TIMEOUT = 180.0
# Waiting for another process's debootstrap: its own bound plus the tar and the import.
BASE_LOCK_TIMEOUT = DEBOOTSTRAP_TIMEOUT + 600.0


@dataclass(frozen=True)
class BaseImage:
    """The image the worker is built FROM: the reference given to the build, and its id."""

    ref: str
    id: str


async def ensure_base_image(
    client: DockerClient,
    *,
    base_image: str | None,
    suite: str | None,
    progress: BuildProgress,
) -> BaseImage:
    if base_image:
        found = await local_image_id(client, base_image)
        if found is not None:
            return BaseImage(base_image, found)
        progress.log(f"{base_image} is not present locally; pulling it")
        try:
            return BaseImage(base_image, await _pull(client, base_image))
        except BackendUnavailableError:
            raise
        except (BackendError, ImageError) as exc:
            progress.log(f"could not pull {base_image}: {exc}; building a Debian base instead")
    suite = check_suite(suite) if suite else default_suite()
    tag = base_tag(suite)
    found = await local_image_id(client, tag)
    if found is None:
        async with build_lock(f"base-{suite}", timeout=BASE_LOCK_TIMEOUT, progress=progress):
            # Another build may have made it while this one waited for the lock.
            found = await local_image_id(client, tag)
            if found is None:
                return BaseImage(
                    tag, await build_base_image(client, suite=suite, progress=progress)
                )
    progress.log(f"reusing {tag}")
    return BaseImage(tag, found)


async def local_image_id(client: DockerClient, ref: str) -> str | None:
    try:
        image = await client.call(lambda sdk: sdk.images.get(ref))
    except NotFoundError:
        return None
    return str(image.id)


async def _pull(client: DockerClient, ref: str) -> str:
    # The SDK pulls without an HTTP timeout, so the wait is bounded here; a pull thread that
    # outlives it is abandoned and ends when the engine gives up on the registry.
    def pull() -> str:
        return str(client.call_blocking(lambda sdk: sdk.images.pull(ref)).id)

    try:
        with anyio.fail_after(PULL_TIMEOUT):
            return await anyio.to_thread.run_sync(pull, abandon_on_cancel=True)
    except TimeoutError:
        raise ImageError(f"pull did not finish within {PULL_TIMEOUT:.0f} s") from None
