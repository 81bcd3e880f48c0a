"""pydantic-ai (pinned in the test extra) as its users run it: an ``Agent`` whose toolset is an
``MCPToolset`` spawning a real ``sandhold mcp`` over stdio, and a ``FunctionModel`` playing the
scripted model. Its defaults: the model is shown the structured content, a tool error is a retry
with a budget of one (so two failing cells in a row would end the run if they were tool
errors), and a read timeout of 300 s (shortened here for the cell that outlasts it)."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from fastmcp.client.transports import StdioTransport
from pydantic_ai import Agent
from pydantic_ai.mcp import MCPToolset
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from tests.frameworks import scenario
from tests.frameworks.conftest import (
    CLIENT_TIMEOUT,
    SCENARIO_TIMEOUT,
    Stdio,
    every_operation,
    every_tool_field,
)

pytestmark = [pytest.mark.docker, pytest.mark.anyio]

DONE = "done"


def seen_by_the_model(part: ToolReturnPart) -> scenario.Seen:
    """What pydantic-ai puts before the model: a dict for structured content, else its text."""
    content: Any = part.content
    return content if isinstance(content, dict) else part.model_response_str()


def scripted_model(script: scenario.Script) -> FunctionModel:
    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        returns = [p for p in messages[-1].parts if isinstance(p, ToolReturnPart)]
        call = script.step(seen_by_the_model(returns[-1])) if returns else script.start()
        if call is None:
            return ModelResponse(parts=[TextPart(DONE)])
        return ModelResponse(parts=[ToolCallPart(call.tool, call.arguments)])

    return FunctionModel(respond)


async def run(script: scenario.Script, toolset: MCPToolset[None]) -> None:
    agent = Agent(scripted_model(script), toolsets=[toolset])
    with anyio.fail_after(SCENARIO_TIMEOUT):
        result = await agent.run("work in the sandbox")
    assert result.output == DONE


def toolset(server: Stdio, **options: Any) -> MCPToolset[None]:
    return MCPToolset(StdioTransport(server.command, server.args, env=server.env), **options)


async def test_a_session_is_kept_across_calls_and_failing_cells_do_not_end_the_run(
    sandhold_mcp: Stdio,
) -> None:
    script = scenario.Script(scenario.kept_session)
    await run(script, toolset(sandhold_mcp))
    scenario.check_kept_session(script)


async def test_a_cell_longer_than_the_read_timeout_leaves_the_session_usable(
    sandhold_mcp: Stdio,
) -> None:
    script = scenario.Script(scenario.outlasting_the_client)
    await run(script, toolset(sandhold_mcp, read_timeout=CLIENT_TIMEOUT))
    scenario.check_outlasting_the_client(script)


async def test_every_operation_takes_null_in_every_field_it_does_not_use(
    sandhold_mcp: Stdio,
) -> None:
    script = scenario.Script(scenario.every_operation(every_tool_field(), task=None))
    await run(script, toolset(sandhold_mcp))
    scenario.check_every_operation(script, None, every_operation())
