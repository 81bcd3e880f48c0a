"""Obtaining the base image the worker is built on, in the order ``base_plan`` decides: a given
image, an image the engine has, the pinned official Python image pulled within a bounded time, or
``sandhold-base:<suite>`` bootstrapped from Debian packages (installing debootstrap when root)."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass

import anyio

from orchestrator.backend.docker import DockerClient, NotFoundError
from orchestrator.errors import (
    BackendError,
    BackendUnavailableError,
    ImageError,
    ImageToolMissingError,
)
from orchestrator.images._cache import build_lock
from orchestrator.images._process import run_tool
from orchestrator.images.base_plan import (
    APT_ENV,
    PINNED_PYTHON_IMAGE,
    Candidate,
    Debootstrap,
    HostTools,
    Pull,
    UseLocal,
    plan_base,
)
from orchestrator.images.debootstrap import (
    DEBOOTSTRAP_TIMEOUT,
    base_tag,
    build_base_image,
    check_suite,
    default_suite,
)
from orchestrator.images.progress import BuildProgress

__all__ = ["ensure_base_image", "local_image_id"]

# A reachable registry streams progress within seconds and a small base lands in a minute or two;
# a registry that cannot be reached should cost no more than this before the debootstrap fallback.
PULL_TIMEOUT = 180.0
# apt-get update and an install of one small package, on a slow mirror.
APT_TIMEOUT = 600.0
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
    """The base to build on, chosen by ``plan_base`` and obtained here; every fallback says
    in the progress why it was taken."""
    suite = check_suite(suite) if suite else default_suite()
    given_is_local = bool(base_image) and await local_image_id(client, base_image or "") is not None
    local = set()
    for ref in (PINNED_PYTHON_IMAGE, base_tag(suite)):
        if await local_image_id(client, ref) is not None:
            local.add(ref)
    plan = plan_base(
        given=base_image,
        given_is_local=given_is_local,
        local=frozenset(local),
        suite=suite,
        tools=host_tools(),
    )
    for candidate in plan:
        found = await _obtain(client, candidate, progress)
        if found is not None:
            return found
    raise ImageError("no base image could be obtained")  # plan_base always ends in a final step


async def _obtain(
    client: DockerClient, candidate: Candidate, progress: BuildProgress
) -> BaseImage | None:
    if isinstance(candidate, UseLocal):
        found = await local_image_id(client, candidate.ref)
        if found is None:
            raise ImageError(f"{candidate.ref} vanished from the engine during the build")
        progress.log(f"reusing {candidate.ref}")
        return BaseImage(candidate.ref, found)
    if isinstance(candidate, Pull):
        progress.log(f"pulling {candidate.ref}")
        try:
            return BaseImage(candidate.ref, await _pull(client, candidate.ref))
        except BackendUnavailableError:
            raise
        except (BackendError, ImageError) as exc:
            progress.log(f"could not pull {candidate.ref}: {exc}; trying the next base")
            return None
    if isinstance(candidate, Debootstrap):
        for argv in candidate.install:
            await _install_step(argv, progress)
        return await _bootstrapped(client, candidate.suite, progress)
    raise candidate.error()


async def _install_step(argv: tuple[str, ...], progress: BuildProgress) -> None:
    progress.log(f"debootstrap is missing; running {' '.join(argv)}")
    env = {**os.environ, **APT_ENV}
    outcome = await run_tool(argv, progress=progress, timeout=APT_TIMEOUT, env=env)
    if outcome.returncode != 0:
        raise ImageToolMissingError(
            f"installing debootstrap failed ({' '.join(argv)}): {outcome.describe()}",
            hint="install the Debian package `debootstrap` by hand, or pass --base-image",
        )


async def _bootstrapped(client: DockerClient, suite: str, progress: BuildProgress) -> BaseImage:
    tag = base_tag(suite)
    async with build_lock(f"base-{suite}", timeout=BASE_LOCK_TIMEOUT, progress=progress):
        # Another build may have made it while this one waited for the lock.
        found = await local_image_id(client, tag)
        if found is None:
            found = await build_base_image(client, suite=suite, progress=progress)
    return BaseImage(tag, found)


def host_tools() -> HostTools:
    return HostTools(
        debootstrap=shutil.which("debootstrap"),
        apt_get=shutil.which("apt-get"),
        is_root=os.geteuid() == 0,
    )


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
