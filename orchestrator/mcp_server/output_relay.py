"""Streamed output of one tool call as MCP notifications while the call runs: progress
notifications when the client sent a progress token (each one's message is the next piece of
output, stdout and stderr in the order they came), else log notifications whose data is
``{"stream", "text"}`` (logger ``sandhold.stdout`` or ``sandhold.stderr``). The call's result
holds all of the output either way; notifications are a preview a client may show as it comes.
An image build the call sets off (a template's first use) is told the same way, on the stream
``build`` (logger ``sandhold.build``): that a one-time build starts and about how long it takes,
then each step and what it downloads.

The orchestrator hands output over from its read of the worker's stream, where nothing may
block, so it goes through a bounded queue to a task that sends; when the client reads slower
than the code prints, what does not fit is dropped (the result still has it), never buffered
without bound. Once the call has its answer, what is queued goes out first, within a bound.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

__all__ = ["OutputRelay"]

# Pieces of output waiting for the client; each is one read of the worker's pipes (≤ 64 KiB).
MAX_QUEUED = 256
# Sending what is queued once the call has its answer: a client that takes longer is not
# reading, and the answer should not wait for it.
DRAIN_TIMEOUT = 5.0


class OutputRelay:
    """One call's output, from the orchestrator's listener to the client's notifications."""

    def __init__(self, session: Any, request_id: Any, progress_token: Any) -> None:
        self._session = session
        self._request_id = request_id
        self._token = progress_token
        self._sender: MemoryObjectSendStream[tuple[str, str]]
        self._receiver: MemoryObjectReceiveStream[tuple[str, str]]
        self._sender, self._receiver = anyio.create_memory_object_stream(MAX_QUEUED)
        self._finished = anyio.Event()
        self.dropped = 0

    @classmethod
    @contextlib.asynccontextmanager
    async def running(
        cls, session: Any, request_id: Any, progress_token: Any
    ) -> AsyncIterator[OutputRelay]:
        relay = cls(session, request_id, progress_token)
        async with anyio.create_task_group() as group:
            group.start_soon(relay._pump)
            try:
                yield relay
            finally:
                relay._sender.close()
                with anyio.move_on_after(DRAIN_TIMEOUT, shield=True):
                    await relay._finished.wait()
                group.cancel_scope.cancel()

    def stdout(self, text: str) -> None:
        self._put("stdout", text)

    # A build the call set off (a template's image on first use), as ``images.BuildProgress``:
    # each step and line goes out as output does, on the stream ``build``.

    def step(self, name: str) -> None:
        self._put("build", f"{name}\n")

    def log(self, line: str) -> None:
        self._put("build", f"  {line}\n")

    def done(self, name: str) -> None:
        self._put("build", f"{name}: done\n")

    def stderr(self, text: str) -> None:
        self._put("stderr", text)

    def _put(self, stream: str, text: str) -> None:
        try:
            self._sender.send_nowait((stream, text))
        except (anyio.WouldBlock, anyio.ClosedResourceError):
            self.dropped += 1

    async def _pump(self) -> None:
        sent = 0
        try:
            async for stream, text in self._receiver:
                sent += 1
                if self._token is not None:
                    await self._session.send_progress_notification(
                        self._token, float(sent), message=text, related_request_id=self._request_id
                    )
                else:
                    await self._session.send_log_message(
                        "info",
                        {"stream": stream, "text": text},
                        logger=f"sandhold.{stream}",
                        related_request_id=self._request_id,
                    )
        except Exception:  # the client went away: its answer will not reach it either
            self.dropped += 1
        finally:
            self._receiver.close()
            self._finished.set()
