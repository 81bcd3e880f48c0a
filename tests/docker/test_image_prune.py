"""``sandhold image prune`` against the real engine, on images this test makes: tags of other
images removed, another name of the current image only untagged, an image a running container
uses kept. The library runs on a repository of this test's own (a prune of the real one would
take other people's images with it); the command runs as ``--dry-run``."""

from __future__ import annotations

import io
import os
import sys
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest

from orchestrator.backend.docker import DockerClient, NotFoundError
from orchestrator.images import ImageBuildResult
from orchestrator.images.prune import prune_worker_images
from tests.conftest import RUN_ID, TEST_RUN_LABEL

pytestmark = [pytest.mark.docker, pytest.mark.anyio]

REPOSITORY = f"sandhold-worker-prune-test-{RUN_ID}"
CLI_TIMEOUT = 120


async def child_image(client: DockerClient, base: str, tag: str) -> str:
    """An image of its own (another id) on top of ``base``: what an older worker image is."""
    dockerfile = f"FROM {base}\nLABEL sandhold.prune-test={tag.replace(':', '-')}\n".encode()

    def build(sdk: Any) -> str:
        image, _ = sdk.images.build(fileobj=io.BytesIO(dockerfile), tag=tag, rm=True)
        return str(image.id)

    return await client.call(build)


async def image_exists(client: DockerClient, tag: str) -> bool:
    try:
        await client.call(lambda sdk: sdk.api.inspect_image(tag))
    except NotFoundError:
        return False
    return True


@pytest.fixture
async def made(docker_client: DockerClient) -> AsyncIterator[list[str]]:
    """Tags and containers this test made, all removed at the end."""
    tags: list[str] = []
    yield tags
    for name in reversed(tags):
        try:
            if name.startswith("container:"):
                await docker_client.call(
                    lambda sdk, c=name[10:]: sdk.api.remove_container(c, force=True)
                )
            else:
                await docker_client.call(lambda sdk, t=name: sdk.api.remove_image(t))
        except NotFoundError:
            pass


async def test_prune_removes_other_images_untags_aliases_and_keeps_one_a_container_uses(
    docker_client: DockerClient, worker_image: ImageBuildResult, made: list[str]
) -> None:
    current, alias, old, used = (f"{REPOSITORY}:{n}" for n in ("current", "alias", "old", "used"))
    for tag in (current, alias):
        repository, name = tag.split(":")
        await docker_client.call(
            lambda sdk, r=repository, n=name: sdk.api.tag(worker_image.tag, r, n)
        )
        made.append(tag)
    for tag in (old, used):
        await child_image(docker_client, worker_image.tag, tag)
        made.append(tag)
    container = await docker_client.call(
        lambda sdk: sdk.api.create_container(
            used, command=["sleep", "300"], labels={TEST_RUN_LABEL: RUN_ID}
        )["Id"]
    )
    made.append(f"container:{container}")
    await docker_client.call(lambda sdk: sdk.api.start(container))

    dry = await prune_worker_images(
        docker_client, current=current, repository=REPOSITORY, dry_run=True
    )
    assert sorted(dry.removed) == sorted([alias, old])
    assert await image_exists(docker_client, old)

    result = await prune_worker_images(docker_client, current=current, repository=REPOSITORY)
    assert sorted(result.removed) == sorted([alias, old])
    assert [tag for tag, _ in result.kept] == [used]
    assert not await image_exists(docker_client, old) and not await image_exists(
        docker_client, alias
    )
    assert await image_exists(docker_client, current) and await image_exists(docker_client, used)
    assert await image_exists(docker_client, worker_image.tag)


async def test_the_command_names_an_older_worker_image_and_never_the_current_one(
    docker_client: DockerClient, worker_image: ImageBuildResult, made: list[str]
) -> None:
    older = f"sandhold-worker:prune-test-{RUN_ID}"
    await child_image(docker_client, worker_image.tag, older)
    made.append(older)
    env = {**os.environ, "SANDHOLD_IMAGE": worker_image.tag}
    with anyio.fail_after(CLI_TIMEOUT):
        done = await anyio.run_process(
            [sys.executable, "-m", "orchestrator.cli", "image", "prune", "--dry-run"],
            env=env, check=False,
        )  # fmt: skip
    out = done.stdout.decode()
    assert done.returncode == 0, done.stderr
    assert f"would remove {older}" in out.splitlines()
    assert worker_image.tag not in out
    assert await image_exists(docker_client, older)  # a dry run removes nothing
