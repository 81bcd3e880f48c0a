"""Code contexts through the typed sandbox API, in-process and remote (REST), and through the
blocking twin: made with a language and cwd, listed, run in (by object or by a language's
name), restarted and removed; a refused one raises its typed error."""

from __future__ import annotations

from collections.abc import Iterator

import anyio
import pytest

from orchestrator import (
    AsyncSandbox,
    InvalidArgumentError,
    PolicyViolationError,
    Sandbox,
    SyncOrchestrator,
)
from orchestrator.images import ImageBuildResult
from orchestrator.sandbox import CodeContext
from tests.docker.test_python_repl import config
from tests.docker.test_sandbox_api import POLICY, SCENARIO_TIMEOUT, Sandhold, sandhold

pytestmark = [pytest.mark.docker]

__all__ = ["sandhold"]  # the fixture, local and remote


@pytest.mark.anyio
async def test_contexts_through_the_async_sandbox(sandhold: Sandhold) -> None:
    with anyio.fail_after(SCENARIO_TIMEOUT):
        async with AsyncSandbox.create(policy=POLICY, **sandhold.options()) as sandbox:
            await sandbox.run_code("x = 1")
            scratch = await sandbox.create_code_context(cwd="/tmp")
            assert scratch.language == "python" and scratch.cwd == "/tmp"
            assert (await sandbox.run_code("x = 2\nx", context=scratch)).text == "2"
            assert (await sandbox.run_code("x")).text == "1"
            shell = await sandbox.create_code_context(language="bash")
            echoed = await sandbox.run_code("cd /tmp && pwd", context=shell)
            assert echoed.stdout == "/tmp\n"
            assert (await sandbox.run_code("pwd", context=shell.id)).stdout == "/tmp\n"
            by_name = await sandbox.run_code("echo $0 >/dev/null; echo hi", context="bash")
            assert by_name.stdout == "hi\n"
            ids = [c.id for c in await sandbox.list_code_contexts()]
            assert ids == ["default", scratch.id, shell.id, "bash"]
            await sandbox.restart_code_context(scratch)
            failed = await sandbox.run_code("x", context=scratch)
            assert failed.error is not None and failed.error.name == "NameError"
            await sandbox.remove_code_context(shell)
            with pytest.raises(InvalidArgumentError):
                await sandbox.run_code("pwd", context=shell)


@pytest.mark.anyio
async def test_a_restricted_sandbox_refuses_a_bash_context(sandhold: Sandhold) -> None:
    with anyio.fail_after(SCENARIO_TIMEOUT):
        async with AsyncSandbox.create(**sandhold.options()) as sandbox:
            with pytest.raises(PolicyViolationError) as refused:
                await sandbox.create_code_context(language="bash")
            assert refused.value.error_type == "policy"


@pytest.fixture
def sync_sandhold(worker_image: ImageBuildResult) -> Iterator[SyncOrchestrator]:
    with SyncOrchestrator(config(worker_image.tag)) as orchestrator:
        yield orchestrator


@pytest.mark.timeout(300)
def test_contexts_through_the_blocking_twin(sync_sandhold: SyncOrchestrator) -> None:
    with Sandbox.create(orchestrator=sync_sandhold, policy=POLICY) as sandbox:
        shell = sandbox.create_code_context(language="bash", cwd="/tmp")
        assert shell == CodeContext(id=shell.id, language="bash", cwd="/tmp")
        assert sandbox.run_code("X=3; pwd", context=shell).stdout == "/tmp\n"
        assert sandbox.run_code("echo $X", context=shell).stdout == "3\n"
        assert [c.id for c in sandbox.list_code_contexts()] == ["default", shell.id]
        sandbox.restart_code_context(shell)
        assert sandbox.run_code("echo [$X]", context=shell).stdout == "[]\n"
        sandbox.remove_code_context(shell)
        assert [c.id for c in sandbox.list_code_contexts()] == ["default"]
