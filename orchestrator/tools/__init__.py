"""The tool layer: the four tools of the contract, shared by every interface."""

from orchestrator.tools._base import Operation, Tool, ToolArgs, ToolResult, call_tool
from orchestrator.tools.python_repl import PYTHON_REPL

TOOLS: dict[str, Tool] = {tool.name: tool for tool in (PYTHON_REPL,)}

__all__ = ["PYTHON_REPL", "TOOLS", "Operation", "Tool", "ToolArgs", "ToolResult", "call_tool"]
