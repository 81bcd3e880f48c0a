"""One session's calls: a tool, an operation and its arguments (those left None are not sent,
so the tool's defaults hold), the session's id added where the operation takes it, the answer
checked (``_failures.check``). What ``commands``, ``files`` and the sandbox itself share."""

from __future__ import annotations

from typing import Any

from orchestrator.sandbox._failures import check
from orchestrator.sandbox._transport import Listener, Transport

__all__ = ["AsyncPart", "SessionCalls"]


class SessionCalls:
    def __init__(self, transport: Transport, session_id: str) -> None:
        self.transport = transport
        self.session_id = session_id

    async def __call__(
        self,
        tool: str,
        operation: str,
        *,
        session: bool = True,
        on_stdout: Listener | None = None,
        on_stderr: Listener | None = None,
        **arguments: Any,
    ) -> dict[str, Any]:
        sent = {"operation": operation, **{k: v for k, v in arguments.items() if v is not None}}
        if session:
            sent["session_id"] = self.session_id
        structured = await self.transport.call(tool, sent, on_stdout=on_stdout, on_stderr=on_stderr)
        return check(structured)


class AsyncPart:
    """A part of a sandbox (``commands``, ``files``, a command's handle...): its coroutine
    methods are what the blocking twin runs through its portal."""
