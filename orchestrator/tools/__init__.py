"""The tool layer: the four tools of the contract, shared by every interface."""

from orchestrator.tools._base import (
    CALL_FAILURES,
    Operation,
    Tool,
    ToolArgs,
    ToolResult,
    call_tool,
)
from orchestrator.tools._sets import AGENT_TOOL_SET, DEFAULT_TOOL_SET, TOOL_SET_NAMES, narrowed
from orchestrator.tools.files import FILES_TOOL
from orchestrator.tools.process import PROCESS_TOOL
from orchestrator.tools.python_repl import PYTHON_REPL
from orchestrator.tools.session import SESSION_TOOL
from orchestrator.tools.terminal import TERMINAL_TOOL

TOOLS: dict[str, Tool] = {
    tool.name: tool for tool in (PYTHON_REPL, TERMINAL_TOOL, PROCESS_TOOL, FILES_TOOL, SESSION_TOOL)
}


def tool_set(name: str = DEFAULT_TOOL_SET) -> dict[str, Tool]:
    """The tools the set ``name`` (one of ``TOOL_SET_NAMES``) advertises; ``invalid_argument``
    for another name."""
    return narrowed(name, TOOLS)


__all__ = [
    "AGENT_TOOL_SET",
    "CALL_FAILURES",
    "DEFAULT_TOOL_SET",
    "FILES_TOOL",
    "PROCESS_TOOL",
    "PYTHON_REPL",
    "SESSION_TOOL",
    "TERMINAL_TOOL",
    "TOOLS",
    "TOOL_SET_NAMES",
    "Operation",
    "Tool",
    "ToolArgs",
    "ToolResult",
    "call_tool",
    "tool_set",
]
