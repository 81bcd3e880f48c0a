"""Shared fixtures. Tests that need Docker use the fixtures below; when no engine answers they
fail under CI (a skipped sandbox test proves nothing) and skip, with the reason, elsewhere.

Every container a test run creates carries ``sandhold.test-run=<RUN_ID>``; the run ends by checking
that none is left, and fails if one is.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import TYPE_CHECKING

import anyio
import docker
import pytest

from orchestrator.backend.base import ContainerSpec
from orchestrator.backend.docker import DockerBackend, DockerClient
from orchestrator.policy.model import Policy

if TYPE_CHECKING:
    from orchestrator.images import ImageBuildResult

RUN_ID = secrets.token_hex(6)
TEST_ORCHESTRATOR_ID = f"test-{RUN_ID}"
TEST_RUN_LABEL = "sandhold.test-run"
IN_CI = bool(os.environ.get("CI"))
# ``sandhold serve`` and ``sandhold mcp`` keep a warm pool by default; the servers tests start
# (as subprocesses inheriting this environment) keep none unless a test asks, so that what a
# test counts is what it made.
os.environ.setdefault("SANDHOLD_POOL", "0")


def _engine_problem() -> str | None:
    try:
        client = docker.from_env(timeout=10)
        try:
            client.ping()
        finally:
            client.close()
    except Exception as exc:
        return f"no Docker engine answers ({type(exc).__name__}: {exc})"
    return None


@pytest.fixture(scope="session")
def docker_engine() -> None:
    problem = _engine_problem()
    if problem is None:
        return
    if IN_CI:
        pytest.fail(f"CI is set and {problem}: Docker-backed tests must run", pytrace=False)
    pytest.skip(problem)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def worker_image(docker_engine: None) -> ImageBuildResult:
    """The sandbox image, built once per run (an unchanged image is never rebuilt)."""

    from orchestrator.images import ensure_worker_image

    async def build() -> ImageBuildResult:
        client = DockerClient()
        try:
            return await ensure_worker_image(client)
        finally:
            await client.aclose()

    return anyio.run(build)


@pytest.fixture
async def docker_client(docker_engine: None) -> AsyncIterator[DockerClient]:
    client = DockerClient()
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
async def docker_backend(docker_client: DockerClient) -> DockerBackend:
    return DockerBackend(docker_client)


ContainerFactory = Callable[[Policy], Awaitable[str]]


@pytest.fixture
async def make_container(
    docker_backend: DockerBackend, worker_image: ImageBuildResult
) -> AsyncIterator[ContainerFactory]:
    """Create session containers for a policy; all are removed when the test ends."""
    created: list[str] = []

    async def make(policy: Policy) -> str:
        spec = ContainerSpec(
            image=worker_image.tag,
            policy=policy,
            session_id=secrets.token_hex(16),
            tenant="test",
            orchestrator_id=TEST_ORCHESTRATOR_ID,
            extra_labels={TEST_RUN_LABEL: RUN_ID},
        )
        container_id = await docker_backend.create_container(spec)
        created.append(container_id)
        return container_id

    try:
        yield make
    finally:
        with anyio.CancelScope(shield=True):
            for container_id in created:
                await docker_backend.remove_container(container_id)


def _remove_leftover_containers() -> list[str]:
    """Names what this run left behind, then removes it so a failed run still leaves nothing."""
    client = docker.from_env(timeout=10)
    try:
        found = client.api.containers(all=True, filters={"label": f"{TEST_RUN_LABEL}={RUN_ID}"})
        for container in found:
            client.api.remove_container(container["Id"], force=True)
        return [f"{c['Id'][:12]} {c.get('Names')}" for c in found]
    finally:
        client.close()


@pytest.fixture(scope="session", autouse=True)
def no_leaked_containers() -> Iterator[None]:
    """After the whole run, no container of this run may remain."""
    yield
    if _engine_problem() is not None:
        return
    leftovers = _remove_leftover_containers()
    if leftovers:
        pytest.fail(f"containers leaked by this test run: {leftovers}", pytrace=False)


# The cluster of .ci/kube-cluster, for tests/kubernetes and the conformance suite's kubernetes
# parameter: one fixture for the whole run (its namespace is made once). Imported last: it reads
# this module's RUN_ID and IN_CI.
from tests.kubernetes.cluster import kube_cluster  # noqa: E402

__all__ = ["kube_cluster"]
