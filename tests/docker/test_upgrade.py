"""An upgrade from the project's earlier name leaks nothing: a start reaps the containers of its
orchestrator id that carry the old labels, and leaves those of other ids alone."""

from __future__ import annotations

import secrets

import anyio
import docker
import pytest

from orchestrator._api import Orchestrator
from orchestrator.backend.base import LEGACY_LABEL_ORCHESTRATOR
from orchestrator.images import ImageBuildResult
from tests.conftest import RUN_ID, TEST_ORCHESTRATOR_ID, TEST_RUN_LABEL
from tests.docker.test_python_repl import config

pytestmark = [pytest.mark.docker, pytest.mark.anyio]

START_TIMEOUT = 60.0


def _old_container(image: str, orchestrator_id: str) -> str:
    client = docker.from_env(timeout=30)
    try:
        container = client.containers.create(
            image,
            ["sleep", "300"],
            labels={LEGACY_LABEL_ORCHESTRATOR: orchestrator_id, TEST_RUN_LABEL: RUN_ID},
            network_mode="none",
        )
        container.start()
        return str(container.id)
    finally:
        client.close()


def _exists(container_id: str) -> bool:
    client = docker.from_env(timeout=30)
    try:
        return bool(client.api.containers(all=True, filters={"id": container_id}))
    finally:
        client.close()


def _remove(container_id: str) -> None:
    client = docker.from_env(timeout=30)
    try:
        client.api.remove_container(container_id, force=True)
    finally:
        client.close()


async def test_a_start_reaps_its_ids_containers_with_the_old_labels_and_no_one_elses(
    worker_image: ImageBuildResult,
) -> None:
    mine = f"{TEST_ORCHESTRATOR_ID}-{secrets.token_hex(4)}"
    other = f"{TEST_ORCHESTRATOR_ID}-{secrets.token_hex(4)}"
    old_mine = await anyio.to_thread.run_sync(_old_container, worker_image.tag, mine)
    old_other = await anyio.to_thread.run_sync(_old_container, worker_image.tag, other)
    try:
        with anyio.fail_after(START_TIMEOUT):
            async with Orchestrator(config(worker_image.tag, orchestrator_id=mine)) as orch:
                assert old_mine in orch.last_reconcile.reaped
        assert not await anyio.to_thread.run_sync(_exists, old_mine)
        assert await anyio.to_thread.run_sync(_exists, old_other)
    finally:
        for container_id in (old_mine, old_other):
            if await anyio.to_thread.run_sync(_exists, container_id):
                await anyio.to_thread.run_sync(_remove, container_id)
