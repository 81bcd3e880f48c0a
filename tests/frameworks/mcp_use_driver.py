"""Run by test_mcp_use.py in its own virtualenv (mcp-use's client needs ``mcp<2``, which cannot
sit beside sandhold's ``mcp>=2.3``): one agent run of a scenario, as mcp-use users make it,
printed as JSON on stdout.

``MCPClient.from_dict`` with ``sandhold mcp`` as its stdio server and an ``MCPAgent`` on its
defaults (its LangChain adapter turns each tool's input schema into a pydantic model, and the
model is shown each tool's text); a chat model of our own plays the scripted model, reading the
last tool message it is given. mcp-use's telemetry is turned off before it is imported.

Usage: python mcp_use_driver.py CONFIG_JSON (see ``main``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

os.environ["MCP_USE_ANONYMIZED_TELEMETRY"] = "false"  # it would send events to a third party

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from mcp_use import MCPAgent, MCPClient

# mcp-use logs to stdout, which carries only the answer here.
for handler in logging.getLogger("mcp_use").handlers:
    if isinstance(handler, logging.StreamHandler):
        handler.setStream(sys.stderr)

sys.path.insert(0, str(Path(__file__).parent))
import scenario  # noqa: E402  (stdlib only, found beside this file)

DONE = "done"
# A step per tool call: the every-operation plan makes ~45 (mcp-use allows its graph two
# nodes a step, and the agent's middleware takes more).
MAX_STEPS = 100


def text_of(message: ToolMessage) -> str:
    content: Any = message.content
    if isinstance(content, str):
        return content
    return "\n".join(
        block if isinstance(block, str) else str(block.get("text", "")) for block in content
    )


class ScriptedChatModel(BaseChatModel):
    """The scripted model as a langchain chat model: the next tool call from the last tool
    message it is given."""

    script: Any
    calls: int = 0

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> ScriptedChatModel:
        return self

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        last = messages[-1]
        if isinstance(last, ToolMessage):
            call = self.script.step(text_of(last))
        else:
            call = self.script.start()
        self.calls += 1
        if call is None:
            message = AIMessage(content=DONE)
        else:
            tool_call = {"name": call.tool, "args": call.arguments, "id": f"call-{self.calls}"}
            message = AIMessage(content="", tool_calls=[tool_call])
        return ChatResult(generations=[ChatGeneration(message=message)])


def plan_of(config: dict[str, Any]) -> Any:
    name = config["plan"]
    if name == "every_operation":
        return scenario.every_operation(config["fields"], None)
    return getattr(scenario, name)


async def main(config: dict[str, Any]) -> dict[str, Any]:
    """config: plan (a scenario plan's name), command, args and env of the stdio server,
    fields (for every_operation)."""
    server = {"command": config["command"], "args": config["args"], "env": config["env"]}
    client = MCPClient.from_dict({"mcpServers": {"sandhold": server}})
    script = scenario.Script(plan_of(config))
    agent = MCPAgent(llm=ScriptedChatModel(script=script), client=client, max_steps=MAX_STEPS)
    # stdout carries only the answer: anything mcp-use prints goes to stderr.
    with contextlib.redirect_stdout(sys.stderr):
        try:
            final = await agent.run("work in the sandbox")
        finally:
            await client.close_all_sessions()
    return {
        "final": str(final),
        "finished": script.finished,
        "transcript": scenario.transcript_json(script),
    }


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(json.loads(sys.argv[1])))))
