"""fastmcp's client (pinned in the test extra) against ``/mcp`` of a real ``sandhold serve``, on
its defaults (``raise_on_error``; the negotiated protocol mode), with a task header so that every
operation, ``share`` and ``close_owner`` included, can succeed. fastmcp is a client, not an agent
framework: the loop is ``drive``'s, and the model reads the structured content fastmcp hands
back. A per-call timeout stands for the client giving up on the long cell."""

from __future__ import annotations

from typing import Any

import pytest
from fastmcp import Client
from fastmcp.client.transports import StreamableHttpTransport

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


async def run(script: scenario.Script, served: Served, task: str, **options: Any) -> None:
    async with client(served, task) as mcp:

        async def call_tool(call: scenario.Call) -> scenario.Seen:
            result = await mcp.call_tool(call.tool, call.arguments, **options)
            assert isinstance(result.structured_content, dict), result
            return result.structured_content

        await drive(script, call_tool)


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
