"""fastmcp's client (pinned in the test extra) against ``/mcp`` of a real ``sandhold serve``, on
its defaults (``raise_on_error``; the negotiated protocol mode), with a task header so that every
operation, ``share`` and ``close_owner`` included, can succeed. fastmcp is a client, not an agent
framework: the loop is ``drive``'s, and the model reads the structured content fastmcp hands
back. A per-call timeout stands for the client giving up on the long cell. ``.data``, which
fastmcp builds from the tool's output schema, is the whole result."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest
from fastmcp import Client
from fastmcp.client.client import CallToolResult
from fastmcp.client.transports import StreamableHttpTransport

from orchestrator.tools import TOOLS
from tests.frameworks import scenario
from tests.frameworks.conftest import (
    CLIENT_TIMEOUT,
    Served,
    drive,
    every_operation,
    every_tool_field,
)

pytestmark = [pytest.mark.docker, pytest.mark.anyio]


def client(served: Served, task: str) -> Client[Any]:
    return Client(StreamableHttpTransport(served.mcp_url, headers=served.headers(task)))


async def run(
    script: scenario.Script, served: Served, task: str, **options: Any
) -> list[CallToolResult]:
    """Drive the script; the results fastmcp answered (a call it raised for has none)."""
    results: list[CallToolResult] = []
    async with client(served, task) as mcp:

        async def call_tool(call: scenario.Call) -> scenario.Seen:
            result = await mcp.call_tool(call.tool, call.arguments, **options)
            assert isinstance(result.structured_content, dict), result
            results.append(result)
            return result.structured_content

        await drive(script, call_tool)
    return results


async def test_a_session_is_kept_across_calls_and_failing_cells_raise_nothing(
    served: Served, task: str
) -> None:
    script = scenario.Script(scenario.kept_session)
    await run(script, served, task)
    scenario.check_kept_session(script)


async def test_a_cell_longer_than_the_call_timeout_leaves_the_session_usable(
    served: Served, task: str
) -> None:
    script = scenario.Script(scenario.outlasting_the_client)
    await run(script, served, task, timeout=CLIENT_TIMEOUT)
    scenario.check_outlasting_the_client(script)


async def test_every_operation_takes_null_in_every_field_it_does_not_use(
    served: Served, task: str
) -> None:
    script = scenario.Script(scenario.every_operation(every_tool_field(), task))
    await run(script, served, task)
    scenario.check_every_operation(script, task, every_operation())


async def test_data_is_the_whole_result_of_every_operation(served: Served, task: str) -> None:
    """fastmcp builds ``.data`` from the output schema: it is the result as the server sent it,
    every field of it, for every operation of every tool (a schema listing only some fields
    made ``.data`` an object of those alone)."""
    printed = await run(scenario.Script(printing), served, task)
    assert printed[0].data["stdout"] == "hi\n"
    # Last: the plan ends with close_owner, which closes the task.
    script = scenario.Script(scenario.every_operation(every_tool_field(), task))
    results = await run(script, served, task)
    for result in results:
        assert result.data == result.structured_content, result
    ok = [step for step in script.transcript if scenario.outcome(step.seen) == "ok"]
    assert {step.call.tool for step in ok} == set(TOOLS)


def printing(script: scenario.Script) -> Generator[scenario.Call, scenario.Seen, None]:
    yield from script.ask(scenario.execute("print('hi')"))
