"""Tool sets: what an MCP listing advertises. ``all`` is the whole contract; ``agent`` is the
compact set most agent work needs (run Python, run a shell command, read, write and list files,
create a session with a policy, end it), for models that pay for the tool list on every turn.

A set narrows what is advertised, not what the tool layer takes: a set's tool is the full tool
with fewer operations, and each of those with fewer arguments (every argument it requires kept).
Calls still go to the full tools, so a result is the same under every set.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from pydantic import create_model

from orchestrator.errors import InvalidArgumentError
from orchestrator.tools._base import Operation, Tool, ToolArgs

__all__ = ["AGENT_TOOL_SET", "DEFAULT_TOOL_SET", "TOOL_SET_NAMES", "narrowed"]

DEFAULT_TOOL_SET = "all"
AGENT_TOOL_SET = "agent"
# Per tool, per operation, the arguments the agent set advertises.
_AGENT: Mapping[str, Mapping[str, tuple[str, ...]]] = {
    "python_repl": {
        "execute": ("code", "session_id", "timeout_s"),
        "destroy": ("session_id",),
    },
    "terminal": {"run": ("command", "session_id", "timeout_s")},
    "files": {
        "read": ("session_id", "path"),
        "write": ("session_id", "path", "content", "content_b64"),
        "list": ("session_id", "path"),
    },
    "session": {"create": ("policy",)},
}
# What a narrowed tool says of itself where the whole tool's words name what the set leaves out.
_AGENT_DESCRIPTIONS: Mapping[str, str] = {
    "terminal": "Shell commands in a session's persistent shell.",
    "session": "Make a session, with a policy.",
}
TOOL_SET_NAMES = (DEFAULT_TOOL_SET, AGENT_TOOL_SET)


def narrowed(name: str, tools: Mapping[str, Tool]) -> dict[str, Tool]:
    """The tools the set ``name`` advertises, made from ``tools`` (the contract's)."""
    if name == DEFAULT_TOOL_SET:
        return dict(tools)
    if name != AGENT_TOOL_SET:
        raise InvalidArgumentError(
            f"unknown tool set {name!r}; the sets are: {', '.join(TOOL_SET_NAMES)}"
        )
    return {
        tool_name: _tool_of_set(tools[tool_name], operations)
        for tool_name, operations in _AGENT.items()
    }


def _tool_of_set(tool: Tool, operations: Mapping[str, tuple[str, ...]]) -> Tool:
    kept = {
        name: _with_arguments(tool.operations[name], arguments)
        for name, arguments in operations.items()
    }
    return dataclasses.replace(
        tool,
        description=_AGENT_DESCRIPTIONS.get(tool.name, tool.description),
        operations=kept,
        read_only_operations=tool.read_only_operations & set(kept),
    )


def _with_arguments(operation: Operation, arguments: tuple[str, ...]) -> Operation:
    fields = operation.args.model_fields
    missing = [n for n, f in fields.items() if f.is_required() and n not in arguments]
    if missing or not set(arguments) <= set(fields):
        raise ValueError(f"{operation.name}: a set must keep {missing} and name only its fields")
    model: type[ToolArgs] = create_model(  # type: ignore[call-overload]
        operation.args.__name__,
        __base__=ToolArgs,
        __doc__=operation.args.__doc__,
        **{name: (fields[name].annotation, fields[name]) for name in arguments},
    )
    return dataclasses.replace(operation, args=model)
