"""Whether runsc (gVisor) can run a session on this engine: the ``runsc_works`` fixture, which
skips with the reason where the engine has no runsc and fails under CI where it lists runsc but
no container starts under it (a skipped sandbox test proves nothing)."""

from __future__ import annotations

import concurrent.futures
import secrets

import anyio
import pytest

from orchestrator.backend.base import ContainerSpec, ExecSpec
from orchestrator.backend.docker import DockerBackend, DockerClient
from orchestrator.errors import OrchestratorError
from orchestrator.images import ImageBuildResult
from orchestrator.policy.model import load_policy
from tests.conftest import IN_CI, RUN_ID, TEST_ORCHESTRATOR_ID, TEST_RUN_LABEL

MIB = 1024 * 1024
# Starting gVisor's kernel takes longer than a runc start: allow for a loaded machine.
RUNSC_CHECK_TIMEOUT = 120.0


async def _runsc_problem(image: str) -> tuple[bool, str] | None:
    """None if a container runs under runsc; else (whether the engine lists runsc, why not)."""
    backend = DockerBackend(DockerClient())
    try:
        if "runsc" not in await backend.runtimes():
            return False, "the Docker engine has no runsc runtime (.ci/install-runsc registers it)"
        spec = ContainerSpec(
            image=image,
            policy=load_policy("default").model_copy(update={"runtime": "runsc"}),
            session_id=secrets.token_hex(16),
            tenant="test",
            orchestrator_id=TEST_ORCHESTRATOR_ID,
            extra_labels={TEST_RUN_LABEL: RUN_ID},
        )
        try:
            with anyio.fail_after(RUNSC_CHECK_TIMEOUT):
                container_id = await backend.create_container(spec)
                try:
                    run = await backend.run(
                        container_id,
                        ExecSpec(argv=["python3", "-c", "1"]),
                        timeout=60,
                        max_output_bytes=MIB,
                    )
                finally:
                    with anyio.CancelScope(shield=True):
                        await backend.remove_container(container_id)
        except (OrchestratorError, TimeoutError) as exc:
            return True, f"{type(exc).__name__}: {exc}"
        if run.exit_code != 0:
            return True, f"python3 -c 1 exited {run.exit_code}: {run.stderr.decode()[-500:]}"
        return None
    finally:
        await backend.aclose()


@pytest.fixture(scope="session")
def runsc_works(worker_image: ImageBuildResult) -> None:
    # On a thread of its own: a fixture set up from within a running event loop may ask for it.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        problem = pool.submit(anyio.run, _runsc_problem, worker_image.tag).result()
    if problem is None:
        return
    registered, reason = problem
    if registered and IN_CI:
        pytest.fail(
            f"CI is set and docker info lists runsc, but no container starts under it: {reason}",
            pytrace=False,
        )
    pytest.skip(f"runsc: {reason}")
