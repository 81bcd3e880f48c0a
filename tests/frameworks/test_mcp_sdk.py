"""The official ``mcp`` SDK's client (a dependency, so always installed) against ``/mcp`` of a real
``sandhold serve``, with a task header, on its defaults; the model is shown only the text
content, as an agent loop built on the SDK that passes content blocks on does. A per-call
``read_timeout_seconds`` stands for the client giving up on the long cell (the SDK then sends
``notifications/cancelled``)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx2
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from tests.frameworks import scenario
from tests.frameworks.conftest import (
    CLIENT_TIMEOUT,
    SCENARIO_TIMEOUT,
    Served,
    drive,
    every_operation,
    every_tool_field,
)

pytestmark = [pytest.mark.docker, pytest.mark.anyio]


@contextlib.asynccontextmanager
async def client(served: Served, task: str) -> AsyncIterator[Client]:
    async with (
        httpx2.AsyncClient(headers=served.headers(task), timeout=SCENARIO_TIMEOUT) as http,
        Client(streamable_http_client(served.mcp_url, http_client=http)) as mcp,
    ):
        yield mcp


def text_of(result: types.CallToolResult) -> str:
    [block] = result.content
    assert isinstance(block, types.TextContent)
    return block.text


async def run(script: scenario.Script, served: Served, task: str, **options: Any) -> None:
    async with client(served, task) as mcp:

        async def call_tool(call: scenario.Call) -> scenario.Seen:
            return text_of(await mcp.call_tool(call.tool, call.arguments, **options))

        await drive(script, call_tool)


async def test_a_session_is_kept_across_calls_reading_ids_from_the_text(
    served: Served, task: str
) -> None:
    script = scenario.Script(scenario.kept_session)
    await run(script, served, task)
    scenario.check_kept_session(script)


async def test_a_cell_longer_than_the_read_timeout_leaves_the_session_usable(
    served: Served, task: str
) -> None:
    script = scenario.Script(scenario.outlasting_the_client)
    await run(script, served, task, read_timeout_seconds=CLIENT_TIMEOUT)
    scenario.check_outlasting_the_client(script)


async def test_every_operation_takes_null_in_every_field_it_does_not_use(
    served: Served, task: str
) -> None:
    script = scenario.Script(scenario.every_operation(every_tool_field(), task))
    await run(script, served, task)
    scenario.check_every_operation(script, task, every_operation())
