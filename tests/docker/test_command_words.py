"""The shell policy reads a command as the shell in the sandbox does: a command spelled around a
pattern with quotes or escapes is refused, and once confirmed the shell runs exactly what the
policy read (so the two readings agree)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest

from orchestrator._api import Orchestrator
from orchestrator.images import ImageBuildResult
from tests.docker.test_python_repl import config

pytestmark = [pytest.mark.docker, pytest.mark.anyio]

CALL_TIMEOUT = 60


@pytest.fixture
async def orch(worker_image: ImageBuildResult) -> AsyncIterator[Orchestrator]:
    async with Orchestrator(config(worker_image.tag)) as orchestrator:
        yield orchestrator


async def call(orch: Orchestrator, tool: str, **args: Any) -> dict[str, Any]:
    with anyio.fail_after(CALL_TIMEOUT):
        return (await orch.call(tool, args)).structured


async def test_a_spelled_around_command_is_refused_and_runs_as_read_once_confirmed(
    orch: Orchestrator,
) -> None:
    made = await call(orch, "terminal", operation="run", command="mkdir -p /workspace/d/e")
    assert made["success"], made
    sid = made["session_id"]
    spelled = "r''m -r\\f /workspace/d"
    for tool, operation in (("terminal", "run"), ("terminal", "start"), ("process", "start")):
        refused = await call(orch, tool, operation=operation, session_id=sid, command=spelled)
        assert (refused["success"], refused["error_type"]) == (False, "policy"), (tool, operation)
    denied = await call(orch, "terminal", operation="run", session_id=sid, command="dock''er ps")
    assert denied["error_type"] == "policy"
    still = await call(orch, "terminal", operation="run", session_id=sid, command="ls /workspace")
    assert still["stdout"] == "d\n"  # nothing ran

    confirmed = await call(
        orch,
        "terminal",
        operation="run",
        session_id=sid,
        command=spelled + " && e''cho removed",
        confirm_dangerous=True,
    )
    assert (confirmed["exit_code"], confirmed["stdout"]) == (0, "removed\n")
    after = await call(orch, "terminal", operation="run", session_id=sid, command="ls /workspace")
    assert after["stdout"] == ""
