"""The Python API passes through the same policy and owner checks as the tools: a session's
terminals, shell and processes refuse what its policy denies, whoever calls them, and a
terminal started through the API is found by id for its task and for no other."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator

import anyio
import pytest

from orchestrator._api import Orchestrator, OrchestratorConfig
from orchestrator._core.owners import task_scope
from orchestrator.errors import PolicyViolationError, SessionNotFoundError
from orchestrator.images import ImageBuildResult
from tests.conftest import RUN_ID, TEST_ORCHESTRATOR_ID, TEST_RUN_LABEL

pytestmark = [pytest.mark.docker, pytest.mark.anyio]

CALL_TIMEOUT = 60.0


@pytest.fixture
async def orch(worker_image: ImageBuildResult) -> AsyncIterator[Orchestrator]:
    config = OrchestratorConfig(
        image=worker_image.tag,
        orchestrator_id=f"{TEST_ORCHESTRATOR_ID}-{secrets.token_hex(4)}",
        extra_labels={TEST_RUN_LABEL: RUN_ID},
    )
    async with Orchestrator(config) as orchestrator:
        yield orchestrator


@pytest.mark.parametrize(
    ("policy", "command", "rule"),
    [
        ("strict", "echo hi", "shell.enabled"),
        ("default", "docker ps", "shell.deny_patterns"),
        ("default", "rm -rf /workspace/x", "shell.dangerous_patterns"),
    ],
)
async def test_a_session_refuses_a_denied_command_on_every_part(
    orch: Orchestrator, policy: str, command: str, rule: str
) -> None:
    with anyio.fail_after(CALL_TIMEOUT):
        session = await orch.create_session(policy=policy)
        for start in (
            lambda: session.terminals.start(command),
            lambda: session.shell.run(command),
            lambda: session.processes.start(command),
        ):
            with pytest.raises(PolicyViolationError) as caught:
                await start()
            assert caught.value.code == "policy"
            assert caught.value.rule.startswith(rule)
        listed = await session.processes.list()
    assert not listed.processes


async def test_a_dangerous_command_runs_through_the_api_once_confirmed(orch: Orchestrator) -> None:
    with anyio.fail_after(CALL_TIMEOUT):
        session = await orch.create_session()
        ran = await session.shell.run("mkdir -p d && rm -rf d", confirm_dangerous=True)
    assert ran.exit_code == 0


async def test_a_terminal_started_through_the_api_is_its_tasks_alone(orch: Orchestrator) -> None:
    with anyio.fail_after(CALL_TIMEOUT):
        with task_scope("alice"):
            session = await orch.create_session()
            started = await session.terminals.start("sleep 30", yield_time_ms=0)
            found = await orch.session_of("terminal", started.terminal_id, action="read")
            assert found is session
        with task_scope("bob"), pytest.raises(SessionNotFoundError):
            await orch.session_of("terminal", started.terminal_id, action="read")
        with task_scope("bob"), pytest.raises(SessionNotFoundError):
            await orch.session(session.id)
        with task_scope("alice"):
            await session.terminals.kill(started.terminal_id, signal="KILL")
