"""The code-interpreter template (python-data and Debian's nodejs, built on first use with its
Debian packages fetched on the host) and JavaScript contexts in it, against real containers:
state between cells, the last value, an error with its stack, top-level await, and a timeout
that keeps the state or, for a cell that never yields, says the state was reset."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest

from orchestrator._api import Orchestrator
from orchestrator.images import ImageBuildResult
from tests.docker.test_python_repl import config

pytestmark = [pytest.mark.docker, pytest.mark.anyio]

# The template may be built on first use (python-data's wheels, then node's packages: minutes).
FIRST_CALL_TIMEOUT = 900
CALL_TIMEOUT = 60


@pytest.fixture
async def orch(worker_image: ImageBuildResult) -> AsyncIterator[Orchestrator]:
    async with Orchestrator(config(worker_image.tag)) as orchestrator:
        yield orchestrator


async def js(orch: Orchestrator, sid: str, code: str, **arguments: Any) -> dict[str, Any]:
    with anyio.fail_after(CALL_TIMEOUT):
        answer = await orch.call(
            "python_repl",
            {"operation": "execute", "session_id": sid, "context": "javascript", "code": code,
             **arguments},
        )  # fmt: skip
    return answer.structured


async def test_javascript_contexts_keep_state_and_answer_values_and_errors(
    orch: Orchestrator,
) -> None:
    with anyio.fail_after(FIRST_CALL_TIMEOUT):
        made = await orch.execute("import pandas", policy="code-interpreter")
    assert made.success, made
    sid = made.session_id
    first = await js(orch, sid, "let total = 40\nconsole.log('from node')\ntotal + 2")
    assert first["success"] and first["stdout"] == "from node\n", first
    assert first["result_repr"] == "42" and first["results"][0]["is_main_result"]
    assert (await js(orch, sid, "total * 2"))["result_repr"] == "80"
    version = await js(orch, sid, "process.versions.node.split('.')[0]")
    assert int(version["result_repr"].strip("'")) >= 18
    failed = await js(orch, sid, "function boom() { throw new RangeError('no') }\nboom()")
    assert failed["error_type"] == "RangeError" and "at boom" in failed["traceback"]
    awaited = await js(orch, sid, "const later = await Promise.resolve(7)\nlater + total")
    assert awaited["result_repr"] == "47", awaited
    listed = await orch.call("python_repl", {"operation": "list_contexts", "session_id": sid})
    assert {"id": "javascript", "language": "javascript", "cwd": None} in listed.structured[
        "contexts"
    ]


async def test_a_javascript_timeout_keeps_state_or_says_it_was_reset(orch: Orchestrator) -> None:
    with anyio.fail_after(FIRST_CALL_TIMEOUT):
        made = await orch.execute("1", policy="code-interpreter")
    sid = made.session_id
    await js(orch, sid, "globalThis.kept = 'yes'")
    waiting = await js(orch, sid, "await new Promise(r => setTimeout(r, 30000))", timeout_s=1)
    assert waiting["timed_out"] and waiting["state_reset"] is False, waiting
    assert (await js(orch, sid, "kept"))["result_repr"] == "'yes'"
    spinning = await js(orch, sid, "while (true) {}", timeout_s=1)
    assert spinning["timed_out"] and spinning["state_reset"] is True
    fresh = await js(orch, sid, "typeof kept")
    assert fresh["result_repr"] == "'undefined'"
