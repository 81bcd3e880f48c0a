"""The tool layer: the four tools of the contract, shared by every interface."""

from orchestrator.tools._base import (
    CALL_FAILURES,
    Operation,
    Tool,
    ToolArgs,
    ToolResult,
    call_tool,
)
from orchestrator.tools.files import FILES_TOOL
from orchestrator.tools.process import PROCESS_TOOL
from orchestrator.tools.python_repl import PYTHON_REPL
from orchestrator.tools.session import SESSION_TOOL
from orchestrator.tools.terminal import TERMINAL_TOOL

TOOLS: dict[str, Tool] = {
    tool.name: tool for tool in (PYTHON_REPL, TERMINAL_TOOL, PROCESS_TOOL, FILES_TOOL, SESSION_TOOL)
}

__all__ = [
    "CALL_FAILURES",
    "FILES_TOOL",
    "PROCESS_TOOL",
    "PYTHON_REPL",
    "SESSION_TOOL",
    "TERMINAL_TOOL",
    "TOOLS",
    "Operation",
    "Tool",
    "ToolArgs",
    "ToolResult",
    "call_tool",
]
