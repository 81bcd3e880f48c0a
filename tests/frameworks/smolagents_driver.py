"""Run by test_smolagents.py in its own virtualenv (smolagents' MCP client, mcpadapt, needs
``mcp<2``, which cannot sit beside sandhold's ``mcp>=2.3``): one agent run of a scenario, as
smolagents users make it, printed as JSON on stdout.

``MCPClient`` on its defaults (one stdio server for the ``with`` block: ``sandhold mcp``; the
tools answer with their text content) and an agent of the kind asked for:

- ``tool_calling``: a ``ToolCallingAgent``; the scripted model answers with tool calls, which
  smolagents checks against each tool's inputs (``validate_tool_arguments``) before calling;
  it reads the observation smolagents shows it.
- ``code``: a ``CodeAgent``; the scripted model answers with a code block calling the tool
  as smolagents' prompt shows it, ``def python_repl(operation: string, code: [...], ...)``:
  every argument given, by keyword, each a value of the type the prompt shows (null where it
  shows null and the call needs none; a value no shown type admits is refused, as a model
  writing to that signature could not send it), and printing the result; it reads the
  execution logs smolagents shows it.

Either model ends the run with ``final_answer("done")``. What smolagents refused before calling
(or any error it showed the model) is what the model sees, so a refused call fails the scenario.

Usage: python smolagents_driver.py CONFIG_JSON (see ``main``).
"""

from __future__ import annotations

import ast
import contextlib
import json
import re
import sys
from pathlib import Path
from typing import Any

from mcp import StdioServerParameters
from smolagents import CodeAgent, MCPClient, ToolCallingAgent
from smolagents.models import (
    ChatMessage,
    ChatMessageToolCall,
    ChatMessageToolCallFunction,
    MessageRole,
    Model,
)
from smolagents.monitoring import LogLevel

sys.path.insert(0, str(Path(__file__).parent))
import scenario  # stdlib only, found beside this file

DONE = "done"
# A step per tool call: the every-operation plan makes ~35.
MAX_STEPS = 60
# What smolagents puts before what a tool answered, in the message the model is shown next.
OBSERVATION = "Observation:\n"
EXECUTION_LOGS = "Execution logs:\n"
# A tool as smolagents' CodeAgent prompt shows it, and each argument in its signature.
SIGNATURE = re.compile(r"^def (\w+)\((.*)\) -> \w+:$", re.M)
ARGUMENT = re.compile(r"(\w+): (\[[^\]]*\]|\w+)")
JSON_TYPES = {
    type(None): ("null",),
    bool: ("boolean",),
    int: ("integer", "number"),
    float: ("number",),
    str: ("string",),
    list: ("array",),
    dict: ("object",),
}


def text_of(message: ChatMessage) -> str:
    content: Any = message.content
    if isinstance(content, str):
        return content
    return "\n".join(str(part.get("text", "")) for part in content or ())


def shown(messages: list[ChatMessage], marker: str) -> str | None:
    """What the framework showed of the last step's result: the text after ``marker`` in the
    last message carrying one (an error smolagents raised is shown as its message instead)."""
    for message in reversed(messages):
        if message.role == MessageRole.ASSISTANT:
            return None  # nothing came back since the model last spoke
        text = text_of(message)
        if marker in text:
            return text.split(marker, 1)[1].strip()
        if "Error" in text and message.role != MessageRole.SYSTEM:
            return f"the tool call raised {text.strip()}"
    return None


def signatures(prompt: str) -> dict[str, dict[str, list[str]]]:
    """Each tool's arguments and their types, as the CodeAgent prompt shows them."""
    found = {}
    for name, arguments in SIGNATURE.findall(prompt):
        found[name] = {
            argument: (ast.literal_eval(kind) if kind.startswith("[") else [kind])
            for argument, kind in ARGUMENT.findall(arguments)
        }
    return found


def written_to(shown: dict[str, list[str]], call: scenario.Call) -> dict[str, Any]:
    """The call's arguments as a model writes them to the shown signature: every argument,
    null unless the call needs it; one no shown type admits cannot be written."""
    arguments = {name: call.arguments.get(name) for name in shown}
    for name, value in arguments.items():
        admitted = JSON_TYPES[type(value)]
        if "any" not in shown[name] and not set(admitted) & set(shown[name]):
            raise ValueError(f"{call.tool}({name}: {shown[name]}) cannot take {value!r}")
    return arguments


class ScriptedModel(Model):
    """The scripted model at smolagents' ``Model`` boundary."""

    def __init__(self, script: scenario.Script, kind: str) -> None:
        super().__init__(model_id="scripted")
        self.script = script
        self.kind = kind
        self.calls = 0
        self.signatures: dict[str, dict[str, list[str]]] = {}

    def generate(self, messages: list[Any], **kwargs: Any) -> ChatMessage:
        marker = OBSERVATION if self.kind == "tool_calling" else EXECUTION_LOGS
        seen = shown(messages, marker) if self.calls else None
        if not self.calls and self.kind == "code":
            self.signatures = signatures(text_of(messages[0]))
        call = self.script.start() if seen is None else self.script.step(seen)
        self.calls += 1
        if self.kind == "tool_calling":
            return self._tool_call(call)
        return self._code(call)

    def _tool_call(self, call: scenario.Call | None) -> ChatMessage:
        if call is None:
            name, arguments = "final_answer", {"answer": DONE}
        else:
            name, arguments = call.tool, call.arguments
        tool_call = ChatMessageToolCall(
            id=f"call-{self.calls}",
            type="function",
            function=ChatMessageToolCallFunction(name=name, arguments=arguments),
        )
        return ChatMessage(role=MessageRole.ASSISTANT, content="", tool_calls=[tool_call])

    def _code(self, call: scenario.Call | None) -> ChatMessage:
        if call is None:
            code = f"final_answer({DONE!r})"
        else:
            arguments = written_to(self.signatures[call.tool], call)
            keywords = ", ".join(f"{k}={v!r}" for k, v in arguments.items())
            code = f"result = {call.tool}({keywords})\nprint(result)"
        return ChatMessage(
            role=MessageRole.ASSISTANT, content=f"Thought: next call.\n<code>\n{code}\n</code>"
        )


def plan_of(config: dict[str, Any]) -> Any:
    name = config["plan"]
    if name == "every_operation":
        return scenario.every_operation(config["fields"], None)
    return getattr(scenario, name)


def main(config: dict[str, Any]) -> dict[str, Any]:
    """config: plan (a scenario plan's name), kind (``tool_calling`` or ``code``), command,
    args and env of the stdio server, fields (for every_operation)."""
    server = StdioServerParameters(
        command=config["command"], args=config["args"], env=config["env"]
    )
    script = scenario.Script(plan_of(config))
    model = ScriptedModel(script, config["kind"])
    options: dict[str, Any] = {"max_steps": MAX_STEPS, "verbosity_level": LogLevel.OFF}
    # stdout carries only the answer: anything smolagents prints goes to stderr.
    with (
        contextlib.redirect_stdout(sys.stderr),
        MCPClient(server, structured_output=False) as tools,
    ):
        if config["kind"] == "tool_calling":
            agent: Any = ToolCallingAgent(tools=tools, model=model, **options)
        else:
            agent = CodeAgent(tools=tools, model=model, **options)
        final = agent.run("work in the sandbox")
        inputs = {tool.name: tool.inputs for tool in tools}
    return {
        "final": final,
        "finished": script.finished,
        "inputs": inputs,
        "transcript": scenario.transcript_json(script),
    }


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1])), default=str))
