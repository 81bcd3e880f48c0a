"""The tool reference's result fields are what the operations answer: every operation is called
once against a real container, and its answer holds exactly the fields docs/reference/tools.md
lists for it (besides ``success`` and ``operation``), each item of a listing too."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest

from orchestrator._api import Orchestrator
from orchestrator.docs_reference._results import RESULTS, ResultShape
from orchestrator.images import ImageBuildResult
from tests.docker.test_python_repl import config

pytestmark = [pytest.mark.docker, pytest.mark.anyio]

# Two dozen calls on one session, a few of them waiting on a terminal, and two snapshots (two
# commits each, up to 12 s each on a loaded 2-core machine).
SCENARIO_TIMEOUT = 300.0
TASK = "writer"
ONLY_WHEN = frozenset({"network_denied"})
# Succeeds only on a session with egress, which needs a test network of its own: its fields are
# checked against the reference in tests/docker/test_egress.py.
NEEDS_A_NETWORK = frozenset({"session.set_allowlist"})
OTHER_TASK = "reader"


def _fields(shape: ResultShape) -> set[str]:
    model = set(shape.model.model_fields) if shape.model is not None else set()
    return set(shape.added) | model


class Calls:
    """Makes each call as task ``TASK`` and checks its answer against the reference."""

    def __init__(self, orch: Orchestrator) -> None:
        self.orch = orch
        self.seen: set[str] = set()

    async def __call__(self, tool: str, **arguments: Any) -> dict[str, Any]:
        result = await self.orch.call(tool, arguments, task=TASK)
        answer = result.structured
        assert answer["success"], answer
        key = f"{tool}.{arguments['operation']}"
        shape = RESULTS[key]
        # unicode_replaced appears only when text was replaced, and network_denied only when an
        # egress proxy refused something: nothing here causes either.
        assert set(answer) == (_fields(shape) - ONLY_WHEN) | {"success", "operation"}, key
        for name, items in shape.items.items():
            for item in answer[name]:
                assert set(item) == _fields(items), (key, name)
        self.seen.add(key)
        return answer


@pytest.fixture
async def orch(worker_image: ImageBuildResult) -> AsyncIterator[Orchestrator]:
    async with Orchestrator(config(worker_image.tag)) as orchestrator:
        yield orchestrator


async def test_every_operation_answers_the_fields_the_reference_lists(orch: Orchestrator) -> None:
    call = Calls(orch)
    with anyio.fail_after(SCENARIO_TIMEOUT):
        sid = (await call("python_repl", operation="execute", code="x = [1, 2]\nx"))["session_id"]
        for operation in ("list_variables", "history", "history_context"):
            await call("python_repl", operation=operation, session_id=sid)
        await call("python_repl", operation="inspect", session_id=sid, variable_name="x")
        await call("python_repl", operation="interrupt", session_id=sid)
        await call("python_repl", operation="list_sessions")
        made_context = await call("python_repl", operation="create_context", session_id=sid)
        context = made_context["context"]["id"]
        await call("python_repl", operation="list_contexts", session_id=sid)
        await call("python_repl", operation="restart_context", session_id=sid, context=context)
        await call("python_repl", operation="remove_context", session_id=sid, context=context)

        piped = await call(
            "terminal", operation="start", session_id=sid, command="cat", use_pty=False
        )
        await call(
            "terminal", operation="write", terminal_id=piped["terminal_id"], input_text="hi\n"
        )
        await call("terminal", operation="wait", terminal_id=piped["terminal_id"], timeout_ms=500)
        await call("terminal", operation="read", terminal_id=piped["terminal_id"])
        await call("terminal", operation="kill", terminal_id=piped["terminal_id"], signal="KILL")
        pty = await call("terminal", operation="start", session_id=sid, command="sleep 60")
        await call("terminal", operation="resize", terminal_id=pty["terminal_id"], rows=30, cols=90)
        await call(
            "session",
            operation="share",
            terminal_id=pty["terminal_id"],
            task=OTHER_TASK,
            actions=["read"],
        )
        await call("terminal", operation="interrupt", terminal_id=pty["terminal_id"])
        await call("terminal", operation="run", session_id=sid, command="echo hi")

        started = await call("process", operation="start", session_id=sid, command="sleep 300")
        await call("process", operation="list", session_id=sid)
        await call("process", operation="read_output", process_id=started["process_id"])
        await call("process", operation="kill", process_id=started["process_id"])

        await call("files", operation="write", session_id=sid, path="d/a.txt", content="hi")
        await call("files", operation="read", session_id=sid, path="d/a.txt")
        await call("files", operation="list", session_id=sid, path="d")
        tar = (await call("files", operation="download", session_id=sid, path="d"))["tar_b64"]
        assert base64.b64decode(tar)
        await call("files", operation="upload", session_id=sid, path="copy", tar_b64=tar)
        await call("files", operation="stat", session_id=sid, path="copy/d/a.txt")
        await call("files", operation="exists", session_id=sid, path="copy/d")
        await call("files", operation="make_dir", session_id=sid, path="made/deeper")
        moved = {"path": "copy/d/a.txt", "new_path": "made/a.txt"}
        await call("files", operation="rename", session_id=sid, **moved)
        await call("files", operation="remove", session_id=sid, path="made", recursive=True)

        await call("session", operation="set_timeout", session_id=sid, timeout_s=600)
        await call("session", operation="metrics", session_id=sid)

        await call("session", operation="network_log", session_id=sid)
        await call("session", operation="pause", session_id=sid)
        await call("session", operation="resume", session_id=sid)
        await call("python_repl", operation="reset", session_id=sid)
        await call("python_repl", operation="destroy", session_id=sid)
        made = await call("session", operation="create", env={"A": "1"}, metadata={"k": "v"})
        taken = await call("session", operation="snapshot", session_id=made["session_id"])
        await call("session", operation="snapshots")
        await call("session", operation="create", snapshot=taken["snapshot_id"])
        await call("session", operation="fork", session_id=made["session_id"])
        await call("session", operation="delete_snapshot", snapshot=taken["snapshot_id"])
        await call("session", operation="close_owner", task=TASK)
    assert call.seen | NEEDS_A_NETWORK == set(RESULTS), sorted(set(RESULTS) - call.seen)
