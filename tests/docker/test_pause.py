"""Pause freezes a session (cgroup freezer), resume thaws it with state and files intact; a call
on a paused session resumes it; a policy can pause idle sessions instead of removing them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from orchestrator._api import Orchestrator
from orchestrator.images import ImageBuildResult
from tests.docker.test_python_repl import config

pytestmark = [pytest.mark.docker, pytest.mark.anyio]


@pytest.fixture
async def orch(worker_image: ImageBuildResult) -> AsyncIterator[Orchestrator]:
    async with Orchestrator(config(worker_image.tag)) as orchestrator:
        yield orchestrator


async def call(orch: Orchestrator, tool: str, **args: Any) -> dict[str, Any]:
    return (await orch.call(tool, args)).structured


async def engine_state(orch: Orchestrator, session_id: str) -> str:
    session = orch.find_session(session_id)
    return (await orch.backend.container_state(session.container_id)).status


async def test_a_paused_session_is_frozen_and_resumes_with_state_and_files(
    orch: Orchestrator,
) -> None:
    sid = (await call(orch, "python_repl", operation="execute", code="kept = 41"))["session_id"]
    await call(orch, "files", operation="write", session_id=sid, path="f.txt", content="still")
    paused = await call(orch, "session", operation="pause", session_id=sid)
    assert paused["success"] and paused["changed"]
    assert await engine_state(orch, sid) == "paused"
    again = await call(orch, "session", operation="pause", session_id=sid)
    assert again["success"] and not again["changed"]

    resumed = await call(orch, "session", operation="resume", session_id=sid)
    assert resumed["changed"] and await engine_state(orch, sid) == "running"
    value = await call(orch, "python_repl", operation="execute", session_id=sid, code="kept + 1")
    assert value["result_repr"] == "42" and not value["state_reset"]
    text = await call(orch, "files", operation="read", session_id=sid, path="f.txt")
    assert text["content"] == "still"


async def test_any_call_on_a_paused_session_resumes_it(orch: Orchestrator) -> None:
    sid = (await call(orch, "terminal", operation="run", command="export X=1"))["session_id"]
    await call(orch, "session", operation="pause", session_id=sid)
    shell = await call(orch, "terminal", operation="run", session_id=sid, command="echo $X")
    assert shell["stdout"] == "1\n"
    assert await engine_state(orch, sid) == "running"


async def test_another_tenant_cannot_pause_or_resume_a_session(orch: Orchestrator) -> None:
    sid = (await call(orch, "python_repl", operation="execute", code="1"))["session_id"]
    for operation in ("pause", "resume"):
        other = await orch.call(
            "session", {"operation": operation, "session_id": sid}, tenant="mallory"
        )
        assert other.structured["error_type"] == "session_not_found"
    assert await engine_state(orch, sid) == "running"


async def test_an_idle_session_is_paused_when_its_policy_says_so(
    worker_image: ImageBuildResult, tmp_path: Path
) -> None:
    (tmp_path / "napper.toml").write_text(
        'extends = "default"\n[timeouts]\nidle_s = 1\nidle_action = "pause"\n'
    )
    settings = config(worker_image.tag, policy_dirs=(tmp_path,), reap_interval=0.2)
    async with Orchestrator(settings) as orch:
        first = await orch.execute("kept = 'warm'", policy="napper")
        container_id = orch.find_session(first.session_id).container_id
        with anyio.fail_after(20):
            # Asking the engine, not the orchestrator: a lookup would count as activity.
            while (await orch.backend.container_state(container_id)).status != "paused":  # noqa: ASYNC110
                await anyio.sleep(0.2)
        later = await orch.execute("kept", session_id=first.session_id)
        assert later.result_repr == "'warm'" and not later.state_reset
