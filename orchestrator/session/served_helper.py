"""A long-lived in-container helper (``worker/fileops.py --serve``) that answers many requests
over one attached exec, so a request costs a round trip on a stream instead of a ``docker exec``.

The framing is the REPL worker's: one JSON line per request, ``{"id", "op", ...}``, and one line
per reply, the reply a one-shot run would print (``helper_exchange``) with that ``id`` added.

Invariants:
- One request at a time per helper (``_lock``). A caller that finds it busy gets None from
  ``call`` and runs its request another way (a one-shot exec), so a long operation never holds
  up the short ones behind it.
- Ids are random per request; a line whose id is not the one awaited is dropped, never taken as
  another request's reply (a late reply, or one forged by code in the sandbox, which runs as the
  same user and can write into the helper's stdout).
- Everything the helper says is untrusted: lines are bounded (``LineBuffer``), decoded strictly
  (``untrusted_json``) and judged like a one-shot reply (``reply_payload``, ``parse_reply``). A
  line too long, unreadable or malformed, a timeout, a cancellation or a broken stream drops the
  helper: its stream is closed (the helper reads EOF and exits) and the next call starts a fresh
  one. A refusal of the helper's own (``invalid_argument``, ``quota_exceeded``) keeps it.
- A reply slower than ``ENGINE_CHECK_AFTER`` has the engine pinged meanwhile: a frozen engine
  stalls the stream with no error of its own, and ends the call ``backend_unavailable``.
- A helper that was already running and ends before it answers (it went idle, or something in
  the sandbox killed it) is replaced and the request sent once more; one freshly started for the
  request that ends without answering is ``process_crashed``. Only idempotent operations may be
  served.
- ``aclose`` closes the stream, shielded; a call after it, or caught by it on the way, is
  ``session_not_found``: no helper is started once the session is closing.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import anyio
from pydantic import BaseModel

from orchestrator.backend.base import STDERR, Backend, ExecSpec, ExecStream
from orchestrator.errors import (
    BackendError,
    BackendUnavailableError,
    ProcessCrashedError,
    SessionNotFoundError,
)
from orchestrator.session.helper_exchange import (
    SEND_CHUNK_BYTES,
    STDERR_TAIL_BYTES,
    Helper,
    parse_reply,
    reply_payload,
    stderr_hint,
)
from orchestrator.session.repl.protocol import LineBuffer, ProtocolViolation, untrusted_json

__all__ = ["ServedHelper"]

M = TypeVar("M", bound=BaseModel)

# 64 random bits: an id nobody in the sandbox can guess before the request is on its way.
ID_BYTES = 8
# A reply slower than this has the engine asked whether it still answers: the helper's stream
# runs through the engine, and a frozen engine stalls it with no error of its own.
ENGINE_CHECK_AFTER = 2.0


class _Ended(Exception):
    """The helper's stream ended (or would take no more input) before its reply came."""


class _Stream:
    """One running helper: its exec stream, the lines read from it, a tail of its stderr."""

    def __init__(self, stream: ExecStream, max_line: int) -> None:
        self.stream = stream
        self.lines = LineBuffer(max_line)
        self.pending: list[bytes] = []
        self.stderr = b""


class ServedHelper:
    """One helper program, served: started on the first ``call``, replaced when it is lost.
    ``max_request_bytes`` is the longest request line the helper reads (its ``argv`` says so),
    ``max_reply_bytes`` the longest reply line taken from it."""

    def __init__(
        self,
        backend: Backend,
        container_id: str,
        helper: Helper,
        *,
        max_request_bytes: int,
        max_reply_bytes: int,
    ) -> None:
        self._backend = backend
        self._container_id = container_id
        self._helper = helper
        self._max_request = max_request_bytes
        self._max_reply = max_reply_bytes
        self._lock = anyio.Lock()
        self._current: _Stream | None = None
        self._closed = False

    @property
    def running(self) -> bool:
        """Whether a helper stream is open (one may have ended without our noticing yet)."""
        return self._current is not None

    async def call(
        self,
        argv: Sequence[str],
        op: str,
        request: Mapping[str, Any],
        model: type[M],
        *,
        timeout: float,
    ) -> M | None:
        """``request`` answered by the helper (``argv`` starts one when none runs), its reply
        as ``model``, or the error its refusal stands for. None when the helper is busy with
        another call or the request is longer than it reads: the caller runs the request
        another way. ``session_not_found`` once closed."""
        if self._closed:
            raise SessionNotFoundError(f"this session's {self._helper.name} is closed")
        request_id = secrets.token_hex(ID_BYTES)
        line = json.dumps({"id": request_id, "op": op, **request}).encode() + b"\n"
        if len(line) > self._max_request:
            return None
        try:
            self._lock.acquire_nowait()
        except anyio.WouldBlock:
            return None
        try:
            reply = await self._exchange(argv, op, line, request_id, timeout)
            try:
                data = reply_payload(self._helper, op, reply)
                return parse_reply(self._helper, op, model, data)
            except BackendError:
                await self._drop()  # it lied or failed in a way of no refusal of its own
                raise
        finally:
            self._lock.release()

    async def aclose(self) -> None:
        """Close the helper's stream (it exits at the EOF); idempotent, shielded."""
        self._closed = True
        await self._drop()

    async def _exchange(
        self, argv: Sequence[str], op: str, line: bytes, request_id: str, timeout: float
    ) -> dict[str, Any]:
        """The reply line to ``line`` as a dict, its id removed."""
        reply: dict[str, Any] | None = None
        try:
            with anyio.move_on_after(timeout):
                reply = await self._watched(argv, op, line, request_id)
        except BaseException:
            # A cancel, a bad line or a broken stream: the helper may be mid-request or out of
            # step, and a fresh one costs less than finding out.
            await self._drop()
            raise
        if reply is None:
            await self._drop()
            raise BackendError(f"the {self._helper.name} did not answer {op} within {timeout:g} s")
        return reply

    async def _watched(
        self, argv: Sequence[str], op: str, line: bytes, request_id: str
    ) -> dict[str, Any] | None:
        """``_attempts``, unless the engine stops answering meanwhile: then its
        ``BackendUnavailableError`` (the engine call's own timeout bounds the wait)."""
        unavailable: list[BackendUnavailableError] = []
        reply: dict[str, Any] | None = None
        failure: Exception | None = None
        async with anyio.create_task_group() as tg:

            async def watch() -> None:
                try:
                    while True:
                        await anyio.sleep(ENGINE_CHECK_AFTER)
                        await self._backend.ping()
                except BackendUnavailableError as exc:
                    unavailable.append(exc)
                    tg.cancel_scope.cancel()

            tg.start_soon(watch)
            try:
                reply = await self._attempts(argv, op, line, request_id)
            except Exception as exc:  # raised below: out of the task group, which would wrap it
                failure = exc
            tg.cancel_scope.cancel()
        if unavailable:
            raise unavailable[0]
        if failure is not None:
            raise failure
        return reply

    async def _attempts(
        self, argv: Sequence[str], op: str, line: bytes, request_id: str
    ) -> dict[str, Any]:
        while True:
            if self._closed:
                raise SessionNotFoundError(f"this session's {self._helper.name} is closed")
            fresh = self._current is None
            current = self._current or await self._start(argv)
            try:
                await _send(current, line)
                return await _receive(current, request_id)
            except _Ended:
                if fresh:
                    await _read_to_end(current)  # what it said on stderr tells why
                await self._drop()
                if fresh:
                    # Killed (by code in the sandbox, or the OOM killer) or crashed mid-request:
                    # the process serving the call died, and the next call starts a fresh one.
                    hint = stderr_hint(current.stderr)
                    raise ProcessCrashedError(
                        f"the {self._helper.name} ended before it answered {op}"
                        + (f" ({hint})" if hint else ""),
                        cause=f"the {self._helper.name} ended",
                    ) from None
                # A helper that was waiting ended without answering: it went idle, or was
                # killed. Served operations are idempotent, so a fresh one takes the request.
            except ProtocolViolation as exc:
                raise BackendError(f"the {self._helper.name}'s {op} reply: {exc}") from None

    async def _start(self, argv: Sequence[str]) -> _Stream:
        stream = await self._backend.open_exec(self._container_id, ExecSpec(argv=list(argv)))
        if self._closed:  # closed while the engine started it: it must not outlive the close
            with anyio.CancelScope(shield=True):
                await stream.aclose()
            raise SessionNotFoundError(f"this session's {self._helper.name} is closed")
        self._current = _Stream(stream, self._max_reply)
        return self._current

    async def _drop(self) -> None:
        current, self._current = self._current, None
        if current is not None:
            with anyio.CancelScope(shield=True):
                await current.stream.aclose()


async def _receive(current: _Stream, request_id: str) -> dict[str, Any]:
    while True:
        while not current.pending:
            chunk = await current.stream.receive()
            if chunk is None:
                raise _Ended
            if chunk[0] == STDERR:
                current.stderr = (current.stderr + chunk[1])[-STDERR_TAIL_BYTES:]
            else:
                current.pending.extend(current.lines.feed(chunk[1]))
        try:
            reply = untrusted_json(current.pending.pop(0))
        except ValueError:
            raise ProtocolViolation("a line is not JSON") from None
        if not isinstance(reply, dict):
            raise ProtocolViolation("a line is not a JSON object")
        if reply.pop("id", None) == request_id:
            return reply
        # Not ours: a late reply or a forged one; either way it answers nothing we wait for.


async def _read_to_end(current: _Stream) -> None:
    """Keep the stderr tail of a helper that ended, up to the end of its output."""
    while (chunk := await current.stream.receive()) is not None:
        if chunk[0] == STDERR:
            current.stderr = (current.stderr + chunk[1])[-STDERR_TAIL_BYTES:]


async def _send(current: _Stream, line: bytes) -> None:
    try:
        for start in range(0, len(line), SEND_CHUNK_BYTES):
            await current.stream.send(line[start : start + SEND_CHUNK_BYTES])
    except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
        raise _Ended from exc
