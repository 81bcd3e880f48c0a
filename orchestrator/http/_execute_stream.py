"""``execute`` answered as server-sent events (``Accept: text/event-stream``): the cell's output
as it comes, then its result.

Events: ``build`` while a template's image is built on its first use (a call that makes a
session: ``data`` is ``{"step": ...}``, ``{"log": ...}`` or ``{"done": ...}``, the first step
saying that a one-time build starts and about how long it takes), ``stdout`` and ``stderr``
(``data`` is ``{"text": ...}``), then exactly one ``result`` whose ``data`` is the structured
result the JSON route answers (all of the output included), and the stream ends. A comment
line goes out every ``KEEPALIVE_S`` without output, so proxies keep the connection open. The
status is 200 once the stream starts; whether the call succeeded is the result's ``success``
and ``error_type``, as for every tool.

The orchestrator hands output over from its read of the worker's stream, where nothing may
block: it goes through a bounded queue, and a piece that finds the queue full is dropped (the
result still has it). A client that goes away cancels the call (``CancelOnDisconnect``), which
interrupts the cell as any cancelled call does (its state kept).
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from orchestrator.http._events import event
from orchestrator.tools import ToolResult

__all__ = ["BuildEvents", "ExecuteEvents", "wants_events"]

# Pieces of output waiting to be written; each is one read of the worker's pipes (≤ 64 KiB).
MAX_QUEUED = 256
KEEPALIVE_S = 15.0

Listener = Callable[[str], None]
# The call, given where its stdout, stderr and any image build it sets off report.
RunCall = Callable[[Listener, Listener, "BuildEvents"], Awaitable[ToolResult]]


def wants_events(accept: str | None) -> bool:
    """Whether an Accept header asks for server-sent events (and not for JSON first)."""
    if not accept:
        return False
    kinds = [part.split(";")[0].strip().lower() for part in accept.split(",")]
    if "text/event-stream" not in kinds:
        return False
    json_at = kinds.index("application/json") if "application/json" in kinds else len(kinds)
    return kinds.index("text/event-stream") < json_at


class BuildEvents:
    """An image build's progress (``images.progress.BuildProgress``) as ``build`` events, through
    the same bounded queue as the output (a piece that does not fit is dropped)."""

    def __init__(self, put: Callable[[bytes], None]) -> None:
        self._put = put

    def step(self, name: str) -> None:
        self._put(event("build", {"step": name}))

    def log(self, line: str) -> None:
        self._put(event("build", {"log": line}))

    def done(self, name: str) -> None:
        self._put(event("build", {"done": name}))


class ExecuteEvents(Response):
    """The events of one ``execute`` call, run by ``run(on_stdout, on_stderr)``."""

    def __init__(self, run: RunCall, headers: dict[str, str]) -> None:
        super().__init__(
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **headers},
        )
        self._run = run
        # The body's length is not known: it streams, and the connection says where it ends.
        self.raw_headers = [(k, v) for k, v in self.raw_headers if k != b"content-length"]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        sender, receiver = anyio.create_memory_object_stream[bytes](MAX_QUEUED)

        def put(chunk: bytes) -> None:
            # A piece that does not fit is dropped: the result has it, the stream is a preview.
            with contextlib.suppress(anyio.WouldBlock, anyio.ClosedResourceError):
                sender.send_nowait(chunk)

        def listener(name: str) -> Listener:
            return lambda text: put(event(name, {"text": text}))

        async def call() -> None:
            with sender:
                result = await self._run(listener("stdout"), listener("stderr"), BuildEvents(put))
                await sender.send(event("result", result.structured))

        async with anyio.create_task_group() as group:
            group.start_soon(call)
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            await self._write(receiver, send)
            group.cancel_scope.cancel()

    @staticmethod
    async def _write(receiver: Any, send: Send) -> None:
        async with receiver:
            while True:
                with anyio.move_on_after(KEEPALIVE_S) as idle:
                    try:
                        chunk = await receiver.receive()
                    except anyio.EndOfStream:
                        break
                if idle.cancelled_caught:
                    chunk = b": keep-alive\n\n"
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
