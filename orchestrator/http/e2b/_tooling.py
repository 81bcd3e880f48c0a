"""One tool call on behalf of an E2B request, and the error a refused call becomes.

Every E2B operation goes through ``Orchestrator.call``: the same policies, quotas, owners,
audit records and crash safety as every other interface. A call that answers ``success:
false`` with an ``error_type`` it failed as a call (not user code failing) becomes
``ToolCallError``, which each protocol maps onto its own error shape (``_errors``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from orchestrator._api import Orchestrator

__all__ = ["ToolCallError", "call"]


class ToolCallError(Exception):
    """A tool call the orchestrator refused or failed; ``error_type`` is its stable code."""

    def __init__(self, error_type: str, message: str) -> None:
        super().__init__(message)
        self.error_type = error_type
        self.message = message


async def call(
    orchestrator: Orchestrator,
    tenant: str,
    tool: str,
    operation: str,
    *,
    on_stdout: Callable[[str], None] | None = None,
    on_stderr: Callable[[str], None] | None = None,
    user_errors_are_data: bool = False,
    **arguments: Any,
) -> dict[str, Any]:
    """``tool``'s ``operation`` with ``arguments`` (None values left out) for ``tenant``; its
    structured result, or ``ToolCallError`` when the call failed. With
    ``user_errors_are_data``, a result about user code failing (python_repl's exceptions) is
    returned as it is."""
    given = {k: v for k, v in arguments.items() if v is not None}
    result = await orchestrator.call(
        tool,
        {"operation": operation, **given},
        tenant=tenant,
        on_stdout=on_stdout,
        on_stderr=on_stderr,
    )
    fields = result.structured
    if fields.get("success", False):
        return fields
    if user_errors_are_data and not result.is_error:
        return fields
    raise ToolCallError(
        str(fields.get("error_type") or "error"),
        str(fields.get("error_message") or "the call failed"),
    )
