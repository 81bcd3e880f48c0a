"""The Docker backend's own promises, beyond the contract every backend keeps
(``test_backend_conformance.py``): nothing leaks on a cancelled create, a missing engine is
``backend_unavailable``, an exec runs as the sandbox user with the fixed environment."""

from __future__ import annotations

import secrets

import anyio
import pytest

from orchestrator.backend.base import ContainerSpec, ExecSpec
from orchestrator.backend.docker import DockerBackend, DockerClient
from orchestrator.errors import BackendUnavailableError
from orchestrator.images import ImageBuildResult
from orchestrator.policy.model import load_policy
from tests.conftest import RUN_ID, TEST_ORCHESTRATOR_ID, TEST_RUN_LABEL

pytestmark = [pytest.mark.docker, pytest.mark.anyio]


@pytest.mark.parametrize("delay", [0.0, 0.01, 0.05, 0.1, 0.2, 0.4, 0.8])
async def test_a_create_cancelled_at_any_moment_leaves_no_container(
    delay: float, docker_backend: DockerBackend, worker_image: ImageBuildResult
) -> None:
    marker = secrets.token_hex(8)
    spec = ContainerSpec(
        image=worker_image.tag,
        policy=load_policy("default"),
        session_id=marker,
        tenant="test",
        orchestrator_id=TEST_ORCHESTRATOR_ID,
        extra_labels={TEST_RUN_LABEL: RUN_ID},
    )
    created: list[str] = []
    with anyio.move_on_after(delay):
        created.append(await docker_backend.create_container(spec))
    for container_id in created:  # finished before the deadline: ours to remove
        await docker_backend.remove_container(container_id)
    assert await docker_backend.list_containers({"sandhold.session": marker}) == []


async def test_an_unreachable_engine_is_backend_unavailable_with_a_hint(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    client = DockerClient()
    try:
        with pytest.raises(BackendUnavailableError) as caught:
            await client.ping()
    finally:
        await client.aclose()
    assert caught.value.code == "backend_unavailable"
    assert caught.value.hint


async def test_an_exec_runs_as_the_sandbox_user_with_the_fixed_environment(
    docker_backend: DockerBackend, make_container: object
) -> None:
    container_id = await make_container(load_policy("default"))  # type: ignore[operator]
    result = await docker_backend.run(
        container_id,
        ExecSpec(
            argv=["/bin/sh", "-c", 'id -u; echo "$HOME"; pwd; echo "$EXTRA"'],
            env={"EXTRA": "given"},
        ),
        timeout=30,
        max_output_bytes=1000,
    )
    assert result.stdout.decode().split() == ["10001", "/home/sandbox", "/workspace", "given"]
