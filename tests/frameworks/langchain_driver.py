"""Run by test_langchain.py in its own virtualenv (langchain-mcp-adapters needs ``mcp<2``, which
cannot sit beside sandhold's ``mcp>=2.3``): one agent run of a scenario, as langchain users make
it, printed as JSON on stdout.

``MultiServerMCPClient(...).get_tools()`` on its defaults: a new MCP session, so a new stdio
process (here ``sandhold mcp --connect``, the documented set-up for such clients), per tool call;
the tools answer the model with the text content. A chat model of our own plays the scripted
model, and the loop is an agent executor's (langgraph's ``ToolNode``): each tool call of the
model's message invoked with ``tool.ainvoke``, a tool that raises shown to the model as an error
``ToolMessage``.

Usage: python langchain_driver.py CONFIG_JSON (see ``main``).
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import BaseTool
from langchain_mcp_adapters.client import MultiServerMCPClient
from langchain_mcp_adapters.tools import load_mcp_tools

sys.path.insert(0, str(Path(__file__).parent))
import scenario  # stdlib only, found beside this file

DONE = "done"


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


async def agent_loop(model: ScriptedChatModel, tools: list[BaseTool]) -> str:
    by_name = {tool.name: tool for tool in tools}
    messages: list[BaseMessage] = [HumanMessage("work in the sandbox")]
    while True:
        reply = await model.bind_tools(tools).ainvoke(messages)
        messages.append(reply)
        if not isinstance(reply, AIMessage) or not reply.tool_calls:
            return str(reply.content)
        for tool_call in reply.tool_calls:
            try:
                answer = await by_name[tool_call["name"]].ainvoke(
                    {**tool_call, "type": "tool_call"}
                )
            except Exception as exc:  # ToolNode(handle_tool_errors=True) answers so
                answer = ToolMessage(
                    content=f"Error: {type(exc).__name__}: {exc}",
                    tool_call_id=str(tool_call["id"]),
                    status="error",
                )
            messages.append(answer)


def plan_of(config: dict[str, Any]) -> Any:
    name = config["plan"]
    if name == "every_operation":
        return scenario.every_operation(config["fields"], config["plan_task"])
    return getattr(scenario, name)


async def main(config: dict[str, Any]) -> dict[str, Any]:
    """config: plan (a scenario plan's name), command and args of the stdio server, env,
    read_timeout (seconds, or null for the default: none), persistent (one session for the
    run instead of one per call), fields and plan_task (for every_operation)."""
    connection: dict[str, Any] = {
        "transport": "stdio",
        "command": config["command"],
        "args": config["args"],
        "env": config["env"],
    }
    if config.get("read_timeout") is not None:
        timeout = timedelta(seconds=config["read_timeout"])
        connection["session_kwargs"] = {"read_timeout_seconds": timeout}
    client = MultiServerMCPClient({"sandhold": connection})  # type: ignore[dict-item]
    script = scenario.Script(plan_of(config))
    if config.get("persistent"):
        # One MCP session (one server process) for the whole run, as the README's
        # ``client.session(...)`` with ``load_mcp_tools`` sets it up; leaving it closes the
        # server's stdin, whatever call is still in flight.
        async with client.session("sandhold") as session:
            tools = await load_mcp_tools(session)
            final = await agent_loop(ScriptedChatModel(script=script), tools)
    else:
        tools = await client.get_tools()
        final = await agent_loop(ScriptedChatModel(script=script), tools)
    return {
        "final": final,
        "finished": script.finished,
        "tools": sorted(tool.name for tool in tools),
        "transcript": scenario.transcript_json(script),
    }


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(json.loads(sys.argv[1])))))
