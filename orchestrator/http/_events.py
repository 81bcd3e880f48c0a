"""A terminal's output as server-sent events, made of the terminal tool's ``wait`` in a loop.

Events (each ``data`` is the tool's structured result of one ``wait``, as JSON on one line):
- ``output``: new output; its ``id`` is the ``next_offset`` to resume from (a reconnecting
  client's ``Last-Event-ID`` is taken as ``since_offset``);
- ``exit``: the terminal ended and all its output was sent; the stream ends;
- ``error``: a ``wait`` failed (the session ended, say); the stream ends;
- ``reconnect``: this request reached ``STREAM_MAX_SECONDS``; resume from its ``next_offset``.
A comment line is sent when a wait ends without output, so proxies keep the connection open.

The cursor (``since_offset``, else ``Last-Event-ID``, else 0) is taken only as ASCII digits. The
terminal's owner is checked before the cursor decides anything: a caller who may not see the
terminal gets its "not found" whatever cursor it gave, as for any other route.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import anyio

from orchestrator._api import Orchestrator
from orchestrator.errors import InvalidArgumentError
from orchestrator.http._routes import query_integer
from orchestrator.session.terminal.args import MAX_CURSOR, MIN_READ_BYTES
from orchestrator.tools import ToolResult

# Each wait returns at least this often, and a keep-alive comment goes out when it had nothing.
STREAM_WAIT_MS = 10_000
# One request streams at most this long; the client reconnects from the last id it saw.
STREAM_MAX_SECONDS = 600.0


async def first_read(
    orchestrator: Orchestrator,
    tenant: str,
    task: str | None,
    terminal_id: str,
    since: str | None,
) -> ToolResult:
    """The ``read`` a stream starts with, from the cursor ``since`` (as the request gave it)."""
    cursor = query_integer(since) if since else 0
    read = {"operation": "read", "terminal_id": terminal_id}
    if cursor is not None and 0 <= cursor <= MAX_CURSOR:
        return await orchestrator.call(
            "terminal", {**read, "since_offset": cursor}, tenant=tenant, task=task
        )
    # The least read there is, only to learn whether the caller may see this terminal at all.
    probe = {**read, "since_offset": 0, "max_bytes": MIN_READ_BYTES}
    owned = await orchestrator.call("terminal", probe, tenant=tenant, task=task)
    if owned.is_error:
        return owned
    error = InvalidArgumentError(
        f"since_offset (or Last-Event-ID) must be an integer in [0, {MAX_CURSOR}] in ASCII digits"
    )
    return ToolResult({"success": False, **error.to_dict()}, str(error))


def event(name: str, data: dict[str, Any], *, event_id: int | None = None) -> bytes:
    lines = [f"event: {name}"]
    if event_id is not None:
        lines.append(f"id: {event_id}")
    lines.append("data: " + json.dumps(data, ensure_ascii=False, separators=(",", ":")))
    return ("\n".join(lines) + "\n\n").encode("utf-8")


def _emit(result: dict[str, Any]) -> list[bytes]:
    """The events one successful ``read`` or ``wait`` result makes."""
    chunks = []
    if result.get("output") or result.get("gap"):
        chunks.append(event("output", result, event_id=result.get("next_offset")))
    if _ended(result):
        chunks.append(event("exit", result, event_id=result.get("next_offset")))
    return chunks


def _ended(result: dict[str, Any]) -> bool:
    return result.get("state") == "exited" and not result.get("has_more")


async def terminal_events(
    orchestrator: Orchestrator,
    tenant: str,
    task: str | None,
    terminal_id: str,
    first: dict[str, Any],
) -> AsyncIterator[bytes]:
    """The stream after ``first``, the (successful) ``read`` that checked the request. No cancel
    scope spans a ``yield``: the time bound is a deadline that shortens the last wait."""
    for chunk in _emit(first):
        yield chunk
    if _ended(first):
        return
    offset = first["next_offset"]
    deadline = anyio.current_time() + STREAM_MAX_SECONDS
    while (remaining := deadline - anyio.current_time()) > 0:
        arguments = {
            "operation": "wait",
            "terminal_id": terminal_id,
            "since_offset": offset,
            "timeout_ms": min(STREAM_WAIT_MS, int(remaining * 1000)),
        }
        result = (
            await orchestrator.call("terminal", arguments, tenant=tenant, task=task)
        ).structured
        if not result["success"]:
            yield event("error", result)
            return
        chunks = _emit(result)
        for chunk in chunks:
            yield chunk
        if _ended(result):
            return
        if not chunks:
            yield b": keep-alive\n\n"
        offset = result["next_offset"]
    yield event("reconnect", {"terminal_id": terminal_id, "next_offset": offset}, event_id=offset)
