"""The tool layer's machinery: a tool is a set of operations, each with a strict argument model
and a handler; ``call_tool`` validates, dispatches and shapes one call. Every interface (MCP, HTTP,
CLI, Python) goes through here, so a wrong argument gets the same ``error_type`` everywhere.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any, Final

from pydantic import BaseModel, ConfigDict

from orchestrator.errors import (
    ContainerNotFoundError,
    InvalidArgumentError,
    OrchestratorError,
    SessionLostError,
)
from orchestrator.tools._arguments import read_arguments
from orchestrator.tools._schema import field_uses, input_schema, is_map, output_schema
from orchestrator.tools._text import render_text
from orchestrator.tools._unicode import valid_unicode

if TYPE_CHECKING:
    from orchestrator._core.repl_operations import PythonReplManager

log = logging.getLogger(__name__)


class ToolArgs(BaseModel):
    """Arguments of one operation: unknown keys refused, no type coercion ("5" is not 5)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


# Failures of the call itself: a wrong request, something not found or not allowed, or nothing
# that could do the work. Every other error_type (an exception user code raised, "timeout",
# "validation" and "import_blocked" about the code, "process_crashed", "output_limit") reports
# what the work did: the call completed, with ``success: false``.
CALL_FAILURES: Final = frozenset(
    {
        "invalid_argument",
        "session_not_found",
        "session_lost",
        "policy",
        "quota_exceeded",
        "busy",
        "backend_unavailable",
        "unknown_template",
        "template_not_built",
        "not_supported",
        "storage_full",
        "path_not_found",
        "internal",
        "unauthenticated",
    }
)

Fields = dict[str, Any]
# Handlers of most tools take a plain ``SessionManager``, which this accepts too.
Handler = Callable[["PythonReplManager", str | None, Any], Awaitable[Fields]]


@dataclass(frozen=True)
class Operation:
    name: str
    description: str
    args: type[ToolArgs]
    handler: Handler

    @cached_property
    def map_fields(self) -> frozenset[str]:
        """Arguments that are str-to-str maps, which also take a list of ``{name, value}``."""
        properties = self.args.model_json_schema().get("properties", {})
        return frozenset(name for name, prop in properties.items() if is_map(prop))


@dataclass(frozen=True)
class Tool:
    """A tool of the contract. The hints describe the whole tool, whose operations mix reads and
    writes: it is read-only only when every operation is; it may destroy (overwrite a file, end
    a session or a process) whenever one operation writes; ``idempotent`` when repeating any call
    has no further effect; ``open_world`` when what runs may reach the network a policy allows.
    ``read_only_operations`` names the reads, for clients that look per operation.
    ``description`` is advertised (a model reads it every turn: short); ``notes`` are for the
    reference page only."""

    name: str
    description: str
    operations: Mapping[str, Operation]
    title: str = ""
    notes: str = ""
    read_only_operations: frozenset[str] = frozenset()
    idempotent: bool = False
    open_world: bool = False

    @property
    def read_only(self) -> bool:
        return self.read_only_operations >= set(self.operations)

    def output_schema(self) -> dict[str, Any]:
        """The envelope every result of the tool shares; operations add their own fields."""
        return output_schema()

    def input_schema(self) -> dict[str, Any]:
        """One JSON schema for the tool: ``operation`` as an enum, every argument described
        (the shape is in ``orchestrator.tools._schema``)."""
        return input_schema(self.operations)

    @cached_property
    def unset_values(self) -> Mapping[str, tuple[Any, ...]]:
        """Per argument of any operation, the values that leave it unset where an operation does
        not use it: null, and each default it is advertised with."""
        return {
            name: (None, *(p["default"] for _, p in uses if p.get("default") is not None))
            for name, uses in field_uses(self.operations).items()
        }


@dataclass(frozen=True)
class ToolResult:
    """What a call answers: structured content (``success`` first, the contract) and its text
    rendering (``render_text``) for clients that show a model only text."""

    structured: dict[str, Any]
    text: str

    @property
    def is_error(self) -> bool:
        """Whether the call itself failed (MCP ``isError``, a REST status other than 200), as
        opposed to completing with ``success: false`` about what user code did."""
        if self.structured.get("success", False):
            return False
        error_type = self.structured.get("error_type")
        return error_type is None or error_type in CALL_FAILURES


async def call_tool(
    orchestrator: PythonReplManager,
    tool: Tool,
    arguments: Any,
    *,
    tenant: str | None = None,
) -> ToolResult:
    operation_name = arguments.get("operation") if isinstance(arguments, dict) else None
    if not isinstance(operation_name, str):
        operation_name = None  # the result names an operation only when one was named
    try:
        operation = _operation(tool, arguments)
        args = read_arguments(tool, operation, arguments)
        try:
            fields = await operation.handler(orchestrator, tenant, args)
        except OrchestratorError as exc:
            if not _vanished(exc):
                raise
            # A container the engine no longer has: whatever removed it, its session is over.
            await orchestrator.drop_vanished_sessions()
            raise SessionLostError(
                f"the session's container is gone: {exc}", cause=f"its container is gone: {exc}"
            ) from exc
    except OrchestratorError as exc:
        fields = {"success": False, **exc.to_dict()}
    except Exception:
        log.exception("%s.%s failed", tool.name, operation_name)
        fields = {"success": False, "error_type": "internal", "error_message": "internal error"}
    structured = {"success": fields.pop("success", True), "operation": operation_name, **fields}
    # The one place every interface passes through: what leaves here is text UTF-8 can carry.
    structured = valid_unicode(structured)
    return ToolResult(structured, render_text(tool.name, structured))


def _vanished(exc: OrchestratorError) -> bool:
    return isinstance(exc, ContainerNotFoundError)


def _operation(tool: Tool, arguments: Any) -> Operation:
    if not isinstance(arguments, dict):
        raise InvalidArgumentError("arguments must be a JSON object")
    name = arguments.get("operation")
    if not isinstance(name, str) or name not in tool.operations:
        known = ", ".join(tool.operations)
        raise InvalidArgumentError(f"operation must be one of: {known}")
    return tool.operations[name]
