"""openai-agents (pinned in the test extra) as its users run it: an ``Agent`` with a real
``sandhold mcp`` as its ``MCPServerStdio``, every tool converted to OpenAI strict mode
(``convert_schemas_to_strict``), and a ``Model`` of our own playing the scripted model. Its
defaults: the model is shown the text content only (``use_structured_content`` is off), so every
id is read from the text, and the client session times out after 5 s, which the long cell
outlasts. Tracing is off: it would send spans to OpenAI."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anyio
import jsonschema
import pytest
from agents import Agent, ModelResponse, RunConfig, Runner, Usage
from agents.agent_output import AgentOutputSchemaBase
from agents.handoffs import Handoff
from agents.items import TResponseInputItem, TResponseStreamEvent
from agents.mcp import MCPServerStdio
from agents.model_settings import ModelSettings
from agents.models.interface import Model, ModelTracing
from agents.testing import assistant_message, function_call
from agents.tool import FunctionTool, Tool

from tests.frameworks import scenario
from tests.frameworks.conftest import SCENARIO_TIMEOUT, Stdio, every_operation, every_tool_field

pytestmark = [pytest.mark.docker, pytest.mark.anyio]

DONE = "done"
# A turn per tool call: the every-operation plan makes ~35 (the default allows 10).
MAX_TURNS = 60
# The framework's default read timeout, which the long cell must outlast.
DEFAULT_CLIENT_TIMEOUT = 5


def last_output(items: str | list[TResponseInputItem]) -> str | None:
    """The text of the last tool output the model is given; None before the first call."""
    if isinstance(items, str):
        return None
    outputs = [item for item in items if item.get("type") == "function_call_output"]
    if not outputs:
        return None
    output: Any = outputs[-1]["output"]  # type: ignore[typeddict-item]
    if isinstance(output, list):
        return "\n".join(part.get("text", "") for part in output)
    return str(output)


class ScriptedModel(Model):
    """The scripted model at openai-agents' ``Model`` boundary; also records the tools it was
    offered, as the framework converted them."""

    def __init__(self, script: scenario.Script) -> None:
        self.script = script
        self.tools: list[Tool] = []
        self.calls = 0

    async def get_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff],
        tracing: ModelTracing,
        **options: Any,
    ) -> ModelResponse:
        self.tools = tools
        seen = last_output(input)
        call = self.script.start() if seen is None else self.script.step(seen)
        self.calls += 1
        if call is None:
            output = [assistant_message(DONE)]
        else:
            output = [function_call(call.tool, call.arguments, call_id=f"call-{self.calls}")]
        return ModelResponse(output=output, usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[TResponseStreamEvent]:
        raise NotImplementedError("the tests run the agent without streaming")


async def run(model: ScriptedModel, server: Stdio) -> None:
    params = {"command": server.command, "args": server.args, "env": server.env}
    async with MCPServerStdio(params) as mcp_server:
        agent = Agent(
            name="sandbox-user",
            model=model,
            mcp_servers=[mcp_server],
            mcp_config={"convert_schemas_to_strict": True},
        )
        with anyio.fail_after(SCENARIO_TIMEOUT):
            result = await Runner.run(
                agent,
                "work in the sandbox",
                max_turns=MAX_TURNS,
                run_config=RunConfig(tracing_disabled=True),
            )
    assert result.final_output == DONE


def strict_schemas(model: ScriptedModel) -> dict[str, dict[str, Any]]:
    tools = [tool for tool in model.tools if isinstance(tool, FunctionTool)]
    assert all(tool.strict_json_schema for tool in tools)
    return {tool.name: tool.params_json_schema for tool in tools}


async def test_a_session_is_kept_across_calls_reading_ids_from_the_text(
    sandhold_mcp: Stdio,
) -> None:
    model = ScriptedModel(scenario.Script(scenario.kept_session))
    await run(model, sandhold_mcp)
    scenario.check_kept_session(model.script)
    # Text, not the structured content: what a model on the defaults reads.
    assert all(isinstance(step.seen, str) for step in model.script.transcript)


async def test_a_cell_longer_than_the_default_client_timeout_leaves_the_session_usable(
    sandhold_mcp: Stdio,
) -> None:
    model = ScriptedModel(scenario.Script(scenario.outlasting_the_client))
    with anyio.fail_after(DEFAULT_CLIENT_TIMEOUT + SCENARIO_TIMEOUT):
        await run(model, sandhold_mcp)
    scenario.check_outlasting_the_client(model.script)


async def test_every_tool_converts_to_strict_mode_and_every_operation_takes_its_nulls(
    sandhold_mcp: Stdio,
) -> None:
    """Strict mode makes every field required and nullable, so a strict model sends them all:
    the plan's calls are what such a model sends, checked against the converted schemas."""
    model = ScriptedModel(scenario.Script(scenario.every_operation(every_tool_field(), task=None)))
    await run(model, sandhold_mcp)
    schemas = strict_schemas(model)
    assert set(schemas) == set(every_tool_field())
    for name, schema in schemas.items():
        assert set(schema["required"]) == set(schema["properties"]), name
        assert schema["additionalProperties"] is False, name
    # Every call but the share with its required fields alone (made to compare) fills the
    # whole schema, as a strict model must; each is valid under the converted schema.
    full = [
        s
        for s in model.script.transcript
        if set(s.call.arguments) == set(schemas[s.call.tool]["properties"])
    ]
    assert len(full) == len(model.script.transcript) - 1
    for step in full:
        jsonschema.validate(step.call.arguments, schemas[step.call.tool])
    scenario.check_every_operation(model.script, None, every_operation())
